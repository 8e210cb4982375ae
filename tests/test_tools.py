"""The benchmark and calibrate commands on a tiny pair: they run, and their arithmetic is right."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchspec.bench import main as bench, calibrate
from tiny import PROMPTS


@pytest.mark.parametrize("alpha,k,expected", [(0.0, 4, 1.0), (1.0, 4, 5.0), (0.5, 1, 1.5), (0.8, 3, 2.952)])
def test_expected_tokens(alpha, k, expected):
    assert calibrate.expected_tokens(alpha, k) == pytest.approx(expected)


def test_predicted_speedup_counts_verify_and_draft_cost():
    # alpha 0.8, k 2: 2.44 tokens per round; the round costs t(3) + 2 * t_draft = 15 + 2 * 1 = 17 ms vs 10 ms per token
    assert calibrate.predicted_speedup(0.8, 2, [10.0, 12.0, 15.0], 1.0) == pytest.approx(2.44 * 10 / 17)
    assert calibrate.predicted_speedup(0.3, 0, [10.0], 5.0) == pytest.approx(1.0)


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "prompts.parquet"
    pq.write_table(pa.table({"prompt": PROMPTS[:6]}), path)
    return str(path)


@pytest.mark.slow
def test_bench_runs_every_contender_and_checks_outputs(llama_pair, prompt_file, tmp_path, capsys):
    out = tmp_path / "bench.json"
    bench.main(["--target", str(llama_pair.target), "--draft", str(llama_pair.draft), "--prompts", prompt_file,
                "--num-prompts", "6", "--max-new-tokens", "12", "--batch-size", "1,3", "--k", "1,2", "--repeats", "1", "--compile", "auto,static", "--tree", "2x2",
                "--json", str(out), "--markdown", str(tmp_path / "bench.md")])
    reports = json.loads(out.read_text())
    assert [r["batch_size"] for r in reports] == [1, 3]
    report = reports[-1]
    names = [row["contender"] for row in report["rows"]]
    assert names[0] == "hf generate (batched)" and "hf assisted (batch 1)" in names and "hf prompt lookup (batch 1)" in names
    assert names[1] == "hf generate (static cache)"
    assert {"batchspec model k=1 [auto]", "batchspec model k=2 [static]", "batchspec ngram adaptive k<=2 + trees 2x2 [auto]",
            "batchspec prompt_lookup k=2 [static]"} <= set(names)
    assert all(row["warmup_s"] > 0 for row in report["rows"])  # every contender ran once untimed first
    assert "batchspec model tree 2x2 [static]" in names and "batchspec ngram adaptive k<=2 + trees 2x2 [auto]" in names
    assert set(report["cost_ms"]) >= {"target_ms_1", "target_ms_2", "target_ms_3", "draft_ms_1"}
    assert report["greedy_identical"], report["rows"]
    out = capsys.readouterr().out
    assert "all identical to drafter none" in out
    assert "adaptive vs the best fixed k: model [static]" in out and "warm-up:" in out
    table = (tmp_path / "bench.md").read_text()  # with several batch sizes: one row per batch size
    assert table.startswith("| batch | HF batched tok/s | HF static tok/s | none [auto] tok/s |") and "\n| 3 | " in table


def test_bench_without_hf_batched_leaves_its_columns_empty(llama_pair, prompt_file, tmp_path):
    """--no-hf-batched (on a GPU at batch 1, eager HF generate is the slowest contender by far)."""
    out, table = tmp_path / "bench.json", tmp_path / "bench.md"
    bench.main(["--target", str(llama_pair.target), "--draft", "", "--prompts", prompt_file, "--num-prompts", "2",
                "--max-new-tokens", "4", "--batch-size", "2", "--k", "2", "--repeats", "1", "--drafters", "ngram",
                "--no-hf-batched", "--no-hf-static", "--no-hf-batch1", "--no-adaptive", "--json", str(out),
                "--markdown", str(table)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["contender"] for r in rows] == ["batchspec none", "batchspec ngram k=2"]
    assert all(r["vs_hf_batched"] is None and r["vs_none"] > 0 for r in rows)
    assert "| batchspec none | " in table.read_text() and " | - | - | 1.00 | " in table.read_text()


def test_bench_reports_how_full_each_contenders_batch_ran(llama_pair, prompt_file, tmp_path, capsys):
    """3 prompts of 4 new tokens in 2 slots, drafter none: the first two rows decide together in 4 rounds, the
    third alone in 4 more: 12 of 16 slots held a deciding row (ngram's rows finish when their drafts let them, so
    its share is whatever its rounds were)."""
    out = tmp_path / "bench.json"
    bench.main(["--target", str(llama_pair.target), "--draft", "", "--prompts", prompt_file, "--num-prompts", "3",
                "--max-new-tokens", "4", "--batch-size", "2", "--k", "2", "--repeats", "2", "--drafters", "ngram",
                "--no-hf-batched", "--no-hf-static", "--no-hf-batch1", "--no-adaptive", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert rows[0]["contender"] == "batchspec none" and rows[0]["slots_filled"] == 12 / 16
    assert 0 < rows[1]["slots_filled"] <= 1
    assert "padding 0.0%, slots filled 75.0%" in capsys.readouterr().out


@pytest.mark.slow
def test_bench_checks_coupled_outputs_against_a_coupled_none(llama_pair, prompt_file, tmp_path, capsys):
    """Sampled, rejection listed first: the coupled rows must equal the coupled none (plain decoding's draws),
    not the rejection none, whose tokens differ by design."""
    out = tmp_path / "bench.json"
    bench.main(["--target", str(llama_pair.target), "--draft", str(llama_pair.draft), "--prompts", prompt_file,
                "--num-prompts", "4", "--max-new-tokens", "10", "--batch-size", "2", "--k", "2", "--repeats", "1",
                "--temperature", "0.9", "--verify", "rejection,coupled", "--drafters", "model", "--tree", "2x2",
                "--no-hf-batch1", "--no-hf-static", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]  # one batch size: one report
    coupled = [r for r in rows if r["verify"] == "coupled"]
    assert len(coupled) == 4 and all(r["outputs_equal_to_none"] == 4 for r in coupled), coupled
    assert "coupled sampled outputs (seed 0): all identical to drafter none" in capsys.readouterr().out


def test_bench_interleaved_runs_the_batchspec_contenders_round_by_round(llama_pair, prompt_file, tmp_path, capsys):
    """--interleave: the batchspec contenders' jobs advance one round at a time in one stretch of time (a job
    with a round that did not pause raises), each runs --repeats jobs and its outputs equal drafter none's; HF
    generate still runs its repeats one after another. --noise-check: drafter none again."""
    out = tmp_path / "bench.json"
    bench.main(["--target", str(llama_pair.target), "--draft", "", "--prompts", prompt_file, "--num-prompts", "4",
                "--max-new-tokens", "8", "--batch-size", "2", "--k", "2", "--repeats", "2", "--drafters", "ngram",
                "--no-hf-static", "--no-hf-batch1", "--fresh", "--interleave", "--noise-check", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["contender"] for r in rows] == ["hf generate (batched)", "batchspec none", "batchspec none (again)",
                                              "batchspec ngram k=2", "batchspec ngram adaptive k<=2"]
    assert len(rows[0]["repeats_tokens_per_s"]) == 2
    for row in rows[1:]:
        assert len(row["repeats_tokens_per_s"]) == 2 and row["outputs_equal_to_none"] == 4, row
    assert rows[1]["vs_none"] == 1.0 and rows[2]["vs_none"] > 0  # the first none is the reference
    printed = capsys.readouterr().out
    assert printed.count("  interleaved: batchspec ") == 4
    assert "  interleaved: torch's " in printed and " of the run for a CPU" in printed  # (Linux's /proc has it)


def test_interleaved_lanes_run_without_the_thread_guard(llama_pair):
    """One process, one thread count: a lane's guard would lower it for every lane, so interleaved lanes have none
    (a sequential run keeps it)."""
    from types import SimpleNamespace

    from batchspec.bench.contenders import Contender, batchspec_job
    from batchspec.engine.model.models import load_models

    models = load_models(str(llama_pair.target), None)
    settings = dict(batch_size=2, max_new_tokens=4, max_seq_len=None, temperature=0.0, top_p=1.0, top_k=0, seed=0,
                    corpus_tokens=None, profile=False, fresh=True)
    for interleaved, guarded in [(True, False), (False, True)]:
        args = SimpleNamespace(**settings, interleave=interleaved)
        generator = batchspec_job(Contender("batchspec none", "batchspec"), models, args)
        assert (generator.threads is not None) == guarded


@pytest.mark.parametrize("waited,seconds,threads,share", [
    ((1.0, 1.5), 10.0, 2, 0.025),  # 0.5 s of waiting over 10 s of 2 threads
    ((0.0, 6.0), 10.0, 2, 0.3),
    ((2.0, 2.0), 5.0, 1, 0.0),
])
def test_waited_share_is_the_threads_share_of_the_run(waited, seconds, threads, share):
    from batchspec.engine.model.threads import CpuSample, waited_share

    before, after = CpuSample(waited[0], 0.0), CpuSample(waited[1], 0.0)
    assert waited_share(before, after, seconds, threads) == pytest.approx(share)
    assert waited_share(None, after, seconds, threads) is None


@pytest.mark.parametrize("mine,theirs,ratio", [
    ([10.0, 20.0, 30.0], [10.0, 20.0, 30.0], 1.0),  # the machine slowed and sped up: side by side, no change
    ([9.0, 18.0, 33.0], [10.0, 20.0, 30.0], 0.9),  # ratios 0.9, 0.9, 1.1: their median (medians' ratio: 0.9 too)
    ([12.0, 10.0, 30.0], [10.0, 20.0, 30.0], 1.0),  # ratios 1.2, 0.5, 1.0 (medians' ratio: 0.6)
    ([12.0, 10.0], [10.0, 20.0, 30.0], 0.55),  # ran a different number of times: the medians' ratio
])
def test_side_by_side_is_the_median_of_paired_ratios(mine, theirs, ratio):
    from batchspec.bench.report import side_by_side

    assert side_by_side(mine, theirs) == pytest.approx(ratio)


def test_a_pausing_step_yields_the_pause_then_the_rounds_results():
    from batchspec.bench.interleave import PAUSE, pausing

    calls = []
    step = pausing(lambda: calls.append(1) or ["a", "b"])
    assert calls == [] and list(step()) == [PAUSE, "a", "b"] and calls == [1]


@pytest.mark.parametrize("kind", ["parquet_folder", "jsonl", "saved_hf_dataset"])
def test_prompts_come_from_any_job_source(tmp_path, kind):
    rows = [{"text": p} for p in PROMPTS[:5]] + [{"text": None}]
    if kind == "parquet_folder":
        (tmp_path / "in").mkdir()
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in" / "a.parquet")
        path = tmp_path / "in"
    elif kind == "jsonl":
        path = tmp_path / "in.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        import datasets

        path = tmp_path / "ds"
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    assert calibrate.read_prompts(str(path), 3, column="text") == PROMPTS[:3]
    assert calibrate.read_prompts(str(path), 100, column="text") == PROMPTS[:5]  # the null prompt is skipped


def test_bench_names_an_unreadable_prompt_source(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--prompts", str(tmp_path / "missing.parquet")])
    assert "--prompts:" in capsys.readouterr().err


@pytest.mark.slow
def test_calibrate_recommends_a_k_per_batch_size(llama_pair, prompt_file, capsys):
    calibrate.main(["--target", str(llama_pair.target), "--draft", str(llama_pair.target), "--prompts", prompt_file,
                    "--num-prompts", "6", "--max-new-tokens", "12", "--k-max", "3", "--batch-sizes", "1,3",
                    "--batch-size", "3"])
    out = capsys.readouterr().out
    assert "alpha = 1.000" in out  # the target drafting for itself: every draft is accepted
    assert "| 1 |" in out and "| 3 |" in out and "recommended k at batch 3" in out


def test_synthetic_pair_knobs_control_agreement(tmp_path):
    """tools/synthetic_pair.py: at s = 0, sigma = 0 the draft computes exactly the target; noise lowers agreement."""
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import synthetic_pair as sp

    target, draft, knobs = sp.build("tiny", 2, real_vocab=4096, seed=0, dtype=torch.float32, device="cpu")
    ids = torch.randint(3, 4096, (2, 12), generator=torch.Generator().manual_seed(0))
    sp.set_knobs(knobs, 0.0, 0.0)
    with torch.no_grad():
        assert torch.equal(target(ids).logits, draft(ids).logits)
        assert target(ids).logits[..., 4096:].eq(0).all()  # padded vocabulary rows: logit 0, never the argmax
    prompts = [list(range(3, 3 + n)) for n in (5, 9)]
    assert sp.agreement(target, draft, prompts, 8) == 1.0
    sp.set_knobs(knobs, 1.0, 100.0)
    assert sp.agreement(target, draft, prompts, 8) < 0.5

    sp.main(["--out", str(tmp_path / "pair"), "--shape", "tiny", "--draft-layers", "2", "--alpha", "0.6",
             "--dtype", "float32", "--device", "cpu", "--calibration-prompts", "3", "--calibration-tokens", "8"])
    from batchspec.engine.model.models import load_models

    models = load_models(str(tmp_path / "pair" / "target"), str(tmp_path / "pair" / "draft"), dtype="float32",
                         device="cpu")
    assert models.draft.config.num_hidden_layers == 2 and models.target.config.num_hidden_layers == 6
    assert "greedy agreement" in (tmp_path / "pair" / "README.md").read_text()


def _tree_bound():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import tree_bound

    return tree_bound


# rank hit rates, budget, expected tokens per round of the best tree, the root's children's subtree sizes
BEST_TREES = [
    ((1.0,), 4, 5.0, (4,)),  # a draft that is always right: the chain, all accepted, plus the bonus
    ((0.5, 0.5), 2, 2.0, (1, 1)),  # two equally likely guesses: both, side by side
    ((0.6, 0.4), 3, 2.36, (2, 1)),  # the third node below the first guess: 0.6 * (1 + 0.6) + 0.4
    ((0.5,), 3, 1.875, (3,)),
    ((0.873, 0.096, 0.020, 0.007), 8, 1 + sum(0.873 ** j for j in range(1, 9)), (8,)),  # the demo pair's ranks
    # a chain of 3 below the first guess and the second guess beside it (1.075) beats three side by side
    # with one below the first (0.5 * 1.5 + 0.2 + 0.1 = 1.05)
    ((0.5, 0.2, 0.1), 4, 1 + 0.5 * (1 + 0.5 + 0.25) + 0.2, (3, 1)),
]


@pytest.mark.parametrize("hits,budget,tokens,sizes", BEST_TREES)
def test_best_tree_of_a_budget(hits, budget, tokens, sizes):
    """tools/tree_bound.py: Sequoia's recursion over subtree sizes, checked on trees worked out by hand."""
    tb = _tree_bound()
    value, got = tb.best_tree_tokens(list(hits), budget)
    assert value == pytest.approx(tokens) and got == sizes
    assert value >= tb.chain_tokens(list(hits), budget) - 1e-12  # a chain is one of the trees


