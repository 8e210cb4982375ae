"""`python -m batchspec job=NAME [key=value ...]` (see batchspec.cli)."""

try:
    from .jobs.cli import main
except KeyboardInterrupt:  # Ctrl-C while the command is still importing: nothing has started
    raise SystemExit(130)

if __name__ == "__main__":
    main()
