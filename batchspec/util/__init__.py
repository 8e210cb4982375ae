"""Small helpers every layer uses: atomic writes (files.py), local paths and hub ids (paths.py), and
one-line checks of user text (textcheck.py). They import nothing of batchspec."""
