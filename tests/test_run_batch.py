"""`batchspec run-batch`: OpenAI batch files in and out (batchspec/jobs/openai/).

Parsing and formatting as tables; then runs on the tiny Llama of conftest_jobs (it has a chat template):
chat and completion lines, n=2, logprobs, a bad line of each kind, the openai package's own types,
resume after a kill and after SIGTERM (twice, while writing, as srun sends it), --retry-errors, settings
that change refused, and greedy output equal to batchspec.generate's. run-batch runs through the job
runner, so its kill tests reach into the job's sink (jobs/sink.py).
"""

from __future__ import annotations

import json
import subprocess
import time
import sys
from pathlib import Path

import pytest

from batchspec.jobs.openai import request as fmt
from batchspec.jobs.openai import response as ofmt
from batchspec.jobs.openai import run_batch
from batchspec.engine.types import Result, RowParams
from conftest_jobs import REPO, cli_env, one_thread, run_inprocess, tiny_models  # noqa: F401 (fixtures)

openai = pytest.importorskip("openai", reason="the openai package checks the output's types")
from openai.types import BatchError, Completion  # noqa: E402
from openai.types.chat import ChatCompletion  # noqa: E402

CHAT, COMP = fmt.CHAT_URL, fmt.COMPLETIONS_URL


def line(custom_id="a", url=COMP, **body) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


# ---- parsing ---------------------------------------------------------------------------------------------

PARSED = [  # (input line, expected: RowParams fields and prompt / messages)
    (line(prompt="hi"), dict(prompt="hi", params=RowParams(temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, stop=(),
                                                             n=1))),
    (line(prompt=[5, 6], max_tokens=3, temperature=0, stop="x", seed=7, logprobs=2),
     dict(prompt=[5, 6], params=RowParams(max_new_tokens=3, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0,
                                          stop=("x",), seed=7, n=1, logprobs=2))),
    (line(prompt=["one"], n=3, top_p=0.5, stop=["a", "", "b"], top_k=-1),
     dict(prompt="one", params=RowParams(temperature=1.0, top_p=0.5, top_k=0, min_p=0.0, stop=("a", "b"), n=3))),
    (line(url=CHAT, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=4, max_tokens=9,
          logprobs=True, top_logprobs=3),
     dict(messages=[{"role": "user", "content": "hi"}],
          params=RowParams(max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, stop=(), n=1,
                           logprobs=3))),
    (line(url=CHAT, messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
          logprobs=False, model="ignored", user="ignored", frequency_penalty=0),
     dict(messages=[{"role": "user", "content": "ab"}],
          params=RowParams(temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, stop=(), n=1))),
]


@pytest.mark.parametrize("text, expected", PARSED)
def test_parse_line(text, expected):
    parsed = fmt.parse_line(text, 4)
    assert parsed.error is None and parsed.number == 4 and parsed.custom_id == "a"
    for name, value in expected.items():
        assert getattr(parsed, name) == value, name


BAD = [  # (input line, custom_id in the result, words of the error)
    ("{not json", None, "not valid JSON"),
    (b'{"custom_id": "a\xff"}', None, "not valid UTF-8"),
    ("[1, 2]", None, "not a JSON object"),
    (json.dumps({"url": COMP, "body": {"prompt": "x"}}), None, "no custom_id"),
    (json.dumps({"custom_id": 5, "url": COMP, "body": {"prompt": "x"}}), None, "custom_id must be"),
    (json.dumps({"custom_id": "\ud800", "url": COMP, "body": {"prompt": "x"}}), None, "custom_id must be"),
    (json.dumps({"custom_id": "a", "method": "GET", "url": COMP, "body": {}}), "a", "only POST"),
    (json.dumps({"custom_id": "a", "url": "/v1/embeddings", "body": {}}), "a", "url '/v1/embeddings'"),
    (json.dumps({"custom_id": "a", "url": COMP}), "a", "no body"),
    (json.dumps({"custom_id": "a", "url": COMP, "body": "x"}), "a", "body must be an object"),
    (line(prompt="x\ud800"), "a", "not valid Unicode"),
    (line(), "a", "body.prompt must be"),
    (line(prompt=""), "a", "body.prompt is empty"),
    (line(prompt=["a", "b"]), "a", "several prompts"),
    (line(url=CHAT), "a", "body.messages must be"),
    (line(url=CHAT, messages=[{"content": "x"}]), "a", "messages[0] must be an object with a string role"),
    (line(url=CHAT, messages=[{"role": "user", "content": [{"type": "image_url"}]}]), "a", "only text parts"),
    (line(url=CHAT, messages=[{"role": "user", "content": 3}]), "a", "messages[0].content"),
    (line(prompt="x", temperature=-1), "a", "body.temperature=-1.0"),
    (line(prompt="x", temperature=0.001), "a", "body.temperature"),
    (line(prompt="x", temperature="hot"), "a", "body.temperature='hot': need a number"),
    (line(prompt="x", top_p=0), "a", "body.top_p"),
    (line(prompt="x", top_k=-5), "a", "body.top_k=-5: need -1 or 0 (off)"),
    (line(prompt="x", max_tokens=0), "a", "body.max_tokens=0"),
    (line(prompt="x", max_tokens=2.0), "a", "body.max_tokens=2.0: need an integer"),
    (line(prompt="x", n=True), "a", "body.n=True: need an integer"),
    (line(prompt="x", n=2, temperature=0), "a", "identical copies"),
    (line(prompt="x", stop=[1]), "a", "body.stop must be"),
    (line(prompt="x", logprobs=21), "a", "body.logprobs=21"),
    (line(prompt="x", logprobs=True), "a", "body.logprobs=True: need an integer"),
    (line(url=CHAT, messages=[{"role": "user", "content": "x"}], logprobs=2), "a", "need true or false"),
    (line(url=CHAT, messages=[{"role": "user", "content": "x"}], top_logprobs=2), "a", "needs body.logprobs=true"),
    (line(url=CHAT, messages=[{"role": "user", "content": "x"}], logprobs=True, top_logprobs=30), "a",
     "body.top_logprobs=30"),
    (line(prompt="x", presence_penalty=0.5), "a", "body.presence_penalty is not supported"),
    (line(prompt="x", stream=True), "a", "body.stream is not supported"),
    (line(prompt="x", echo=True), "a", "body.echo is not supported"),
    (line(prompt="x", best_of=3), "a", "body.best_of"),
    (line(prompt="x", prompt_logprobs=1), "a", "body.prompt_logprobs is not supported"),
]


