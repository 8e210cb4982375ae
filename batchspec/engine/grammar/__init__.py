"""Structured output: each row's grammar (grammar.py, with llguidance; grammar_text.py, schema_finite.py) masks
the target's tokens, and constrain.py keeps a round's drafts within what the grammar allows."""
