"""The job runner behind `python -m batchspec job=NAME`: config -> source -> engine -> Parquet sink.

cli.py is the entry point and the only reader of the Hydra config (schema in config.py; cmdline.py checks
the command line before Hydra sees it; checks.py turns the composed config into a checked JobConfig).
shard.py runs one shard: sources.py streams rows, prompts.py (or openai/batch.py) turns them into requests
with rowparams.py's per-row settings, build.py makes the models and generator, job.py drives the engine
with progress and signals, grouping.py keeps a request's samples together, sink.py writes parts
atomically, summary.py finishes; fingerprint.py and locks.py guard resume and one writer per shard;
retry.py reruns failed rows."""
