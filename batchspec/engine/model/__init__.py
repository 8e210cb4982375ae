"""The target model on this machine: the ModelRunner (runner.py) and its forwards (packed rows, packed.py; captured
steps, static_steps.py, graphs.py), the slot KV cache (kv_cache.py), prefill, the model types it loads and checks
(models.py, model_check.py), and what the machine's costs are made of (few_rows.py, threads.py, timing.py,
memory.py). It imports nothing of the round: the engine above hands it tokens and lengths."""
