"""Structured output through jobs and run-batch: a job-wide schema and per-row constraints from columns,
OpenAI batch lines with response_format / vLLM's guided fields, and bad constraints as that row's error."""

from __future__ import annotations

import json

import jsonschema
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchspec.jobs.openai import request as fmt
from batchspec.jobs.openai import run_batch
from batchspec.engine.types import RowParams
from conftest_jobs import one_line_error, one_thread, read_output, run_inprocess, write_job  # noqa: F401 (fixtures)
from tiny import PROMPTS, build_tokenizer, save_model

openai = pytest.importorskip("openai", reason="the openai package checks the output's types")
from openai.types.chat import ChatCompletion  # noqa: E402

FLAG = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
PICK = {"type": "object", "properties": {"color": {"enum": ["red", "green"]}, "n": {"type": "integer", "maximum": 9}},
        "required": ["color", "n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory):
    """A tiny Llama with a byte-level tokenizer (the grammar library reads byte-level and SentencePiece
    vocabularies, as real models have) and a chat template."""
    tokenizer = build_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    path = tmp_path_factory.mktemp("byte-model") / "target"
    return save_model(path, "llama", tokenizer, seed=0, vocab_size=len(tokenizer) + 12)


def job_config(model, source: dict, **sampling) -> dict:
    return {"model": {"target": str(model), "dtype": "float32", "device": "cpu"}, "drafter": {"name": "ngram"},
            "sampling": {"max_new_tokens": 32, **sampling}, "source": source, "batch_size": 3,
            "progress": {"mode": "log"}}


def test_a_job_with_a_schema_and_per_row_constraints(byte_model, tmp_path, one_thread, monkeypatch, capsys):
    """sampling.json_schema for every row; row_params maps a schema column (JSON text) and a choice column;
    a row with a broken schema is that row's error, the others run."""
    rows = {"prompt": PROMPTS[:6],
            "schema": [None, json.dumps(PICK), None, "{broken", None, json.dumps(PICK)],
            "options": [None, None, json.dumps(["yes", "no"]), None, None, None]}
    pq.write_table(pa.table(rows), tmp_path / "in.parquet")
    write_job(tmp_path, "structured", job_config(
        byte_model, {"path": str(tmp_path / "in.parquet"),
                     "row_params": {"json_schema": "schema", "choice": "options"}}, json_schema=FLAG))
    code = run_inprocess(tmp_path, "job=structured", "output.dir=out", monkeypatch=monkeypatch)
    assert code == 0, capsys.readouterr().err
    out = {r["id"]: r for r in read_output(tmp_path / "out")}
    assert out["3"]["finish_reason"] == "error" and "json_schema is not valid JSON" in out["3"]["error"]
    assert out["2"]["completion"] in ("yes", "no") and out["2"]["structured_complete"]
    for i, schema in ((0, FLAG), (1, PICK), (4, FLAG), (5, PICK)):
        row = out[str(i)]
        assert row["structured_complete"] and row["finish_reason"] == "stop", row
        jsonschema.validate(json.loads(row["completion"]), schema)
        assert row["forced_tokens"] > 0  # the keys and braces the schema forces


def test_a_bad_job_wide_constraint_is_one_line(byte_model, tmp_path, monkeypatch, capsys):
    pq.write_table(pa.table({"prompt": PROMPTS[:2]}), tmp_path / "in.parquet")
    write_job(tmp_path, "bad", job_config(byte_model, {"path": str(tmp_path / "in.parquet")}, regex="[unclosed"))
    assert run_inprocess(tmp_path, "job=bad", "output.dir=out", monkeypatch=monkeypatch) != 0
    assert one_line_error(capsys).startswith("sampling.regex:")
    write_job(tmp_path, "two", job_config(byte_model, {"path": str(tmp_path / "in.parquet")}, regex="a",
                                          json_object=True))
    assert run_inprocess(tmp_path, "job=two", "output.dir=out2", monkeypatch=monkeypatch) != 0
    assert "set at most one of" in one_line_error(capsys)


# ---- OpenAI batch lines ------------------------------------------------------------------------------

def chat_line(custom_id: str, **body) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": fmt.CHAT_URL,
                       "body": {"messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 40,
                                "temperature": 0, **body}})