@pytest.mark.parametrize("text, custom_id, words", BAD)
def test_bad_lines(text, custom_id, words):
    parsed = fmt.parse_line(text, 9)
    assert parsed.custom_id == custom_id and words in parsed.error, parsed.error


def test_max_tokens_defaults():
    chat = fmt.parse_line(line(url=CHAT, messages=[{"role": "user", "content": "x"}]), 1)
    comp = fmt.parse_line(line(prompt="x"), 2)
    assert fmt.with_defaults(chat, 300).max_new_tokens == 300  # chat: what the context holds
    assert fmt.with_defaults(comp, 300).max_new_tokens == fmt.COMPLETIONS_MAX_TOKENS == 16
    assert fmt.with_defaults(fmt.parse_line(line(prompt="x", max_tokens=5), 3), 300).max_new_tokens == 5


# ---- formatting ------------------------------------------------------------------------------------------


def fake_result(i: int, tokens: list[int], *, logprobs: bool = True, finish="stop", error=None) -> Result:
    words = {1: "a", 2: " b", 3: " c", 4: "</s>"}
    return Result(id="a", prompt="", completion="".join(words[t] for t in tokens if t != 4), completion_token_ids=tokens,
                  finish_reason=finish, error=error, prompt_tokens=3, completion_tokens=len(tokens),
                  target_forwards=2, draft_tokens=4, accepted_tokens=2, acceptance_rate=0.5,
                  tokens_per_forward=len(tokens) / 2, accepted_per_round=[0, 2], drafts_per_round=[0, 4],
                  tree_per_round=["", ""], latency_s=0.25, sample_index=i, stop_reason=4 if finish == "stop" else None,
                  logprobs=[-0.5] * len(tokens) if logprobs else None,
                  top_logprobs=[[-0.5, -1.5]] * len(tokens) if logprobs else None,
                  top_logprob_ids=[[t, 3] for t in tokens] if logprobs else None)


def decode(ids):
    return "".join({1: "a", 2: " b", 3: " c", 4: "</s>"}[t] for t in ids)


@pytest.mark.parametrize("url", [CHAT, COMP])
def test_format_output_validates(url):
    parsed = fmt.BatchLine(7, "a", url)
    results = [fake_result(1, [2, 3], finish="length"), fake_result(0, [1, 2, 4])]
    out = ofmt.format_output(parsed, results, key="k", model="m", created=5, decode=decode, drafter="ngram")
    assert out["custom_id"] == "a" and out["error"] is None and out["response"]["status_code"] == 200
    body = out["response"]["body"]
    typed = (ChatCompletion if url == CHAT else Completion).model_validate(body)
    assert [c.index for c in typed.choices] == [0, 1]
    assert [c.finish_reason for c in typed.choices] == ["stop", "length"]
    assert typed.usage.prompt_tokens == 3 and typed.usage.completion_tokens == 5 and typed.usage.total_tokens == 8
    assert body["choices"][0]["stop_reason"] == 4
    stats = body["batchspec"]
    assert stats["drafter"] == "ngram" and stats["target_forwards"] == 4 and stats["draft_tokens"] == 8
    assert stats["accepted_tokens"] == 4 and stats["acceptance_rate"] == 0.5 and stats["tokens_per_forward"] == 5 / 4
    assert len(stats["samples"]) == 2
    if url == CHAT:
        assert typed.choices[0].message.content == "a b"
        content = typed.choices[0].logprobs.content
        assert [c.token for c in content] == ["a", " b", "</s>"] and content[1].bytes == list(b" b")
        assert [t.token for t in content[0].top_logprobs] == ["a", " c"]
    else:
        assert typed.choices[0].text == "a b"
        lp = typed.choices[1].logprobs
        assert lp.tokens == [" b", " c"] and lp.text_offset == [0, 2] and lp.top_logprobs[0] == {" b": -0.5, " c": -1.5}
    assert json.loads(ofmt.dumps(out)) == out


