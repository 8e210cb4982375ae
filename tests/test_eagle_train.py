"""`python -m batchspec.train_draft`: a run end to end on a tiny target, kill -9 and --resume, refusals,
and the pieces with exact answers (draft vocabulary, greedy replay)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from batchspec.training.data import Sample, split_prompts
from batchspec.training.evaluate import acceptance, next_token_chains, ratio_standard_error, replay
from batchspec.eagle.formats import load_head
from batchspec.training.summary import render
from batchspec.training.train import TrainDraftError, TrainDraftOptions, run
from batchspec.training.vocab import choose_vocab, d2t_t2d, size_for_coverage
from tiny import PROMPTS, build_tokenizer, save_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Llama target and a JSONL of prompts."""
    folder = tmp_path_factory.mktemp("eagle_train")
    tokenizer = build_tokenizer()
    target = save_model(folder / "target", "llama", tokenizer, seed=3, vocab_size=len(tokenizer), layers=4)
    prompts = folder / "prompts.jsonl"
    rows = [{"prompt": p} for p in PROMPTS] + [{"prompt": p + " " + q} for p in PROMPTS[:6] for q in PROMPTS[6:9]]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return target, prompts


def options(tiny, out, **kw) -> TrainDraftOptions:
    target, prompts = tiny
    base = dict(target=str(target), prompts=str(prompts), out=str(out), minutes=0, steps=12, device="cpu",
                max_new_tokens=12, eval_new_tokens=12, heldout=0.25, max_heldout=4, gen_batch_size=8,
                batch_size=4, ttt_steps=3, lr=3e-3, loop={"eval_every": 5})
    base.update(kw)
    return TrainDraftOptions(**base)


def test_run_end_to_end(tiny, tmp_path):
    summary = run(options(tiny, tmp_path / "head", format="speculators"), log=lambda *a: None)
    head = load_head(tmp_path / "head", _target(tiny))
    assert head.config.target_layer_ids == (1, 2, 3)  # (2, L//2, L-3) is (2, 2, 1) for 4 layers: the nearest valid
    assert summary.steps == 12 and summary.heldout_samples == 4 and summary.train_samples == 26
    assert summary.history and summary.final_loss < summary.history[0]["loss"] * 1.5
    acc = summary.acceptance
    assert len(acc["cumulative"]) == 5 and all(0 <= a <= 1 for a in acc["cumulative"])
    assert all(a >= b for a, b in zip(acc["cumulative"], acc["cumulative"][1:]))
    assert 1.0 <= acc["tokens_per_forward"][4] <= 5.0
    text = render(summary)
    assert "predicted speedup" in text and len(text.splitlines()) <= 16
    assert "± one standard error over the held-out prompts" in text and f"k=4 {acc['tokens_per_forward'][4]:.2f} ±" in text
    assert "(hard labels + 10 x feature regression)" in text  # the default weight, named where the loss is
    assert json.loads((tmp_path / "head" / "train_summary.json").read_text())["steps"] == 12


def _target(tiny):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(tiny[0], dtype=torch.float32)


def _head_and_states(tiny, count: int):
    """The tiny target, a fresh head (seed 0) and `count` random 12-token samples with their target states."""
    from batchspec.training.features import sequence_states
    from batchspec.training.init import head_for_target

    target = _target(tiny)
    gen = torch.Generator().manual_seed(0)
    sequences = [torch.randint(3, 300, (12,), generator=gen).tolist() for _ in range(count)]
    samples = [Sample(ids, prompt_len=4) for ids in sequences]
    torch.manual_seed(0)
    head = head_for_target(target)
    states = sequence_states(target, sequences, head.config.target_layer_ids, dtype=torch.float32)
    return target, head, samples, states


def test_refuses_an_earlier_run_without_resume(tiny, tmp_path):
    run(options(tiny, tmp_path, steps=2), log=lambda *a: None)
    with pytest.raises(TrainDraftError, match="pass --resume"):
        run(options(tiny, tmp_path, steps=2), log=lambda *a: None)
    with pytest.raises(TrainDraftError, match="different max_new_tokens"):
        run(options(tiny, tmp_path, steps=2, resume=True, max_new_tokens=5), log=lambda *a: None)
    # A folder from before --prompt-order held its prompts out and continued them in the source's order.
    record = tmp_path / ".train" / "run.json"
    stored = json.loads(record.read_text())
    assert stored.pop("prompt_order") == "shuffled"
    record.write_text(json.dumps(stored))
    with pytest.raises(TrainDraftError, match="different prompt_order"):
        run(options(tiny, tmp_path, steps=2, resume=True), log=lambda *a: None)
    assert run(options(tiny, tmp_path, steps=3, resume=True, prompt_order="file"), log=lambda *a: None).steps == 3