PARSED = [  # body fields -> RowParams' constraint
    (dict(response_format={"type": "json_object"}), dict(json_object=True)),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PICK, "strict": True}}),
     dict(json_schema=PICK)),
    (dict(response_format={"type": "text"}), dict()),
    (dict(guided_json=FLAG), dict(json_schema=FLAG)),
    (dict(guided_regex="[0-9]+"), dict(regex="[0-9]+")),
    (dict(guided_choice=["a", "b"]), dict(choice=("a", "b"))),
    (dict(guided_grammar='start: "x"'), dict(grammar='start: "x"')),
    (dict(structured_outputs={"choice": ["a"]}), dict(choice=("a",))),
    (dict(structured_outputs={"json": FLAG}), dict(json_schema=FLAG)),
]


@pytest.mark.parametrize("body, fields", PARSED)
def test_structured_body_fields(body, fields):
    parsed = fmt.parse_line(chat_line("a", **body), 1)
    assert parsed.error is None, parsed.error
    assert parsed.params.constraint() == RowParams(**fields).constraint()


BAD_BODIES = [
    (dict(response_format={"type": "yaml"}), "body.response_format="),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "p"}}), "json_schema.schema"),
    (dict(guided_regex="a", guided_choice=["b"]), "at most one structured output"),
    (dict(guided_choice=[]), "body.guided_choice: choice must be a non-empty list"),
    (dict(structured_outputs={"grammar": "x", "regex": "y"}), "at most one structured output"),
    (dict(structured_outputs={"structural_tag": "x"}), "structured_outputs.structural_tag is not supported"),
    (dict(guided_whitespace_pattern=" "), "body.guided_whitespace_pattern is not supported"),
    (dict(guided_json="{nope"), "body.guided_json: json_schema is not valid JSON"),
]


@pytest.mark.parametrize("body, words", BAD_BODIES)
def test_bad_structured_bodies(body, words):
    parsed = fmt.parse_line(chat_line("a", **body), 1)
    assert parsed.error is not None and words in parsed.error, parsed.error


def test_run_batch_with_response_format(byte_model, tmp_path, one_thread, capsys):
    """vLLM-style lines: the bodies are what the openai package's types accept, and their content parses
    against the line's schema; a grammar the library refuses is that line's error."""
    lines = [chat_line("schema", response_format={"type": "json_schema",
                                                   "json_schema": {"name": "pick", "schema": PICK, "strict": True}}),
             chat_line("object", response_format={"type": "json_object"}, max_tokens=60),
             chat_line("choice", guided_choice=["alpha", "beta"]),
             chat_line("regex", structured_outputs={"regex": "[0-9]{2}-[0-9]{2}"}),
             chat_line("broken", guided_regex="(unclosed"),
             chat_line("plain", max_tokens=5)]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    code = run_batch.main(["-i", str(inp), "-o", str(out), "--model", str(byte_model), "--dtype", "float32",
                           "--device", "cpu", "--batch-size", "3", "--max-seq-len", "128", "--drafter", "ngram"])
    assert code == 0, capsys.readouterr().err
    outputs = {o["custom_id"]: o for o in map(json.loads, out.read_text().splitlines())}
    assert "regex" in outputs["broken"]["error"]["message"]
    content = {}
    for name in ("schema", "object", "choice", "regex", "plain"):
        body = outputs[name]["response"]["body"]
        content[name] = ChatCompletion.model_validate(body).choices[0].message.content
    jsonschema.validate(json.loads(content["schema"]), PICK)
    assert content["choice"] in ("alpha", "beta")
    assert len(content["regex"]) == 5 and content["regex"][2] == "-"
    finish = outputs["object"]["response"]["body"]["choices"][0]["finish_reason"]
    if finish == "stop":
        assert isinstance(json.loads(content["object"]), dict)
    else:  # cut at max_tokens: the output is a prefix of some JSON object
        assert content["object"].startswith("{")