def test_format_without_logprobs_and_errors():
    parsed = fmt.BatchLine(3, "a", COMP)
    out = ofmt.format_output(parsed, [fake_result(0, [1], logprobs=False)], key="k", model="m", created=1,
                            decode=decode, drafter="none")
    assert out["response"]["body"]["choices"][0]["logprobs"] is None and "samples" not in out["response"]["body"]["batchspec"]
    failed = ofmt.format_output(parsed, [fake_result(0, [], error="prompt too long", finish="error")], key="k",
                               model="m", created=1, decode=decode, drafter="none")
    assert ofmt.is_error(failed) and failed["response"]["status_code"] == 400
    assert failed["error"] == {"code": "invalid_request", "message": "prompt too long", "line": 3}
    assert BatchError.model_validate(failed["error"]).line == 3
    assert failed["response"]["body"]["error"]["message"] == "prompt too long"
    assert ofmt.line_key("abc", 3) == ofmt.line_key("abc", 3) != ofmt.line_key("abc", 4)


# ---- runs on a tiny model --------------------------------------------------------------------------------

MESSAGES = [{"role": "user", "content": "hello world"}]


def good_lines() -> list[str]:
    return [
        line("chat-greedy", CHAT, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2),
        line("comp-n2", COMP, prompt="the quick brown fox", max_tokens=5, n=2, logprobs=1, seed=3),
        line("chat-n2", CHAT, messages=MESSAGES, max_completion_tokens=4, n=2, temperature=0.8, stop=["dog"]),
        line("comp-greedy", COMP, prompt="def add ( x , y )", max_tokens=7, temperature=0),
        line("comp-ids", COMP, prompt=[0, 10, 11, 12], max_tokens=3, temperature=0.5, top_p=0.9),
        line("chat-default", CHAT, messages=MESSAGES),
    ]


def bad_lines() -> list[str]:
    return [
        "{this is not json",  # no custom_id
        line("bad-url", "/v1/embeddings", input="x"),
        json.dumps({"custom_id": "no-body", "method": "POST", "url": COMP}),
        line("bad-value", COMP, prompt="x", temperature=-2),
        line("comp-n2", COMP, prompt="x"),  # a duplicate custom_id
        line("too-long", COMP, prompt="the " * 200),  # the engine refuses it: longer than max_seq_len
    ]


def write_input(path: Path, texts: list[str]) -> Path:
    path.write_text("\n".join(texts) + "\n\n")  # a blank line is skipped
    return path


def args_for(models, inp: Path, out: Path, *extra: str) -> list[str]:
    return ["-i", str(inp), "-o", str(out), "--model", str(models.target), "--dtype", "float32", "--device", "cpu",
            "--batch-size", "3", "--max-seq-len", "96", *extra]


def read_lines(path: Path) -> list[dict]:
    return [json.loads(text) for text in path.read_text().splitlines()]


def stable(outputs: list[dict], drafting: bool = True) -> list[dict]:
    """The outputs without what may differ between runs: the time made, latency (and without `drafting`,
    the drafting statistics: a resume may change the drafter)."""
    outputs = json.loads(json.dumps(outputs))
    for o in outputs:
        body = (o["response"] or {}).get("body", {})
        body.pop("created", None)
        if not drafting:
            body.pop("batchspec", None)
        for stats in [body.get("batchspec", {}), *body.get("batchspec", {}).get("samples", [])]:
            stats.pop("latency_s", None)
    return outputs