def test_tree_bound_runs_on_the_demo_pair(capsys):
    """The tool end to end, and the teacher-forced chain on a hand-made run of hits."""
    import torch

    tb = _tree_bound()
    assert tb.teacher_forced_chain([torch.tensor([True, True, False, True])], 2) == 2.0  # (3 + 2 + 1 + 2) / 4
    tb.main(["--num-prompts", "2", "--max-new-tokens", "8", "--budgets", "1,4"])
    out = capsys.readouterr().out
    assert "2 prompts, 16 positions" in out and "r1 " in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit() and "[" in line]
    assert [r[0] for r in rows] == ["1", "4"]


def test_bench_features_prints_both_tables(capsys):
    """tools/bench_features.py on the demo pair at its smallest: the n-samples table (prompt tokens
    prefilled: n=2 prefills each prompt once, the copies twice) and the logprobs table, whose greedy
    outputs it checks are identical at every setting."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    import bench_features

    bench_features.main(["--prompts", "2", "--n", "2", "--repeats", "1", "--max-new-tokens", "4", "--threads", "1"])
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("  n=2") or "copies" in line}
    assert int(rows["2"][-1]) == 2 * int(rows["n=2"][-1])  # the copies prefill every prompt twice
    assert "output identical at every setting" in out and "20" in out.split("logprobs:")[1]


def test_smollm2_without_the_gguf_readers_fails_in_one_line_naming_the_extra(monkeypatch, tmp_path, capsys):
    """tools/smollm2.py after the Quickstart's install (no gguf / accelerate): one line that says what to
    install, before any download."""
    import subprocess
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    import smollm2

    monkeypatch.setitem(sys.modules, "accelerate", None)  # import accelerate -> ImportError
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("downloaded before checking the readers"))
    with pytest.raises(SystemExit) as exit_:
        smollm2.main(["--out", str(tmp_path / "smol")])
    message = str(exit_.value)
    assert "\n" not in message and "pip install -e '.[models]'" in message and "accelerate" in message


def test_the_heldout_grid_prints_each_drafters_worst_and_median(llama_pair, prompt_file, tmp_path, capsys):
    """tools/heldout_grid.py over one tiny cell (a pair given as target, draft and prompts): each drafter's
    adaptive tokens/s against drafter none's and the best fixed k's, with the outputs' identity."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    import heldout_grid

    out = tmp_path / "grid.json"
    heldout_grid.main(["--pair", f"tiny={llama_pair.target},{llama_pair.draft},{prompt_file}", "--rows", "4",
                       "--max-new-tokens", "6", "--lengths", "fixed", "--batch-size", "2", "--drafters", "model,ngram",
                       "--repeats", "1", "--interleave", "--noise-check", "--json", str(out)])
    cells = json.loads(out.read_text())
    assert len(cells) == 1 and set(cells[0]["ratios"]) == {"model", "ngram"}
    assert cells[0]["none_again_vs_none"] > 0  # --noise-check: drafter none's second contender over its first
    for ratios in cells[0]["ratios"].values():
        assert ratios["identical"] and ratios["vs_none"] > 0 and ratios["best_fixed"].startswith("batchspec")
    printed = capsys.readouterr().out
    assert "grid: tiny rows 4 fixed batch 2 T 0.0: model " in printed
    assert " [none again " in printed and "  interleaved: batchspec none (again) " in printed
    assert [line.split()[0] for line in printed.splitlines()[-2:]] == ["model", "ngram"]
    assert printed.splitlines()[-1].endswith("identical")


