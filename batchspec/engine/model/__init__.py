"""The target model on this machine: the ModelRunner (runner.py) and its forwards (packed rows, packed.py; captured
steps, static_steps.py, graphs.py), the slot KV cache (kv_cache.py), prefill, the model types it loads and checks
(models.py, model_check.py), and what the machine's costs are made of (few_rows.py, threads.py, timing.py,
memory.py). It takes nothing from the engine above it but tree drafts' geometry (tree.py): it is handed tokens, lengths
and masks (tests/test_layout.py)."""