def differences(a, b, path="") -> list[str]:
    """Where two JSON values differ (floats within 1e-5 are the same)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and abs(a - b) <= 1e-5:
        return []
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


@pytest.fixture
def inputs(tmp_path):
    return write_input(tmp_path / "in.jsonl", good_lines() + bad_lines())


def test_run_batch_end_to_end(tiny_models, inputs, tmp_path, one_thread, monkeypatch, capsys):
    out = tmp_path / "out.jsonl"
    code = run_inprocess(tmp_path, "run-batch", *args_for(tiny_models, inputs, out, "--draft", str(tiny_models.draft)),
                         monkeypatch=monkeypatch)  # through the console script's dispatch
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"wrote {out}: 12 lines, 6 errors" in err
    outputs = read_lines(out)
    assert [o["custom_id"] for o in outputs] == ["chat-greedy", "comp-n2", "chat-n2", "comp-greedy", "comp-ids",
                                                 "chat-default", None, "bad-url", "no-body", "bad-value", "comp-n2",
                                                 "too-long"]
    assert len({o["id"] for o in outputs}) == 12
    by_id = {o["custom_id"]: o for o in outputs[:6]}
    for o in outputs:
        validate_batch_output(o)
    for o in outputs[:6]:
        assert o["error"] is None and o["response"]["status_code"] == 200
    errors = [o["error"] for o in outputs[6:]]
    assert errors[0]["line"] == 7 and "not valid JSON" in errors[0]["message"]
    assert "url" in errors[1]["message"] and "no body" in errors[2]["message"]
    assert "body.temperature" in errors[3]["message"] and "duplicate custom_id 'comp-n2' (first on line 2)" in errors[4]["message"]
    assert "max_seq_len" in errors[5]["message"] and errors[5]["line"] == 12

    chat = ChatCompletion.model_validate(by_id["chat-greedy"]["response"]["body"])
    assert chat.object == "chat.completion" and chat.model == str(tiny_models.target) and len(chat.choices) == 1
    assert chat.usage.completion_tokens == len(chat.choices[0].logprobs.content) <= 6
    assert all(len(t.top_logprobs) == 2 for t in chat.choices[0].logprobs.content)
    comp = Completion.model_validate(by_id["comp-n2"]["response"]["body"])
    assert [c.index for c in comp.choices] == [0, 1] and comp.choices[0].text != comp.choices[1].text
    assert all(len(c.logprobs.tokens) == len(c.logprobs.top_logprobs) for c in comp.choices)
    chat2 = ChatCompletion.model_validate(by_id["chat-n2"]["response"]["body"])
    assert len(chat2.choices) == 2 and chat2.choices[0].logprobs is None
    default = ChatCompletion.model_validate(by_id["chat-default"]["response"]["body"])
    usage, finish = default.usage, default.choices[0].finish_reason  # no max_tokens: up to the context's end
    assert usage.completion_tokens > 16 and (usage.total_tokens == 96 if finish == "length" else finish == "stop")
    stats = by_id["comp-greedy"]["response"]["body"]["batchspec"]
    # adaptive speculation (on by default) decides from timing whether this row drafts: the statistics agree
    assert stats["drafter"] == "model" and stats["target_forwards"] >= 1
    assert 0 <= stats["accepted_tokens"] <= stats["draft_tokens"] <= 4 * stats["target_forwards"]
    assert set(stats) >= {"target_forwards", "draft_tokens", "accepted_tokens", "acceptance_rate", "tokens_per_forward"}

    # A rerun of a finished file is a no-op that loads no model, and leaves the output as it was, byte for
    # byte, in a later second too (`created` is when the newest part was written, not when the file was).
    before = out.read_text()
    time.sleep(1.1)
    assert run_batch.main(args_for(tiny_models, inputs, out, "--draft", str(tiny_models.draft))) == 0
    assert "nothing to do" in capsys.readouterr().err and out.read_text() == before
    # --retry-errors: the start line counts lines, not the Parquet rows of their samples (two lines have n=2).
    assert run_batch.main(args_for(tiny_models, inputs, out, "--draft", str(tiny_models.draft), "--retry-errors")) == 0
    assert "6 rows to do (6 already done)" in capsys.readouterr().err
    assert [o["custom_id"] for o in read_lines(out)] == [json.loads(t)["custom_id"] for t in before.splitlines()]


def validate_batch_output(o: dict) -> None:
    assert set(o) == {"id", "custom_id", "response", "error"}
    typed = getattr(openai.types, "BatchRequestOutput", None)  # in the openai packages that have it
    if typed is not None:
        typed.model_validate(o)
    if o["error"] is not None:
        BatchError.model_validate(o["error"])
        assert o["response"]["status_code"] == 400 and o["response"]["body"]["error"]["message"] == o["error"]["message"]
        return
    body = o["response"]["body"]
    (ChatCompletion if body["object"] == "chat.completion" else Completion).model_validate(body)


def parts_of(out: Path) -> Path:
    return out.with_name(out.name + ".parts")


def done_lines(out: Path) -> set[str]:
    """The ids of the lines finished in the work folder's parts (made-up ids for lines without one)."""
    from batchspec.jobs.layout import done_ids
    return done_ids(parts_of(out))


class Spy:
    """Records the id of every line the job runner turns into a request (what a run actually ran)."""

    def __init__(self, monkeypatch):
        from batchspec.jobs.openai import batch as openai_batch

        self.ids, real = [], openai_batch.OpenAIRequests.request

        def request(builder, row):
            self.ids.append(row.id)
            return real(builder, row)

        monkeypatch.setattr(openai_batch.OpenAIRequests, "request", request)


