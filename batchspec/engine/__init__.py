"""The decoding engine: slots of requests, each round schedule -> draft -> verify -> accept -> commit.

Its folders are its parts: model/ (the target's forwards and KV cache on this machine), drafters/ (what proposes
drafts), control/ (adaptive speculation: how many drafts each row gets) and grammar/ (structured output); the
modules here are the round itself. generator.py's step() runs one round as stages, each building the round's
next record (round.py): the Scheduler schedules (scheduler.py), the draft stage (drafting.py) asks a Drafter
(drafters/) for proposals in the shape the Scheduler's controller (control/adaptive.py) chooses, the verify pass
(verify_pass.py: packed, padded or captured, chosen once) runs a ModelRunner's forward (model/runner.py, over
the slot KV cache in model/kv_cache.py), the Acceptor (accept.py) decides with the pure functions of sampling.py and verdict.py (tree.py for tree drafts), and
postprocess.py turns the verdict into outputs and stops (the commit). The one stage that calls the Scheduler
rather than only read its round is the draft stage (`choose`: the round's shape and each row's drafts, made once
the drafts or the limits are on the table); the verify pass reads the prompt chunks and the cache copies the plan
booked, and admission's device side returns a value (`Seated`) that the generator hands to the Scheduler
(`seated`). A slot's seat on the host, its prefill, each advance and its release go through one place
(slot_life.py), which tells every part that keeps state per slot; the seat's device side is the prefill
(admission.py)."""
