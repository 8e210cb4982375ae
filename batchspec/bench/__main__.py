"""`python -m batchspec.bench` (the benchmark: main.py)."""

from .main import main

main()