def test_resume_after_a_kill(tiny_models, inputs, tmp_path, one_thread, monkeypatch, capsys):
    """Killed after its second part: a rerun (other drafter, other batch size) runs only the lines not in
    a part, and the output equals an uninterrupted run's, every line once."""
    from batchspec.jobs.sink import ParquetSink

    whole = tmp_path / "whole.jsonl"
    assert run_batch.main(args_for(tiny_models, inputs, whole)) == 0

    out = tmp_path / "out.jsonl"
    monkeypatch.setattr(run_batch, "FLUSH_LINES", 2)
    real_flush, flushes = ParquetSink.flush, []

    def flush_then_die(self, metadata=None):
        if len(flushes) == 2:
            raise RuntimeError("killed")
        flushes.append(len(self.buffer))
        return real_flush(self, metadata)

    monkeypatch.setattr(ParquetSink, "flush", flush_then_die)
    with pytest.raises(RuntimeError, match="killed"):
        run_batch.main(args_for(tiny_models, inputs, out, "--batch-size", "2", "--drafter", "ngram"))
    monkeypatch.setattr(ParquetSink, "flush", real_flush)
    done = done_lines(out)
    assert not out.exists() and 2 <= len(done) < 12, done

    spy = Spy(monkeypatch)
    capsys.readouterr()
    # The drafter and batch size may change on a resume (they change no output line); the rest may not.
    assert run_batch.main(args_for(tiny_models, inputs, out, "--batch-size", "3")) == 0
    assert f"{12 - len(done)} rows to do ({len(done)} already done)" in capsys.readouterr().err
    assert sorted(spy.ids) == sorted(done_lines(out) - done) and len(spy.ids) == 12 - len(done)
    # Tokens are the same; logprobs agree to float noise (another batch, drafter or verify width).
    assert differences(stable(read_lines(out), drafting=False), stable(read_lines(whole), drafting=False)) == []
    assert [o["custom_id"] for o in read_lines(out)].count("comp-n2") == 2  # the line and its duplicate, once each


def send_after_first_row(monkeypatch, signals: list[int], *, while_writing: bool = False) -> list[int]:
    """Send `signals` to this process once the first row is added to the sink (with `while_writing`: from
    inside the first part's write, after the part is in data/, as srun's doubled SIGTERM may arrive)."""
    import os
    from batchspec.jobs import sink as sink_module

    sent: list[int] = []

    def fire():
        if not sent:
            sent.extend(signals)
            for s in signals:
                os.kill(os.getpid(), s)

    if while_writing:
        real_write = sink_module.write_part

        def write_then_signal(table, tmp, final):
            real_write(table, tmp, final)
            fire()
        monkeypatch.setattr(sink_module, "write_part", write_then_signal)
    else:
        real_add = sink_module.ParquetSink.add

        def add_then_signal(self, result):
            real_add(self, result)
            fire()
        monkeypatch.setattr(sink_module.ParquetSink, "add", add_then_signal)
    return sent


def test_sigterm_finishes_the_lines_in_flight(tiny_models, inputs, tmp_path, one_thread, monkeypatch, capsys):
    """SIGTERM: no new lines, the ones in flight are finished and written, exit 143; a rerun completes."""
    import signal

    out = tmp_path / "out.jsonl"
    send_after_first_row(monkeypatch, [signal.SIGTERM])
    before = signal.getsignal(signal.SIGTERM)
    assert run_batch.main(args_for(tiny_models, inputs, out, "--batch-size", "2")) == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before and not out.exists()
    err = capsys.readouterr().err
    assert "finishing the rows in flight" in err and "rerun the same command to resume" in err
    done = done_lines(out)
    assert 1 <= len(done) < 12
    monkeypatch.undo()
    assert run_batch.main(args_for(tiny_models, inputs, out)) == 0
    assert f"{12 - len(done)} rows to do ({len(done)} already done)" in capsys.readouterr().err
    assert len(read_lines(out)) == 12


SIGNALS_WHILE_WRITING = {  # the signals, sent from inside a part's write -> whether the run stops at once
    "SIGTERM twice (srun's pattern)": (("SIGTERM", "SIGTERM"), False),  # one request: finish the lines in flight
    "SIGTERM, then SIGINT": (("SIGTERM", "SIGINT"), True),  # a second signal: stop once the part is written
}


@pytest.mark.parametrize("case", list(SIGNALS_WHILE_WRITING))
def test_signals_while_writing(tiny_models, inputs, tmp_path, one_thread, monkeypatch, capsys, case):
    """Signals arriving while a part is written (FLUSH_LINES 1; issue 34 item 11, issue 33's srun target):
    SIGTERM twice is one request; a second, different signal stops right after the write. Either way the
    part being written is kept whole, and the rerun completes the file with every line once. (Two SIGTERMs
    sent together may reach the process as one; tests/test_commands.py::test_the_second_signal_rule spaces
    them out.)"""
    import signal

    names, stops_now = SIGNALS_WHILE_WRITING[case]
    whole = tmp_path / "whole.jsonl"
    assert run_batch.main(args_for(tiny_models, inputs, whole)) == 0
    out = tmp_path / "out.jsonl"
    monkeypatch.setattr(run_batch, "FLUSH_LINES", 1)
    sent = send_after_first_row(monkeypatch, [getattr(signal, n) for n in names], while_writing=True)
    # Two signals sent together are handled in signal-number order (SIGINT first): the status is the first's.
    code = run_batch.main(args_for(tiny_models, inputs, out, "--batch-size", "2"))
    assert code == 128 + min(getattr(signal, n) for n in names)
    assert sent and ("stopping now" in capsys.readouterr().err) == stops_now
    done = done_lines(out)
    assert 1 <= len(done) < 12
    monkeypatch.undo()
    spy = Spy(monkeypatch)
    assert run_batch.main(args_for(tiny_models, inputs, out)) == 0
    assert len(spy.ids) == 12 - len(done) and not set(spy.ids) & done
    assert differences(stable(read_lines(out), drafting=False), stable(read_lines(whole), drafting=False)) == []