def cli(tiny, out, *extra) -> list[str]:
    target, prompts = tiny
    return [sys.executable, "-m", "batchspec.train_draft", str(target), "--prompts", str(prompts), "--out", str(out),
            "--minutes", "0", "--device", "cpu", "--max-new-tokens", "12", "--eval-new-tokens", "12",
            "--heldout", "0.25", "--max-heldout", "4", "--batch-size", "4", "--ttt-steps", "3",
            "--checkpoint-every", "0", *extra]


@pytest.mark.slow
def test_kill_and_resume_gives_the_uninterrupted_result(tiny, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    steps = "80"
    subprocess.run(cli(tiny, tmp_path / "whole", "--steps", steps), check=True, env=env, capture_output=True, cwd=ROOT)

    out = tmp_path / "killed"
    proc = subprocess.Popen(cli(tiny, out, "--steps", steps), env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    checkpoint, killed_at = out / ".train" / "checkpoint.pt", 0
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if checkpoint.exists():
            killed_at = torch.load(checkpoint, weights_only=False)["state"]["step"]
            if killed_at >= 15:
                proc.send_signal(signal.SIGKILL)
                break
        time.sleep(0.05)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL and 15 <= killed_at < 80, (proc.returncode, killed_at)
    assert not (out / "model.safetensors").exists()
    chunks = sorted((out / ".train" / "samples").glob("train-*.json"))
    stamps = [c.stat().st_mtime_ns for c in chunks]

    done = subprocess.run(cli(tiny, out, "--steps", steps, "--resume"), env=env, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "predicted speedup" in done.stdout
    assert [c.stat().st_mtime_ns for c in chunks] == stamps  # the samples were reused, not regenerated
    a = torch.load(tmp_path / "whole" / ".train" / "checkpoint.pt", weights_only=False)
    b = torch.load(out / ".train" / "checkpoint.pt", weights_only=False)
    assert a["state"]["step"] == b["state"]["step"] == 80
    for key, value in a["head"].items():
        assert torch.equal(value, b["head"][key]), key


def test_cli_one_line_errors(tiny, tmp_path, capsys):
    from batchspec.training.train_draft import main

    for argv, words in (
        ([str(tiny[0]), "--prompts", str(tmp_path / "none.jsonl")], "does not exist"),
        ([str(tmp_path / "no-model"), "--prompts", str(tiny[1])], "cannot load model"),
        ([str(tiny[0]), "--prompts", str(tiny[1]), "--out", str(tiny[1])], "is a file; give a folder"),
    ):
        with pytest.raises(SystemExit) as info:
            main([*argv, "--steps", "1", "--device", "cpu"] + ([] if "--out" in argv else ["--out", str(tmp_path / "o")]))
        message = str(info.value)
        assert message.startswith("train_draft:") and words in message and "\n" not in message, message
    assert not (tmp_path / "o").exists()  # nothing written: the same command works once fixed


def test_a_prompt_column_that_gives_few_prompts_is_refused_and_bad_rows_are_named(tiny, tmp_path):
    """A column of integers once trained a head on the one usable row; now it is refused with the first
    row's reason, and a source with a few bad rows trains on the rest, saying how many were skipped."""
    numbers = tmp_path / "numbers.jsonl"
    numbers.write_text("".join(json.dumps({"prompt": i}) + "\n" for i in range(30)) + '{"prompt": "the fox"}\n')
    with pytest.raises(TrainDraftError, match=r"only 1 of 31 rows give a prompt .*row 0: .* holds a int"):
        run(options(tiny, tmp_path / "a", prompts=str(numbers)), log=lambda *a: None)
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(tiny[1].read_text() + '{"prompt": null}\n{"prompt": 7}\n')
    lines = []
    summary = run(options(tiny, tmp_path / "b", prompts=str(mixed), steps=1), log=lines.append)
    assert summary.train_samples == 26
    assert any(line.startswith("prompts: 2 of 32 rows unusable, skipped; the first: row 30: source.prompt_column ") for line in lines)


def test_choose_vocab():
    counts = Counter({5: 10, 3: 10, 9: 7, 1: 1, 7: 3})
    v = choose_vocab(counts, 3, 12, always=(11,))
    assert v.target_ids.tolist() == [3, 5, 11]  # EOS kept; ties to the lower id
    assert v.coverage == pytest.approx(20 / 31)
    assert choose_vocab(counts, 7, 12).target_ids.tolist() == [0, 1, 2, 3, 5, 7, 9]  # padded with unseen ids
    assert choose_vocab(counts, 12, 12).target_ids.tolist() == list(range(12))
    assert size_for_coverage(Counter({t: 1 for t in range(1000)}), 4096) == 1024  # 970 tokens, rounded up
    assert size_for_coverage(Counter({t: 1 for t in range(1000)}), 4096, multiple=1) == 970  # the default: 97%
    assert size_for_coverage(Counter({t: 1 for t in range(1000)}), 700) == 700
    assert size_for_coverage(counts, 12, coverage=0.6, multiple=1) == 2
    d2t, t2d = d2t_t2d(torch.tensor([3, 5, 11]), 12)
    assert d2t.tolist() == [3, 4, 9] and t2d.nonzero().flatten().tolist() == [3, 5, 11]


def test_replay_and_acceptance_are_exact():
    # 3 prompt tokens, 6 new: rows 2.. start chains; the draft-model view: next_ok[q] for q = 0..7
    next_ok = torch.tensor([0, 0, 1, 1, 0, 1, 1, 1], dtype=torch.bool)
    m = next_token_chains(next_ok, 4)
    assert m[2].tolist() == [True, False, True, True]  # the chain from row 2 drafts positions 4.. = next_ok[3..]
    # the prefill emits token 1; the chain from row 2 keeps 1 draft (3 emitted); from row 4 only 2 drafts fit
    # before the end, both kept (6 emitted): 3 forwards, 2 rounds
    assert replay(m, 3, 6, 4) == (3, 2)
    assert replay(m, 3, 6, 1) == (4, 3)
    sample = Sample(list(range(9)), 3)
    result = acceptance([m], [sample], k_max=2)
    # chain rows 2..6: first draft kept at rows 2, 4, 5, 6 (of 5); the second has room at rows 2..5, kept at 4, 5
    assert result.cumulative == [4 / 5, 2 / 4] and result.conditional[1] == pytest.approx(2 / 3)


@pytest.mark.parametrize("pairs,expected", [
    ([(6, 3)], 0.0),  # one prompt: nothing to say
    ([(6, 3), (4, 2), (8, 4)], 0.0),  # every prompt at the ratio
    # ratio 12 / 8 = 1.5, residuals 6 - 4.5 = 1.5 and 6 - 7.5 = -1.5: sqrt(4.5 / 2) / mean f 4
    ([(6, 3), (6, 5)], (4.5 / 2) ** 0.5 / 4),
])
def test_ratio_standard_error(pairs, expected):
    assert ratio_standard_error(pairs) == pytest.approx(expected)


def test_held_out_tokens_per_forward_carry_their_standard_error():
    """Each sample's own (tokens, forwards) from the replay: two samples, one drafted perfectly, one not."""
    good = Sample(list(range(9)), 3)
    perfect, none = torch.ones(8, 2, dtype=torch.bool), torch.zeros(8, 2, dtype=torch.bool)
    result = acceptance([perfect, none], [good, good], k_max=2)
    forwards = [replay(perfect, 3, 6, 2)[0], replay(none, 3, 6, 2)[0]]
    assert result.tokens_per_forward[2] == pytest.approx(12 / sum(forwards))
    assert result.tokens_per_forward_se[2] == pytest.approx(ratio_standard_error([(6, f) for f in forwards]))
    assert result.tokens_per_forward_se[2] > 0


def test_split_prompts():
    split = split_prompts([[i] for i in range(40)], 0.1, 3)
    assert [i for i, _ in split.heldout] == [9, 19, 29] and len(split.train) == 37
    assert [i for i, _ in split.train[:10]] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 10]


def test_shuffled_prompts_spread_the_data_and_the_held_out_prompts_over_the_whole_source():
    """A source written topic by topic (as the shipped instructions are): the first chunk a budget continues
    is drawn from every topic and so are the held-out prompts (the same ones for every seed), and every
    prompt is used once."""
    source = [[topic, n] for topic in range(4) for n in range(100)]  # 4 topics of 100 prompts, in order
    split = split_prompts(source, 0.05, 8, order="shuffled", seed=0)
    again, other_seed = (split_prompts(source, 0.05, 8, order="shuffled", seed=s) for s in (0, 1))
    assert split == again and split.train != other_seed.train and split.heldout == other_seed.heldout
    assert sorted(i for i, _ in split.train + split.heldout) == list(range(400))
    assert all(source[i] == ids for i, ids in split.train + split.heldout)
    assert [i for i, _ in split.heldout] == [25, 75, 125, 175, 225, 275, 325, 375]
    assert {ids[0] for _, ids in split.train[:40]} == {0, 1, 2, 3}
    in_file_order = split_prompts(source, 0.05, 8)
    assert {ids[0] for _, ids in in_file_order.train[:40]} == {0}
    assert {ids[0] for _, ids in in_file_order.heldout} == {0, 1}  # the first 160 prompts: two topics
    with pytest.raises(ValueError, match="shuffled or file"):
        split_prompts(source, 0.05, 8, order="random")
    # Rows that gave no prompt (unreadable, too long: empty) are never held out, so the set keeps its size.
    gaps = [[] if n % 3 == 0 else ids for n, ids in enumerate(source)]
    spread = split_prompts(gaps, 0.05, 8, order="shuffled", seed=0)
    assert len(spread.heldout) == 8 and all(ids for _, ids in spread.heldout)


@pytest.mark.parametrize("kind, mode, enabled", [
    ("cpu", "off", False),
    ("cpu", "bfloat16", True),
    ("cpu", "auto", False),  # bf16 training slows the process's later fp32 forwards on CPU (precision.autocast_enabled)
    ("cuda", "auto", True),
    ("cuda", "off", False),
    ("mps", "auto", False),
])
def test_training_autocast(kind, mode, enabled):
    from batchspec.training import precision

    assert precision.autocast_enabled(kind, mode) is enabled
    if kind == "cpu":
        context = precision.training_autocast("cpu", mode)
        assert context.fast_dtype == torch.bfloat16 and context._enabled is enabled


def test_training_autocast_refuses_an_unknown_mode():
    from batchspec.training.precision import training_autocast

    with pytest.raises(ValueError, match="auto, bfloat16 or off"):
        training_autocast("cpu", "fp16")


# The peak learning rate by head width: Adam moves each weight by about lr per step, so the rate that trains
# the 256-wide demo head falls as 1/width above it (3e-3 sent a 3072-wide head to a NaN loss on an H100).
LEARNING_RATES = [(64, 3e-3), (256, 3e-3), (512, 1.5e-3), (3072, 2.5e-4)]


@pytest.mark.parametrize("hidden,lr", LEARNING_RATES)
def test_default_lr_falls_as_one_over_the_width(hidden, lr):
    from batchspec.training.loop import default_lr

    assert default_lr(hidden) == pytest.approx(lr)


# samples (of 8) whose target features are NaN -> training skips their steps, or stops when nothing is finite
POISONED = [(1, False), (8, True)]


@pytest.mark.parametrize("poisoned,stops", POISONED)
def test_non_finite_steps_are_skipped_and_a_run_of_them_stops_training(tiny, tmp_path, poisoned, stops):
    from batchspec.training.loop import LoopOptions, NonFiniteLoss, train_loop

    target, head, samples, states = _head_and_states(tiny, 8)
    for i in range(poisoned):
        states[i] = (states[i][0] * float("nan"), *states[i][1:])
    options = LoopOptions(steps=30, seconds=0, batch_size=1, ttt_steps=2, show_progress=False, eval_every=10**9)
    run_loop = lambda: train_loop(head, target, samples, states, [], [], options, tmp_path / "ckpt.pt")  # noqa: E731
    if stops:
        with pytest.raises(NonFiniteLoss, match=r"not finite in 20 steps in a row \(step 20, peak learning rate"):
            run_loop()
        return
    state = run_loop()
    assert 0 < state.skipped < 30 and state.step == 30 and state.loss is not None
    assert all(torch.isfinite(p).all() for p in head.parameters())  # no NaN reached a weight


# training agreement at the first position, held-out acceptance, held-out samples -> what the summary says
OVERFIT = [(0.93, 0.03, 32, "memorised"), (0.77, 0.37, 32, "memorised"), (0.91, 0.57, 32, "short of data"),
           (0.80, 0.62, 32, None), (0.93, 0.03, 0, None), (0.5, 0.9, 32, None)]


@pytest.mark.parametrize("train,heldout,samples,kind", OVERFIT)
def test_a_head_that_learnt_its_data_by_heart_is_named(train, heldout, samples, kind):
    from types import SimpleNamespace

    from batchspec.training.summary import overfit

    s = SimpleNamespace(agreement=[train, train - 0.05], acceptance={"cumulative": [heldout, heldout / 2]},
                        heldout_samples=samples)
    assert overfit(s) == ((kind, train, heldout) if kind else None)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_states_recorded_while_generating_equal_a_forward_over_each_sequence(tiny, temperature):
    """train_draft takes the target's states from the forwards that write the continuations (training/record.py,
    packed rounds: prompt chunks, then one position per round); they must be what one forward over each
    finished sequence gives, and so must the greedy labels derived from them."""
    from batchspec.training.data import continue_prompts
    from batchspec.training.features import recorded_states, sequence_states
    from batchspec.engine.model.models import load_models

    models = load_models(str(tiny[0]), device="cpu")
    prompts = [(i, models.tokenizer(p)["input_ids"]) for i, p in enumerate(PROMPTS)]
    layers = (1, 2, 3)
    samples, recorded = continue_prompts(models.target, models.tokenizer, prompts, max_new_tokens=20,
                                         temperature=temperature, seed=0, batch_size=3, layers=(*layers, 4))
    assert len(samples) == len(PROMPTS) == len(recorded)
    assert any(s.new_tokens == 20 for s in samples)
    assert any(s.new_tokens < 20 for s in samples) or temperature > 0  # rows ended by EOS (greedy) and by length
    got = recorded_states(models.target, samples, recorded, greedy_data=temperature == 0)
    want = sequence_states(models.target, [s.ids for s in samples], layers)
    for sample, (features, final, greedy), (f_ref, final_ref, g_ref) in zip(samples, got, want):
        n = len(sample.ids)
        assert features.shape == (n - 1, f_ref.shape[1]) and final.shape == final_ref.shape
        torch.testing.assert_close(features, f_ref[: n - 1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(final[: n - 1], final_ref[: n - 1], atol=1e-4, rtol=1e-4)
        assert greedy[n - 1] == -1 and greedy[: n - 1].tolist() == g_ref[: n - 1].tolist()


def test_rows_in_flight_at_the_data_deadline_are_kept_with_their_states(tiny):
    """Past the data phase's deadline the rows still running are cut short and kept as far as they got (they
    were dropped, up to a whole generation batch): each a prefix of its uninterrupted continuation, with the
    states a forward over it gives."""
    from batchspec.training.data import continue_prompts
    from batchspec.training.features import recorded_states, sequence_states
    from batchspec.engine.model.models import load_models

    models = load_models(str(tiny[0]), device="cpu")
    prompts = [(i, models.tokenizer(p)["input_ids"]) for i, p in enumerate(PROMPTS)]
    layers = (1, 2, 3)
    run = dict(max_new_tokens=20, temperature=0.0, seed=0, batch_size=3, layers=(*layers, 4))
    full, _ = continue_prompts(models.target, models.tokenizer, prompts, **run)
    early = next(i for i, s in enumerate(full) if s.new_tokens < 20)  # a row that ends on EOS goes first
    prompts = [prompts[early]] + prompts[:early] + prompts[early + 1:]
    samples, recorded = continue_prompts(models.target, models.tokenizer, prompts, deadline=0.0, keep=1, **run)
    assert 1 < len(samples) <= 3 < len(PROMPTS)  # the first row to finish, and the rows running beside it
    whole = {tuple(s.ids[: s.prompt_len]): s.ids for s in full}
    assert any(len(s.ids) < len(whole[tuple(s.ids[: s.prompt_len])]) for s in samples)  # some were cut short
    for sample in samples:
        assert whole[tuple(sample.ids[: sample.prompt_len])][: len(sample.ids)] == sample.ids
    got = recorded_states(models.target, samples, recorded, greedy_data=True)
    want = sequence_states(models.target, [s.ids for s in samples], layers)
    for sample, (features, _, greedy), (f_ref, _, g_ref) in zip(samples, got, want):
        n = len(sample.ids)
        torch.testing.assert_close(features, f_ref[: n - 1], atol=1e-4, rtol=1e-4)
        assert greedy[: n - 1].tolist() == g_ref[: n - 1].tolist()


# flag, value, accepted: train_draft takes the value as given (it passes it to LoopOptions), or refuses it in one line
FLAGS = [("--weight-decay", "0.5", True), ("--weight-decay", "0", True), ("--weight-decay", "-0.1", False),
         ("--weight-decay", "nan", False),
         ("--ttt-ramp", "0.5", True), ("--ttt-ramp", "0", True), ("--ttt-ramp", "1", True), ("--ttt-ramp", "1.5", False),
         ("--ttt-ramp", "-0.1", False),
         ("--feature-loss", "5", True), ("--feature-loss", "0", True), ("--feature-loss", "-1", False),
         ("--feature-loss", "nan", False), ("--feature-loss", "inf", False),
         ("--feature-noise", "0.2", True), ("--feature-noise", "0", True), ("--feature-noise", "-0.1", False),
         ("--feature-noise", "nan", False)]


@pytest.mark.parametrize("flag, value, ok", FLAGS)
def test_number_flags(flag, value, ok, capsys):
    from batchspec.training.train_draft import parse_args

    argv = ["target", "--prompts", "p.parquet", "--out", "head", flag, value]
    if ok:
        assert getattr(parse_args(argv), flag[2:].replace("-", "_")) == float(value)
        return
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2 and flag in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("weight", [0.0, 0.5, 5.0])
def test_feature_loss_adds_the_weighted_regression_onto_the_targets_lm_head_input(tiny, weight):
    """batch_loss with feature_loss w is the label loss plus, at every unrolled step j (weighted 0.8^j like the
    labels), w x smooth-L1 between the head's normed output and the target's LM-head input at position i+1+j:
    the state whose logits the step's label comes from. Recomputed here from unroll's outputs."""
    import torch.nn.functional as F

    from batchspec.training.loop import LoopOptions, TargetHead, batch_loss
    from batchspec.training.ttt import unroll

    target, head, samples, states = _head_and_states(tiny, 4)
    rows, steps = [0, 1, 2, 3], 3
    base = LoopOptions(ttt_steps=steps, train_on_prompt=True)
    target_head = TargetHead(target, head.t2d, "cpu")
    plain, _, _ = batch_loss(head, target_head, samples, states, rows, base, "cpu")
    with_features, _, _ = batch_loss(head, target_head, samples, states, rows,
                                     LoopOptions(ttt_steps=steps, train_on_prompt=True, feature_loss=weight), "cpu")
    ids = torch.tensor([s.ids for s in samples])  # all 12 tokens long: no padding
    feats = torch.stack([st[0] for st in states])
    final = torch.stack([st[1] for st in states])
    greedy = torch.stack([st[2] for st in states])[:, 1:]
    n = ids.shape[1] - 1
    regressions = []
    with torch.no_grad():
        for j, out in enumerate(unroll(head, ids, feats, steps)):
            rows_ok = torch.zeros(4, n, dtype=torch.bool)
            rows_ok[:, : n - j] = (greedy[:, j:] >= 0) & head.t2d[greedy[:, j:].clamp(min=0)]
            want = torch.cat([final[:, 1 + j:], final.new_zeros(4, j, final.shape[-1])], dim=1)
            regressions.append(F.smooth_l1_loss(head.norm(out[rows_ok]), want[rows_ok]))
    weights = [0.8 ** j for j in range(steps)]
    expected = weight * sum(w * r for w, r in zip(weights, regressions)) / sum(weights)
    assert regressions[0] > 0.01  # a fresh head is far from the target's states: the term is not vacuous
    torch.testing.assert_close(with_features.detach() - plain.detach(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("share", [0.0, 0.1, 0.5])
def test_feature_noise_is_uniform_within_its_share_of_each_layers_rms(share):
    """noisy adds, per element, uniform noise in +- share x the RMS of that element's layer at that position
    (three layers of very different size here: the bound follows each), and draws it from the generator alone."""
    from batchspec.training.features import noisy

    torch.manual_seed(0)
    scale = torch.tensor([1.0] * 8 + [10.0] * 8 + [100.0] * 8)
    features = torch.randn(3, 7, 24) * scale
    first = noisy(features, share, 3, torch.Generator().manual_seed(5))
    again = noisy(features, share, 3, torch.Generator().manual_seed(5))
    other = noisy(features, share, 3, torch.Generator().manual_seed(6))
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    layers = features.view(3, 7, 3, 8)
    rms = layers.pow(2).mean(-1, keepdim=True).sqrt()
    relative = ((first - features).view(3, 7, 3, 8) / rms).abs()
    assert float(relative.max()) <= share + 1e-5
    if share:
        assert float(relative.max()) > 0.9 * share  # 504 draws: the noise reaches its bound
        assert float(relative.mean()) == pytest.approx(share / 2, rel=0.15)  # |U(-s, s)| has mean s/2
        assert not torch.equal(first, other)
    else:
        torch.testing.assert_close(first, features, rtol=0, atol=0)


def test_batch_loss_with_feature_noise_reads_noisy_features_only_when_given_a_generator(tiny):
    """feature_noise changes the loss when batch_loss gets a generator (training) and never without one."""
    from batchspec.training.loop import LoopOptions, TargetHead, batch_loss

    target, head, samples, states = _head_and_states(tiny, 4)
    target_head = TargetHead(target, head.t2d, "cpu")
    plain_options = LoopOptions(ttt_steps=2, train_on_prompt=True)
    noisy_options = LoopOptions(ttt_steps=2, train_on_prompt=True, feature_noise=0.3)
    rows = [0, 1, 2, 3]
    plain, _, _ = batch_loss(head, target_head, samples, states, rows, plain_options, "cpu")
    without, _, _ = batch_loss(head, target_head, samples, states, rows, noisy_options, "cpu")
    first, _, _ = batch_loss(head, target_head, samples, states, rows, noisy_options, "cpu",
                             noise=torch.Generator().manual_seed(1))
    again, _, _ = batch_loss(head, target_head, samples, states, rows, noisy_options, "cpu",
                             noise=torch.Generator().manual_seed(1))
    assert without.item() == plain.item()
    assert first.item() == again.item()
    assert first.item() != plain.item()


def test_api_defaults_are_the_command_defaults():
    """TrainDraftOptions (what tools/build_demo.py and other callers build) defaults every option as the command
    does: a default measured and set on the command only (the unrolled-step ramp was, at first) would leave API
    callers without it. save_dtype differs by design: the command's "auto" is resolved before the options."""
    from dataclasses import MISSING, fields

    from batchspec.training.train_draft import parse_args

    args = vars(parse_args(["target", "--prompts", "p.parquet", "--out", "head"]))
    shared = [f for f in fields(TrainDraftOptions) if f.name in args and f.default is not MISSING]
    assert {f.name for f in shared} >= {"ttt_steps", "ttt_ramp", "data_fraction", "gen_dtype", "minutes", "batch_size"}
    assert {f.name: f.default for f in shared if f.name != "save_dtype"} == \
        {f.name: args[f.name] for f in shared if f.name != "save_dtype"}


def test_training_continuations_in_another_dtype(tiny, tmp_path, monkeypatch):
    """--gen-dtype bfloat16: a bfloat16 copy writes the training continuations (their states stored as float32),
    the float32 target the held-out ones (equal to a float32 run's), and the target itself stays float32; the
    run trains and saves a head."""
    import batchspec.training.data as data
    from batchspec.training.data import SampleStore
    from batchspec.training.train import generation_target

    target = _target(tiny)
    assert generation_target(target, "auto") is target and generation_target(target, "float32") is target
    writer = generation_target(target, "bfloat16")
    assert writer.dtype == torch.bfloat16 and target.dtype == torch.float32
    with pytest.raises(TrainDraftError, match="--gen-dtype"):
        generation_target(target, "int8")
    with pytest.raises(TrainDraftError, match="float16 on a CPU"):
        generation_target(target, "float16")

    written = []  # (dtype of the model that wrote, max_new_tokens: 12 training, 10 held-out)
    real = data.continue_prompts
    monkeypatch.setattr(data, "continue_prompts", lambda model, *a, **kw: (
        written.append((model.dtype, kw["max_new_tokens"])), real(model, *a, **kw))[1])
    summaries = {}
    for dtype in ("auto", "bfloat16"):
        written.clear()
        summaries[dtype] = run(options(tiny, tmp_path / dtype, steps=2, eval_new_tokens=10, gen_dtype=dtype),
                               log=lambda *a: None)
        want = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        assert written and all(d == (want if n == 12 else torch.float32) for d, n in written), written
        assert {n for _, n in written} == {10, 12}
    stores = {d: SampleStore(tmp_path / d / ".train" / "samples") for d in summaries}
    held = {d: s.unpack(s.read("heldout.json")) for d, s in stores.items()}
    assert [x.ids for x in held["auto"]] == [x.ids for x in held["bfloat16"]]
    assert all(st.dtype == torch.float32 for st in stores["bfloat16"].load_states("train-00000"))
    assert summaries["bfloat16"].steps == 2
    assert load_head(tmp_path / "bfloat16", target) is not None


# ttt_steps, ttt_ramp, progress -> unrolled steps
RAMP = [
    (4, 0.0, 0.0, 4), (4, 0.0, 0.9, 4),  # no ramp: every step unrolls ttt_steps
    (4, 0.6, 0.0, 1), (4, 0.6, 0.19, 1), (4, 0.6, 0.2, 2), (4, 0.6, 0.45, 3), (4, 0.6, 0.6, 4), (4, 0.6, 1.0, 4),
    (1, 0.5, 0.0, 1), (2, 1.0, 0.5, 1), (2, 0.5, 0.49, 1), (2, 0.5, 0.5, 2),  # full steps from the ramp's end
]


@pytest.mark.parametrize("ttt,ramp,progress,expected", RAMP)
def test_unrolled_steps_ramp(ttt, ramp, progress, expected):
    from batchspec.training.loop import LoopOptions, steps_at

    assert steps_at(progress, LoopOptions(ttt_steps=ttt, ttt_ramp=ramp)) == expected


def test_a_ramped_run_trains_every_step_by_its_end(tiny, tmp_path):
    """20 steps ramping 1 -> 3 unrolled steps over the first half: the agreement covers all three (each step's
    mean over the recent steps that ran it) and the weights stay finite."""
    from batchspec.training.loop import LoopOptions, train_loop

    target, head, samples, states = _head_and_states(tiny, 4)
    options = LoopOptions(steps=20, seconds=0, batch_size=2, ttt_steps=3, ttt_ramp=0.5, show_progress=False,
                          eval_every=10**9)
    state = train_loop(head, target, samples, states, [], [], options, tmp_path / "ckpt.pt")
    assert state.step == 20 and len(state.agreement) == 3
    assert all(0.0 <= a <= 1.0 for a in state.agreement)
    assert all(torch.isfinite(p).all() for p in head.parameters())


@pytest.mark.parametrize("lm_head, stays_the_targets", [("frozen", True), ("train", False)])
def test_lm_head_frozen_or_trained(tiny, tmp_path, lm_head, stays_the_targets):
    """--lm-head frozen: the saved head's LM head is exactly the target's rows of its draft vocabulary and is not
    counted as trained; train: it moves. A resumed run with the other choice is refused (its optimiser holds
    different weights)."""
    summary = run(options(tiny, tmp_path / "head", lm_head=lm_head), log=lambda *a: None)
    target = _target(tiny)
    head = load_head(tmp_path / "head", target)
    rows = target.get_output_embeddings().weight.detach()[head.t2d.bool()]
    assert torch.equal(head.lm_head.weight.detach(), rows) == stays_the_targets
    others = sum(p.numel() for name, p in head.named_parameters() if name not in ("lm_head.weight", "embed_tokens.weight"))
    assert summary.trained_parameters == others + (0 if stays_the_targets else rows.numel())
    other = "train" if lm_head == "frozen" else "frozen"
    with pytest.raises(TrainDraftError, match="lm_head"):
        run(options(tiny, tmp_path / "head", lm_head=other, resume=True), log=lambda *a: None)


@pytest.mark.parametrize("budget_s, timed", [(float("inf"), 7), (0.0, 1), (0.7, 4)])
def test_step_costs_stop_timing_once_their_budget_is_spent(budget_s, timed):
    """The summary's step costs (training/evaluate.py) time up to `repeats` forwards a point after two untimed
    ones, fewer once the timed ones have taken the point's budget, never none. A "forward" of 0.2 s (a sleep:
    0.1 s from either side of the 0.7 s budget after 3 and 4 of them) stops after the 4th."""
    from batchspec.training.evaluate import _median_ms

    calls = []
    ms = _median_ms(lambda: (calls.append(1), time.sleep(0.2)), lambda: None, 7, budget_s)
    assert len(calls) - 2 == timed and ms >= 200
