"""`python -m batchspec job=NAME [key=value ...]` (see batchspec.cli)."""

import os

# Idle OpenMP threads should sleep, not spin: on a shared CPU machine spinning made runs up to 100x
# slower. libgomp reads this when torch is first imported, so it only takes effect here if the
# package's __init__ has not imported torch yet; otherwise set it in the environment.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

try:
    from .jobs.cli import main  # noqa: E402
except KeyboardInterrupt:  # Ctrl-C while the command is still importing: nothing has started
    raise SystemExit(130)

if __name__ == "__main__":
    main()
