"""Shared pieces of the job-runner tests: a tiny word-level tokenizer with a chat template, tiny random
Llama target/draft models saved to a session temp dir, and helpers to write job files and run the CLI.

Import explicitly: `from conftest_jobs import tiny_models, run_cli, write_job, read_output`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pyarrow.dataset as pads
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SPECIALS = ["<s>", "</s>", "<pad>", "<unk>", "<|user|>", "<|assistant|>", "<|system|>"]
WORDS = (
    "the a quick brown fox jumps over lazy dog cat sleeps runs and or not def return print if else for in "
    "range import class self x y z one two three four five six seven eight nine ten hello world batch "
    "speculative decoding token model draft target question answer is what why how . , : ( ) = + -"
).split()
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer(words: list[str] = WORDS):
    """A WordLevel tokenizer over SPECIALS + words (unknown words -> <unk>), BOS prepended, with a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + [w for w in words if w not in SPECIALS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", additional_special_tokens=SPECIALS[4:])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tiny_model(path: Path, tokenizer, *, seed: int, layers: int = 2, hidden: int = 32) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.05,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=2,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@dataclass
class TinyModels:
    target: Path
    draft: Path  # same tokenizer, another random init, 1 layer
    incompatible_draft: Path  # a tokenizer whose vocabulary is in another order
    not_a_model: Path  # an empty directory


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> TinyModels:
    root = tmp_path_factory.mktemp("tiny-models")
    tokenizer = build_tokenizer()
    target = save_tiny_model(root / "target", tokenizer, seed=0)
    draft = save_tiny_model(root / "draft", tokenizer, seed=1, layers=1)
    other = save_tiny_model(root / "other", build_tokenizer(list(reversed(WORDS))), seed=2, layers=1)
    (root / "empty").mkdir()
    return TinyModels(target, draft, other, root / "empty")


def write_job(workdir: Path, name: str, config: dict) -> Path:
    """Write workdir/jobs/NAME.yaml (found by `python -m batchspec job=NAME` run in workdir)."""
    path = workdir / "jobs" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# @package _global_\n" + yaml.safe_dump(config, sort_keys=False))
    return path


def run_cli(workdir: Path, *args: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m batchspec ARGS` in workdir, as a user would run it; returns the finished process."""
    return subprocess.run([sys.executable, "-m", "batchspec", *args], cwd=workdir, env=cli_env(env),
                          capture_output=True, text=True, timeout=timeout)


def cli_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONPATH=str(REPO), OMP_NUM_THREADS="1",
               OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false")
    env.update(extra or {})
    return env


def read_output(out_dir: Path) -> list[dict]:
    """Every output row of a job (all part files), sorted by id, without the timing column."""
    rows = pads.dataset(out_dir / "data", format="parquet").to_table().to_pylist()
    for r in rows:
        r.pop("latency_s")
    return sorted(rows, key=lambda r: r["id"])


def run_inprocess(workdir: Path, *args: str, monkeypatch) -> int:
    """`python -m batchspec ARGS` inside this process (cwd = workdir); returns the exit status.
    Output goes to the test's captured stdout / stderr."""
    from batchspec.__main__ import main

    monkeypatch.chdir(workdir)
    monkeypatch.setattr(sys, "argv", ["batchspec", *args])
    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)
    try:
        main()
    except SystemExit as e:
        return 0 if e.code is None else int(e.code) if isinstance(e.code, int) else 1
    return 0


def tiny_job(models: TinyModels, source: dict, **extra) -> dict:
    """A job on the tiny models: greedy, 12 new tokens, batch 3, 5 rows per part, fixed drafts per round."""
    job = {
        "model": {"target": str(models.target), "draft": str(models.draft), "dtype": "float32", "device": "cpu"},
        "sampling": {"max_new_tokens": 12},
        "drafter": {"adaptive": False},
        "source": source,
        "batch_size": 3,
        "output": {"rows_per_file": 5},
        "progress": {"mode": "log"},
    }
    for key, value in extra.items():
        if isinstance(value, dict):
            job.setdefault(key, {}).update(value)
        else:
            job[key] = value
    return job


@pytest.fixture(autouse=False)
def one_thread():
    """Tiny models run fastest on one thread, and a busy shared machine cannot stall a thread team."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def one_line_error(capsys) -> str:
    """The one `batchspec: error: ...` line a failed run printed on stderr, without its prefix."""
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("batchspec: error: ")]
    assert len(err) == 1, err
    return err[0].removeprefix("batchspec: error: ")
