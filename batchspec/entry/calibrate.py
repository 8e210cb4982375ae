"""`python -m batchspec.calibrate`, the same as `batchspec calibrate` (the command is batchspec/bench/calibrate.py)."""

import sys

from batchspec.bench.calibrate import main

if __name__ == "__main__":
    sys.exit(main())
