"""Measurement commands: the benchmark against its peers (main.py, `batchspec bench`), the tuning
checklist (calibrate.py, `batchspec calibrate`) and the Parquet IO share (parquet_io.py,
`batchspec bench-io`). Nothing here is imported by a job."""
