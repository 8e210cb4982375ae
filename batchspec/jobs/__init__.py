"""The job runner behind `python -m batchspec job=NAME`: config -> source -> engine -> Parquet sink.

cli.py is the only reader of the Hydra config (schema in config.py; cmdline.py checks the command line
before Hydra sees it); sources.py streams rows and prompts.py turns them into requests; job.py drives
the engine with progress and signals; sink.py writes parts atomically; locks.py keeps one writer per
shard."""
