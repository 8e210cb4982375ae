"""The decoding engine: slots of requests, each round draft -> verify -> accept -> rollback.

generator.py's step() runs one round as stages, each building the round's next record (round.py): the
Scheduler schedules (scheduler.py), the draft stage (drafting.py) asks a Drafter (drafters/) for proposals in the
shape adaptive.py chooses, the Verifier (verify_pass.py) runs a ModelRunner's forward (runner.py, over the slot KV
cache in kv_cache.py), the Acceptor (accept.py) decides with the pure functions of sampling.py and verdict.py
(tree.py for tree drafts), and postprocess.py turns the verdict into outputs and stops. Two calls still run back
into the Scheduler: the Verifier asks it which samples of a request share a prompt (their prefix copies), and the
Admitter hands it the rows it seated."""