def test_resume_refuses_other_settings(tiny_models, inputs, tmp_path, one_thread, monkeypatch, capsys):
    out = tmp_path / "out.jsonl"
    write_input(inputs, bad_lines()[:3])  # no line needs the model
    assert run_batch.main(args_for(tiny_models, inputs, out)) == 0
    capsys.readouterr()
    assert run_batch.main(args_for(tiny_models, inputs, out, "--seed", "1")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "seed 0 -> 1" in err and "delete" in err
    write_input(inputs, bad_lines()[:2])
    assert run_batch.main(args_for(tiny_models, inputs, out)) == 2
    assert "input_sha256" in capsys.readouterr().err
    # An output file made elsewhere (no work folder) is not overwritten.
    other = tmp_path / "other.jsonl"
    other.write_text("mine\n")
    assert run_batch.main(args_for(tiny_models, inputs, other)) == 2
    assert "has no work folder" in capsys.readouterr().err and other.read_text() == "mine\n"
    # A work folder of run-batch before it ran through the job runner: refused in one line that says how.
    old = tmp_path / "old.jsonl"
    parts_of(old).mkdir()
    (parts_of(old) / "part-000001.jsonl").write_text('{"line": 1, "output": {}}\n')
    assert run_batch.main(args_for(tiny_models, inputs, old)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "older batchspec run-batch" in err[0] and "delete" in err[0]


def test_retry_errors(tiny_models, tmp_path, one_thread, capsys):
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    inp = write_input(tmp_path / "in.jsonl", [line("ok", COMP, prompt="hello", max_tokens=3, temperature=0),
                                              line("bad", COMP, prompt="x", n=0)])
    out = tmp_path / "out.jsonl"
    assert run_batch.main(args_for(tiny_models, inp, out)) == 0
    first = read_lines(out)
    # Pretend "ok" failed for a passing reason (its part row becomes an error).
    for part in (parts_of(out) / "data").glob("*.parquet"):
        table = pq.read_table(part)
        ok = pc.equal(table.column("id"), "ok")
        for name, value in (("finish_reason", "error"), ("error", "out of memory")):
            column = pc.if_else(ok, pa.scalar(value, table.schema.field(name).type), table.column(name))
            table = table.set_column(table.schema.get_field_index(name), name, column)
        pq.write_table(table, part)
    assert run_batch.main(args_for(tiny_models, inp, out)) == 0
    assert read_lines(out)[0]["error"]["message"] == "out of memory"  # without the flag: kept as it is
    capsys.readouterr()
    assert run_batch.main(args_for(tiny_models, inp, out, "--retry-errors")) == 0
    err = capsys.readouterr().err
    assert "2 rows to do (0 already done)" in err
    assert "retry_errors: 1 of the 2 retried id(s) failed again: 'bad': body.n=0" in err  # issue 34, item 14
    assert stable(read_lines(out)) == stable(first)
    assert "body.n=0" in read_lines(out)[1]["error"]["message"]


def test_greedy_equals_generate(tiny_models, tmp_path, one_thread):
    from batchspec import generate
    from transformers import AutoTokenizer

    prompts = ["the quick brown fox", "def add ( x , y ) :", "hello world", "one two three"]
    chats = [[{"role": "user", "content": p}] for p in prompts[:2]]
    texts = ([line(f"p{i}", COMP, prompt=p, max_tokens=8, temperature=0, logprobs=0) for i, p in enumerate(prompts)]
             + [line(f"c{i}", CHAT, messages=m, max_tokens=8, temperature=0) for i, m in enumerate(chats)])
    inp, out = write_input(tmp_path / "in.jsonl", texts), tmp_path / "new" / "folder" / "out.jsonl"
    assert run_batch.main(args_for(tiny_models, inp, out, "--draft", str(tiny_models.draft))) == 0  # folder made
    tokenizer = AutoTokenizer.from_pretrained(tiny_models.target)
    chat_ids = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False)
                for m in chats]
    expected = generate(prompts + chat_ids, target=str(tiny_models.target), dtype="float32", device="cpu",
                        temperature=0, max_new_tokens=8, max_seq_len=96, batch_size=2, logprobs=0)
    outputs = read_lines(out)
    assert len(outputs) == len(expected) == 6
    for o, r in zip(outputs, expected):
        body = o["response"]["body"]
        choice = body["choices"][0]
        assert choice.get("text", (choice.get("message") or {}).get("content")) == r.completion
        assert choice["finish_reason"] == r.finish_reason and body["usage"]["completion_tokens"] == r.completion_tokens
        if "text" in choice:
            assert choice["logprobs"]["token_logprobs"] == pytest.approx(r.logprobs, abs=1e-4)


