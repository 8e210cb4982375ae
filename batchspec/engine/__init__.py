"""The decoding engine: slots of requests, each round draft -> verify -> accept -> rollback.

Data flows one way: generator.py drives a ModelRunner per model (runner.py, over the slot KV cache in
kv_cache.py), asks a Drafter (drafters/) for proposals, decides with the pure functions of
sampling.py (tree.py for tree drafts), and lets adaptive.py choose each round's shape."""
