"""Earlier outputs as a suffix drafter's warm start (`drafter.corpus=PATH`): load.py bounds and tokenizes,
read.py reads a source's rows newest first."""

from .load import CorpusError, load_corpus

__all__ = ["CorpusError", "load_corpus"]
