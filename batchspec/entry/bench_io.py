"""`python -m batchspec.bench_io`, the same as `batchspec bench-io` (the command is batchspec/bench/parquet_io.py)."""

import sys

from batchspec.bench.parquet_io import main

if __name__ == "__main__":
    sys.exit(main())
