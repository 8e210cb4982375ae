"""The thin entry modules of the documented `python -m batchspec.NAME` spellings (status, run_batch, calibrate,
bench_io, train_draft), each the same command as `batchspec VERB` (batchspec/__main__.py). They sit in one
folder rather than five files beside the package's folders; batchspec/__init__.py puts this folder on the
package's path, so that `batchspec.status` is entry/status.py. Their imports are absolute for that reason."""
