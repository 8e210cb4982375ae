"""`python -m batchspec.train_draft`, the same as `batchspec train-draft` (the command is batchspec/training/train_draft.py)."""

import sys

from batchspec.training.train_draft import main

if __name__ == "__main__":
    sys.exit(main())
