"""The decoding engine: slots of requests, each round schedule -> draft -> verify -> accept -> commit.

generator.py's step() runs one round as stages, each building the round's next record (round.py): the
Scheduler schedules (scheduler.py), the draft stage (drafting.py) asks a Drafter (drafters/) for proposals in the
shape the Scheduler's controller (adaptive.py) chooses, the Verifier (verify_pass.py) runs a ModelRunner's
forward (runner.py, over the slot KV cache in kv_cache.py), the Acceptor (accept.py) decides with the pure
functions of sampling.py and verdict.py (tree.py for tree drafts), and postprocess.py turns the verdict into
outputs and stops (the commit). Stages that call the Scheduler rather than only read its round: the draft stage
(`skip_hopeless`, `choose`: the round's shape), the Verifier (`samples_of`: which samples of a request share a
prompt; `filled`: the prompt chunks the round cached), and the Admitter (`fill_in_rounds`, and the first tokens
and prompt logprobs of the rows it seated, through the Scheduler's outcomes). A slot's seat on the host and its
release are in one place (slot_life.py), which tells every part that keeps state per slot; the seat's device
side is the prefill (admission.py)."""