def test_setup_errors_exit_2(tiny_models, tmp_path, capsys):
    inp = write_input(tmp_path / "in.jsonl", [line("a", COMP, prompt="hello")])
    out = tmp_path / "out.jsonl"
    cases = [
        (["-i", str(tmp_path / "missing.jsonl"), "-o", str(out), "--model", str(tiny_models.target)], "no such input file"),
        (["-i", str(inp), "-o", str(inp / "out.jsonl"), "--model", "x"], "cannot make the output file's folder"),
        (["-i", str(inp), "-o", str(out), "--model", str(tmp_path / "nope")], "no such local directory"),
        (["-i", str(inp), "-o", str(out), "--model", str(tiny_models.target), "--drafter", "model"], "needs --draft"),
        (["-i", str(inp), "-o", str(out), "--model", str(tiny_models.target), "--drafter", "ngram", "--k", "0"],
         "drafts nothing"),
        (["-i", str(inp), "-o", str(out), "--model", str(tiny_models.not_a_model)], "cannot load model"),
        (["-i", str(inp), "-o", str(tmp_path / "o2.jsonl"), "--model", str(tiny_models.target), "--max-seq-len", "9999",
          "--device", "cpu"], "exceeds"),
    ]
    for argv, words in cases:
        assert run_batch.main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert words in err[-1] and err[-1].startswith("batchspec run-batch: error:"), err
    from batchspec.jobs.locks import ShardLock

    held = tmp_path / "held.jsonl"
    parts_of(held).mkdir()
    with ShardLock(parts_of(held), 0, 1):  # another run holds the work folder's lock
        assert run_batch.main(["-i", str(inp), "-o", str(held), "--model", str(tiny_models.target)]) == 2
        assert "another run-batch is writing" in capsys.readouterr().err


