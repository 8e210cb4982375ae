"""Every model type AutoModelForCausalLM maps (issue 59): built tiny (tests/model_zoo.py: 2 layers of width 64,
sliding window 8, seeded, fp32), it runs exactly or is refused at load in one line naming the type and the
feature; never a mismatch, never a traceback from inside the engine. Greedy output at batch 3 for drafters
none, ngram and model (the target drafting for itself, so drafts are accepted), on prompts longer than the
window, the static path too for windowed types, against `generate` on each prompt alone. A type this
shrinking cannot build, or that transformers' own `generate` cannot run, is skipped with the reason.

The outcome must also be the one docs/how_it_works.md's table gives (tools/model_types.py writes it)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from model_zoo import EXACT, MISMATCH, NO_REFERENCE, NOT_BUILT, REFUSED, TRACEBACK, check_type, model_types

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from model_types import documented  # noqa: E402

DOCUMENTED = documented()


def test_the_table_lists_every_type():
    assert sorted(DOCUMENTED) == model_types(), "run python tools/model_types.py"


@pytest.mark.parametrize("model_type", model_types())
def test_exact_or_refused_in_one_line(model_type, tokenizer, tmp_path):
    outcome = check_type(model_type, tokenizer, tmp_path)
    assert outcome.status not in (MISMATCH, TRACEBACK), outcome.detail
    if outcome.status == REFUSED:
        # The loaded model's type: a composite's text part for some (qwen3_5 loads as qwen3_5_text)
        assert re.search(r"model type '[\w-]+' is not supported: ", outcome.detail) and "\n" not in outcome.detail
    assert DOCUMENTED.get(model_type) == outcome.status, (
        f"docs/how_it_works.md says {DOCUMENTED.get(model_type)!r}, the run gives {outcome.status!r} "
        f"({outcome.detail}): run python tools/model_types.py")
    if outcome.status in (NOT_BUILT, NO_REFERENCE):
        pytest.skip(f"{outcome.status}: {outcome.detail}")
    assert outcome.status in (EXACT, REFUSED)
