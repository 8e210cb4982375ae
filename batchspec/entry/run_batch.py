"""`python -m batchspec.run_batch`, the same as `batchspec run-batch` (the command is batchspec/jobs/openai/run_batch.py)."""

import sys

from batchspec.jobs.openai.run_batch import main

if __name__ == "__main__":
    sys.exit(main())