def test_the_heldout_grid_says_when_the_prompts_ran_out(llama_pair, prompt_file, tmp_path, capsys):
    """A cell asked for more rows than the pair's prompt file holds (6): the bench says so and the grid's line and
    JSON give the rows that ran, not the ones asked for (a 1,000-row cell on a 500-prompt pair read as 1,000 rows)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    import heldout_grid

    out = tmp_path / "grid.json"
    heldout_grid.main(["--pair", f"tiny={llama_pair.target},{llama_pair.draft},{prompt_file}", "--rows", "1000",
                       "--max-new-tokens", "4", "--lengths", "fixed", "--batch-size", "3", "--drafters", "ngram",
                       "--fixed-k", "1", "--repeats", "1", "--json", str(out)])
    assert json.loads(out.read_text())[0]["rows"] == 6
    captured = capsys.readouterr()
    assert "grid: tiny rows 6 (of 1000 asked: the prompts hold 6) fixed batch 3 T 0.0: ngram " in captured.out
    assert f"--num-prompts 1000: {prompt_file} holds 6 prompts; running 6" in captured.err


@pytest.mark.parametrize("kind,opening,closing", [
    ("module-chat", "Here is the documentation of the Python module `", "give one short usage example."),
    ("module-raw", "# Python module `", "\n\n## Example\n\n"),
    ("class-chat", "Here is the documentation of the Python class `", "give one short usage example."),
    ("class-raw", "# Python class `", "\n\n## Example\n\n"),
])
def test_heldout_prompts_are_the_same_every_time(tmp_path, kind, opening, closing):
    """tools/heldout_prompts.py: the held-out sets are a fixed function of the running Python's standard library
    (sorted, shuffled by a fixed seed, docstrings cut to 700 characters), so two builds are identical."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import heldout_prompts

    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert heldout_prompts.main(["--kind", kind, "--out", str(first)]) == 0
    heldout_prompts.main(["--kind", kind, "--out", str(second)])
    assert first.read_bytes() == second.read_bytes()
    prompts = [json.loads(line)["prompt"] for line in first.read_text().splitlines()]
    assert len(prompts) >= 20
    assert all(p.startswith(opening) and p.endswith(closing) for p in prompts)
    assert max(len(p) for p in prompts) <= 700 + 250  # the docstring's 700 characters and the template