def test_a_job_over_openai_lines_honours_their_structured_output(byte_model, tmp_path, one_thread, monkeypatch,
                                                                 capsys):
    """source.format=openai: the same response_format / guided lines in a job give the same answers as
    run-batch (greedy), and the line with a refused regex is an error line."""
    lines = [chat_line("schema", response_format={"type": "json_schema",
                                                   "json_schema": {"name": "flag", "schema": FLAG}}),
             chat_line("choice", guided_choice=["alpha", "beta"]), chat_line("broken", guided_regex="(unclosed")]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "rb.jsonl"
    assert run_batch.main(["-i", str(tmp_path / "in.jsonl"), "-o", str(out), "--model", str(byte_model),
                           "--dtype", "float32", "--device", "cpu", "--batch-size", "3", "--max-seq-len", "128"]) == 0
    write_job(tmp_path, "ob", {"model": {"target": str(byte_model), "dtype": "float32", "device": "cpu"},
                               "source": {"path": "in.jsonl", "format": "openai", "prompt_column": None},
                               "output": {"format": "openai"}, "batch_size": 3, "max_seq_len": 128,
                               "progress": {"mode": "off"}})
    assert run_inprocess(tmp_path, "job=ob", monkeypatch=monkeypatch) == 0, capsys.readouterr().err
    mine = {o["custom_id"]: o for o in map(json.loads, (tmp_path / "outputs" / "ob" / "results.jsonl").read_text().splitlines())}
    theirs = {o["custom_id"]: o for o in map(json.loads, out.read_text().splitlines())}
    assert "regex" in mine["broken"]["error"]["message"]
    for name in ("schema", "choice"):
        content = mine[name]["response"]["body"]["choices"][0]["message"]["content"]
        assert content == theirs[name]["response"]["body"]["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(mine["schema"]["response"]["body"]["choices"][0]["message"]["content"]), FLAG)


def test_summary_and_report_keep_forced_drafts_apart(byte_model, tmp_path, one_thread, monkeypatch, capsys):
    """Issue 58 item 11: drafter none drafts nothing of its own, so its acceptance is no figure ('–'), not the
    0.9 of the drafts a grammar forced; forced drafts and the constrained rows' ends are shown apart."""
    from batchspec import report
    from test_report import Page

    rows = {"prompt": PROMPTS[:5], "schema": [None, None, "{broken", None, json.dumps(PICK)],
            "limit": [32, 32, 32, 3, 32]}
    pq.write_table(pa.table(rows), tmp_path / "in.parquet")
    config = job_config(byte_model, {"path": str(tmp_path / "in.parquet"),
                                     "row_params": {"json_schema": "schema", "max_new_tokens": "limit"}}, json_schema=FLAG)
    config["drafter"] = {"name": "none"}
    write_job(tmp_path, "forced", config)
    assert run_inprocess(tmp_path, "job=forced", "output.dir=out", monkeypatch=monkeypatch) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    out = read_output(tmp_path / "out")
    forced = sum(r["forced_tokens"] for r in out)
    assert forced > 0 and summary["forced_tokens"] == forced
    assert summary["forced_accepted"] == sum(r["forced_accepted"] for r in out) <= forced
    assert summary["draft_tokens"] == forced and summary["proposed_acceptance_rate"] is None
    assert summary["structured"] == {"rows": 5, "complete": 3, "cut": 1, "error": 0, "refused": 1}
    assert "structured output         5 rows: 3 complete, 1 cut short, 0 errors mid-row, 1 refused" in printed
    html = tmp_path / "report.html"
    assert report.main([str(tmp_path / "out"), "--html", str(html)]) == 0
    figures = Page(html.read_text()).figures()
    assert figures["acceptance"] == ["–"]
    share = summary["forced_accepted"] / forced
    assert figures["forced drafts (structured output): accepted / forced"] == [
        f"{summary['forced_accepted']} / {forced} ({share:.3f})"]
    assert figures["structured output rows"] == ["5: 3 complete, 1 cut short, 0 errors, 1 refused"]
