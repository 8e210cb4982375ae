"""The replayed workload: each prompt's greedy completion by the public API, cached under outputs/suffix_sim/."""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "outputs" / "suffix_sim"


@dataclass(slots=True)
class Row:
    id: str
    prompt_ids: list[int]
    completion: list[int]


def load_rows(prompts_path: Path, target: Path, limit: int | None, max_new_tokens: int, batch_size: int) -> list[Row]:
    """Prompts -> greedy completions by the public API, cached by (prompts, target, settings)."""
    import pyarrow.parquet as pq

    table = pq.read_table(prompts_path, columns=["id", "prompt"]).to_pylist()[:limit]
    ids, prompts = [r["id"] for r in table], [r["prompt"] for r in table]
    weights = (target / "model.safetensors").stat().st_size
    key = hashlib.sha256(json.dumps([prompts, str(target), weights, max_new_tokens]).encode()).hexdigest()[:16]
    cache = CACHE / f"{prompts_path.stem}-{key}.json"
    if cache.exists():
        data = json.loads(cache.read_text())
    else:
        import batchspec
        from transformers import AutoTokenizer

        print(f"generating {len(prompts)} greedy completions of {prompts_path.name} (cached in {cache}) ...",
              file=sys.stderr)
        results = batchspec.generate(prompts, ids=ids, target=str(target), drafter="none",
                                     max_new_tokens=max_new_tokens, batch_size=batch_size)
        tokenizer = AutoTokenizer.from_pretrained(str(target))
        data = []
        for prompt, result in zip(prompts, results):
            prompt_ids = tokenizer(prompt)["input_ids"]
            assert len(prompt_ids) == result.prompt_tokens, "the engine tokenizes prompts as tokenizer(prompt)"
            data.append({"id": result.id, "prompt_ids": prompt_ids, "completion": result.completion_token_ids})
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(data))
    return [Row(d["id"], d["prompt_ids"], d["completion"]) for d in data]