def test_code_prompts_keep_the_pairs_own_and_add_prefixes_of_other_files(llama_pair, tmp_path):
    """tools/code_prompts.py: a pair's own prompts first kept, then def/class prefixes of the --source files (cut as
    build_demo cuts them), ids naming where each came from; the same every time."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import code_prompts

    pair, source = tmp_path / "pair", tmp_path / "src"
    pair.mkdir()
    source.mkdir()
    (pair / "target").symlink_to(llama_pair.target)
    pq.write_table(pa.table({"id": ["heldout-0000", "heldout-0001"], "prompt": ["def f(x):", "class A:"],
                             "source_file": ["a.py", "b.py"]}), pair / "prompts.parquet")
    body = "\n".join(f"    value_{j} = compute_{j}(argument, other_{j})" for j in range(6))
    (source / "mod.py").write_text("".join(f"def function_{i}(argument):\n{body}\n    return value_0\n\n\n"
                                           for i in range(5)))
    outs = [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    for out in outs:
        code_prompts.main(["--pair", str(pair), "--rows", "5", "--out", str(out), "--source", str(source), "--glob", "*.py"])
    rows = pq.read_table(outs[0]).to_pylist()
    assert rows == pq.read_table(outs[1]).to_pylist() and len(rows) == 5
    assert sorted(r["id"] for r in rows) == ["heldout-0000", "heldout-0001", "tf-0000", "tf-0001", "tf-0002"]
    added = [r for r in rows if r["id"].startswith("tf-")]
    assert all(r["source_file"].endswith("/src/mod.py") and r["prompt"].startswith("def function_") for r in added)


PATH_FLAG_CASES = [
    # (source, rel, expected (line, flags, built)) of tools/path_flags.py
    ("def f(self):\n    if self.static:\n        pass\n", "x.py", [(2, "static", False)]),
    ("class A:\n    def __init__(self, r):\n        self.f = self.a if r.packs else self.b\n", "x.py",
     [(3, "packs", True)]),
    ("def f(rows, per_row):\n    return [r for r in rows if per_row]\n", "x.py", [(2, "per_row", False)]),
    ("def f(self):\n    while self.fill_budget and self.static:\n        pass\n", "x.py",
     [(2, "fill_budget, static", False)]),
    ("def f(self):\n    if self.sampling.greedy:\n        pass\n    x = self.static\n", "x.py", []),
    ("def verify_pass(runner):\n    if runner.static:\n        pass\n", "verify_pass.py", [(2, "static", True)]),
    ("def verify_pass(runner):\n    if runner.static:\n        pass\n", "other.py", [(2, "static", False)]),
]


@pytest.mark.parametrize("source, rel, expected", PATH_FLAG_CASES)
def test_path_flags_counts_the_tests_of_path_flags_and_when_they_run(source, rel, expected):
    """tools/path_flags.py: a condition that reads a path flag is counted, as built when it sits in a constructor
    or a function that runs once at build; a flag read outside a condition, or another attribute, is not."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    import path_flags

    assert path_flags.flag_tests(source, rel) == expected


