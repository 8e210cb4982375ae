"""Training EAGLE-3 heads: `batchspec train-draft` (train_draft.py, train.py) on a target's own
continuations of a source's prompts, and self-training jobs (`model.draft=train`: selftrain.py, phases.py,
job_head.py). The head itself and its file formats are batchspec/eagle/."""