def test_python_dash_m(tmp_path):
    """`python -m batchspec.run_batch` is the same command (one line, exit 2, for a missing input)."""
    done = subprocess.run([sys.executable, "-m", "batchspec.run_batch", "-i", str(tmp_path / "x.jsonl"), "-o",
                           str(tmp_path / "y.jsonl"), "--model", "m"], cwd=tmp_path, env=cli_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == (
        f"batchspec run-batch: error: no such input file {str(tmp_path / 'x.jsonl')!r}")



DEMO = REPO / "batchspec" / "assets" / "demo"


@pytest.mark.skipif(not (DEMO / "target").is_dir(), reason="demo assets not built")
def test_the_documented_example(tmp_path, one_thread, capsys):
    """docs/run_batch.md's example on the demo pair: its output is as the doc shows it."""
    out = tmp_path / "example.jsonl"
    assert run_batch.main(["-i", str(REPO / "docs" / "run_batch_example.jsonl"), "-o", str(out), "--model",
                           str(DEMO / "target"), "--draft", str(DEMO / "draft")]) == 0
    assert "4 lines, 1 errors" in capsys.readouterr().err
    outputs = read_lines(out)
    for o in outputs:
        validate_batch_output(o)
    assert [o["custom_id"] for o in outputs] == ["chat-sum", "chat-sampled", "complete-repr", "too-hot"]
    assert len(outputs[1]["response"]["body"]["choices"]) == 2 and outputs[3]["error"]["line"] == 4
    doc = (REPO / "docs" / "run_batch.md").read_text()
    first = outputs[0]["response"]["body"]
    assert f'"id": "{outputs[0]["id"]}"' in doc and f'"id": "{outputs[3]["id"]}"' in doc
    assert json.dumps(first["usage"]) in doc and first["choices"][0]["message"]["content"].startswith("#\n#\n#\n")


def test_the_job_runner_reads_and_writes_the_same_files(tiny_models, tmp_path, one_thread, monkeypatch, capsys):
    """source.format=openai and output.format=openai: a job over an OpenAI batch input file writes the
    answers run-batch writes (the same text, logprobs and finish per line, in input order), as Parquet
    parts and results.jsonl; a line that cannot run is an error line; a rerun resumes as any job does."""
    from conftest_jobs import write_job

    texts = good_lines() + bad_lines()  # a repeated custom_id included: its error line is in results.jsonl
    inp = write_input(tmp_path / "in.jsonl", texts)
    out = tmp_path / "out.jsonl"
    assert run_batch.main(args_for(tiny_models, inp, out)) == 0
    expected = read_lines(out)
    write_job(tmp_path, "ob", {
        "model": {"target": str(tiny_models.target), "dtype": "float32", "device": "cpu"},
        "source": {"path": "in.jsonl", "format": "openai", "prompt_column": None},
        "output": {"format": "openai"}, "batch_size": 3, "max_seq_len": 96, "progress": {"mode": "off"},
    })
    assert run_inprocess(tmp_path, "job=ob", monkeypatch=monkeypatch) == 0, capsys.readouterr().err
    got = read_lines(tmp_path / "outputs" / "ob" / "results.jsonl")
    assert [o["custom_id"] for o in got] == [o["custom_id"] for o in expected]
    for mine, theirs in zip(got, expected):
        validate_batch_output(mine)
        assert (mine["error"] is None) == (theirs["error"] is None), (mine, theirs)
        if mine["error"] is None:
            a, b = mine["response"]["body"], theirs["response"]["body"]
            assert [c.get("text", c.get("message")) for c in a["choices"]] == \
                [c.get("text", c.get("message")) for c in b["choices"]]
            assert not differences([c["logprobs"] for c in a["choices"]], [c["logprobs"] for c in b["choices"]])
            assert a["usage"] == b["usage"]
    assert run_inprocess(tmp_path, "job=ob", monkeypatch=monkeypatch) == 0  # nothing to do, file rewritten
    assert [o["custom_id"] for o in read_lines(tmp_path / "outputs" / "ob" / "results.jsonl")] == \
        [o["custom_id"] for o in expected]
    assert run_inprocess(tmp_path, "job=ob", "output.dir=pq", "output.format=parquet", "source.format=jsonl",
                         monkeypatch=monkeypatch) == 2  # a plain JSONL job over these lines has no prompt column


BAD_FOR_JOBS_TOO = [  # (input line, the error message's words): run-batch is a job, so jobs refuse these too
    (json.dumps({"custom_id": "get", "method": "GET", "url": COMP, "body": {"prompt": "x"}}), "only POST"),
    (json.dumps({"custom_id": 7, "method": "POST", "url": COMP, "body": {"prompt": "x"}}), "custom_id must be"),
    (line("big-chat", CHAT, messages=[{"role": "user", "content": "x" * 64 * 97}]), "far more than max_seq_len=96"),
    (line("big-prompt", COMP, prompt="x" * 64 * 97), "far more than max_seq_len=96"),
]


def test_lines_refused_as_run_batch_refused_them(tiny_models, tmp_path, one_thread, capsys):
    """Issue 34 items 2 and 4: a method other than POST, a custom_id that is not a string, and a chat or
    completion prompt far larger than max_seq_len tokens hold (checked by size before tokenizing) are error
    lines; a JSON array instead of JSON Lines (item 5) is refused in one line."""
    texts = [text for text, _ in BAD_FOR_JOBS_TOO] + [line("ok", COMP, prompt="hello", max_tokens=2, temperature=0)]
    inp, out = write_input(tmp_path / "in.jsonl", texts), tmp_path / "out.jsonl"
    assert run_batch.main(args_for(tiny_models, inp, out)) == 0
    outputs = read_lines(out)
    assert len(outputs) == len(texts) and outputs[-1]["error"] is None
    for o, (_, words) in zip(outputs, BAD_FOR_JOBS_TOO):
        validate_batch_output(o)
        assert words in o["error"]["message"], o["error"]
    assert outputs[1]["custom_id"] is None
    array = tmp_path / "array.json"
    array.write_text(json.dumps([json.loads(t) for t in texts], indent=2))
    capsys.readouterr()
    assert run_batch.main(args_for(tiny_models, array, tmp_path / "array.out.jsonl")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds a JSON array, not JSON Lines" in err[0]


def test_a_job_resumed_over_a_changed_input_answers_the_input_as_it_is(tiny_models, tmp_path, one_thread, monkeypatch,
                                                                        capsys):
    """output.format=openai: rows are keyed by custom_id, so a rerun over a changed input keeps what it already
    ran; results.jsonl then holds one line per line of the input as it is now, in its order: lines no longer
    in it are left out (their rows stay in the Parquet parts), moved lines take their new place."""
    from conftest_jobs import write_job

    def lines(*ids):
        return [line(i, COMP, prompt=f"say {i}", max_tokens=3, temperature=0) for i in ids]

    write_input(tmp_path / "in.jsonl", lines("a", "b", "c"))
    write_job(tmp_path, "ob", {
        "model": {"target": str(tiny_models.target), "dtype": "float32", "device": "cpu"},
        "source": {"path": "in.jsonl", "format": "openai", "prompt_column": None},
        "output": {"format": "openai"}, "batch_size": 2, "max_seq_len": 96, "progress": {"mode": "off"},
    })
    assert run_inprocess(tmp_path, "job=ob", monkeypatch=monkeypatch) == 0, capsys.readouterr().err
    results = tmp_path / "outputs" / "ob" / "results.jsonl"
    first = {o["custom_id"]: o for o in read_lines(results)}
    assert list(first) == ["a", "b", "c"]
    write_input(tmp_path / "in.jsonl", lines("c", "d", "a"))
    assert run_inprocess(tmp_path, "job=ob", monkeypatch=monkeypatch) == 0, capsys.readouterr().err
    got = read_lines(results)
    assert [o["custom_id"] for o in got] == ["c", "d", "a"]
    for o in got:
        validate_batch_output(o)
        assert o["error"] is None
    assert got[0]["response"]["body"]["choices"] == first["c"]["response"]["body"]["choices"]  # not run again
    assert len(got) == len({o["id"] for o in got})
