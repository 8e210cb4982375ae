"""`python -m batchspec.status`, the same as `batchspec status` (the command is batchspec/jobs/status.py)."""

import sys

from batchspec.jobs.status import main

if __name__ == "__main__":
    sys.exit(main())
