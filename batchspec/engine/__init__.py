"""The decoding engine: slots of requests, each round draft -> verify -> accept -> rollback.

Data flows one way: generator.py drives a ModelRunner per model (runner.py, over the slot KV cache in
kv_cache.py), asks a Drafter (drafters.py) for proposals, decides with the pure functions of
sampling.py, and lets adaptive.py choose each round's number of drafts."""