@pytest.mark.slow
def test_ab_bench_in_separate_processes_imports_each_checkouts_own_package(llama_pair, prompt_file, tmp_path, capsys):
    """tools/ab_bench.py --processes: each pair of runs in a new process importing only its checkout (the base a
    copy of this one's package elsewhere, so both must agree), one line a pair, and the report's rates, paired
    ratios and output checks."""
    import shutil
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "tools"))
    import ab_bench

    base = tmp_path / "base"
    shutil.copytree(root / "batchspec", base / "batchspec", ignore=shutil.ignore_patterns("assets", "__pycache__"))
    out = tmp_path / "ab.json"
    ab_bench.main(["--base", str(base), "--processes", "--target", str(llama_pair.target), "--draft",
                   str(llama_pair.draft), "--prompts", prompt_file, "--num-prompts", "4", "--max-new-tokens", "4",
                   "--batch-size", "2", "--drafters", "none,ngram", "--repeats", "1", "--json", str(out)])
    [report] = json.loads(out.read_text())
    assert report["how"] == "separate processes" and report["outputs_equal"] == {"base": True, "this": True,
                                                                                    "across": True}
    assert all(len(rates) == 1 and rates[0] > 0 for by in report["rates"].values() for rates in by.values())
    assert report["vs_first"]["this"]["none"] == 1.0 and report["this_vs_base"]["ngram"] > 0
    printed = capsys.readouterr()
    assert "interleaved, separate processes" in printed.out
    assert printed.err.count("batch 2 repeat 1: ") == 2


def test_ab_bench_worker_refuses_a_checkout_without_the_package(tmp_path):
    """A --processes worker pointed at a folder without batchspec/ must not fall back on another checkout's."""
    import subprocess
    import sys
    from pathlib import Path

    tool = Path(__file__).resolve().parent.parent / "tools" / "ab_bench.py"
    done = subprocess.run([sys.executable, str(tool), "--worker", str(tmp_path), "--drafters", "none"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode != 0 and f"ab_bench: {tmp_path} holds no batchspec package" in done.stderr.replace(str(tmp_path.resolve()), str(tmp_path))
