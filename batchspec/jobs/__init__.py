"""The job runner behind `python -m batchspec job=NAME`: config -> source -> engine -> Parquet sink.

cli.py is the only reader of the Hydra config (schema in config.py); sources.py streams requests,
job.py drives the engine with progress and signals, sink.py writes parts atomically."""
