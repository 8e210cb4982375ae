"""Sources: Parquet / HF datasets / JSONL read in chunks, sharding, resume skipping, prompt building."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchspec.sources.prompts import PromptBuilder, template_columns
from batchspec.sources import Row, RowSelector, SourceError, detect_format, open_source, shard_from_env
from conftest_jobs import build_tokenizer

N = 25


def texts(n=N):
    return [f"prompt number {i}" for i in range(n)]


@pytest.fixture
def parquet_folder(tmp_path):
    """N rows over three files in a folder (with a hidden file and a non-Parquet file that must be ignored)."""
    folder = tmp_path / "pq"
    (folder / "sub").mkdir(parents=True)
    t = pa.table({"text": texts(), "key": [f"k{i}" for i in range(N)], "n": list(range(N)),
                  "unused": ["x" * 100] * N})
    pq.write_table(t.slice(0, 10), folder / "a.parquet", row_group_size=4)
    pq.write_table(t.slice(10, 10), folder / "b.parquet")
    pq.write_table(t.slice(20), folder / "sub" / "c.parquet")
    pq.write_table(t.slice(0, 3), folder / "_ignored.parquet")
    (folder / "notes.txt").write_text("not data")
    return folder


def all_rows(source, index=0, count=1, limit=None):
    return list(source.rows(index, count, limit))


def test_parquet_folder_file_and_glob_positions(parquet_folder):
    needed = {"text": "source.prompt_column"}
    folder = open_source(str(parquet_folder), "auto", "train", needed)
    assert folder.num_rows == N and folder.typed
    rows = all_rows(folder)
    assert [p for p, _ in rows] == list(range(N))
    assert [v["text"] for _, v in rows] == texts()
    assert set(rows[0][1]) == {"text"}  # only the needed column is read
    one = open_source(str(parquet_folder / "b.parquet"), "parquet", "train", needed)
    assert [v["text"] for _, v in all_rows(one)] == texts()[10:20]
    globbed = open_source(str(parquet_folder / "**" / "?.parquet"), "auto", "train", needed)  # a, b, sub/c
    assert [v["text"] for _, v in all_rows(globbed)] == texts()
    assert detect_format(str(parquet_folder)) == "parquet"


def test_missing_column_lists_available(parquet_folder):
    with pytest.raises(SourceError) as e:
        open_source(str(parquet_folder), "auto", "train", {"prompt": "source.prompt_column"})
    msg = str(e.value)
    assert "source.prompt_column" in msg and "'prompt'" in msg and "text, key, n, unused" in msg
    assert "\n" not in msg


def test_unreadable_inputs(tmp_path):
    with pytest.raises(SourceError, match="does not exist"):
        open_source(str(tmp_path / "nope.parquet"), "auto", "train", {"text": "source.prompt_column"})
    bad = tmp_path / "bad.parquet"
    bad.write_text("this is not parquet")
    with pytest.raises(SourceError, match="cannot read Parquet file .*bad.parquet"):
        open_source(str(bad), "auto", "train", {"text": "source.prompt_column"})
    with pytest.raises(SourceError, match="cannot open .* as a Hugging Face dataset"):
        open_source(str(tmp_path / "no-such-dataset"), "hf", "train", {"text": "source.prompt_column"})


@pytest.mark.parametrize("count", [1, 2, 3])
def test_shards_partition_the_input_and_limit_comes_first(parquet_folder, count):
    source = open_source(str(parquet_folder), "auto", "train", {"text": "source.prompt_column"})
    for limit in (None, 11):
        shards = [[p for p, _ in all_rows(source, i, count, limit)] for i in range(count)]
        union = sorted(p for shard in shards for p in shard)
        assert union == list(range(N if limit is None else limit))  # every row exactly once
        assert all(p % count == i for i, shard in enumerate(shards) for p in shard)


def test_shard_from_env():
    assert shard_from_env(None, None, {}) == (0, 1)
    assert shard_from_env(None, None, {"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "4"}) == (2, 4)
    one_based = {"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_COUNT": "4"}
    assert shard_from_env(None, None, one_based) == (3, 4)
    assert shard_from_env(1, 2, one_based) == (1, 2)  # the config wins
    with pytest.raises(SourceError, match="shard.index=2 shard.count=2"):
        shard_from_env(2, 2, {})


def test_row_selector_skips_done_and_duplicate_ids(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": texts(6), "key": ["a", "b", None, "b", "c", "d"]}), path)
    source = open_source(str(path), "auto", "train", {"text": "source.prompt_column", "key": "source.id_column"})
    selector = RowSelector(source, id_column="key", shard_index=0, shard_count=1, limit=None, done={"c"})
    rows = list(selector)
    assert [r.id for r in rows] == ["a", "b", "\x00row-2", "d"]
    assert rows[2].error == "source.id_column 'key' is null in row 2"
    assert (selector.total, selector.skipped, selector.duplicates) == (6, 2, 1)
    positional = RowSelector(source, id_column=None, shard_index=1, shard_count=2, limit=None, done={"3"})
    assert [r.id for r in positional] == ["1", "5"] and positional.total == 3
    assert (positional.skipped, positional.duplicates) == (1, 0)


def test_position_ids_need_increasing_positions():
    class Shuffled:
        num_rows = 3

        def rows(self, index, count, limit):
            yield from [(0, {"text": "a"}), (2, {"text": "b"}), (1, {"text": "c"})]

    selector = RowSelector(Shuffled(), id_column=None, shard_index=0, shard_count=1, limit=None, done=set())
    with pytest.raises(RuntimeError, match="position 1 after 2"):
        list(selector)


def test_jsonl_lines_blank_bad_and_gzip(tmp_path):
    lines = [json.dumps({"text": "first", "tag": 1}), "", "{not json", json.dumps(["a", "list"]),
             json.dumps({"text": "last", "tag": 2})]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    zipped = tmp_path / "in.jsonl.gz"
    zipped.write_bytes(gzip.compress(path.read_bytes()))
    for p in (path, zipped):
        source = open_source(str(p), "auto", "train", {"text": "source.prompt_column", "tag": "source.keep_columns"})
        assert source.num_rows == 4 and not source.typed and source.schema.field("tag").type == pa.int64()
        rows = all_rows(source)
        assert rows[0] == (0, {"text": "first", "tag": 1})
        assert rows[1][0] == 1 and rows[1][1].startswith("line 3 is not valid JSON")
        assert rows[2] == (2, "line 4 is a JSON list, not an object")
        assert rows[3] == (3, {"text": "last", "tag": 2})
    with pytest.raises(SourceError, match="available columns: text, tag"):
        open_source(str(path), "jsonl", "train", {"question": "source.template"})


def test_hf_saved_dataset_and_dict_and_local_load_dataset(tmp_path):
    import datasets

    ds = datasets.Dataset.from_dict({"text": texts(), "n": list(range(N))})
    ds.save_to_disk(tmp_path / "saved")
    datasets.DatasetDict({"train": ds, "test": ds.select(range(3))}).save_to_disk(tmp_path / "dict")
    needed = {"text": "source.prompt_column"}
    saved = open_source(str(tmp_path / "saved"), "auto", "train", needed)
    assert saved.num_rows == N and saved.typed
    assert [v["text"] for _, v in all_rows(saved, 1, 2, 9)] == [texts()[i] for i in (1, 3, 5, 7)]
    test_split = open_source(str(tmp_path / "dict"), "hf", "test", needed)
    assert [v["text"] for _, v in all_rows(test_split)] == texts()[:3]
    with pytest.raises(SourceError, match="source.split='validation' is not a split .* splits: train, test"):
        open_source(str(tmp_path / "dict"), "hf", "validation", needed)
    # A plain folder of JSON lines opened with load_dataset(streaming=True): length unknown.
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "part.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(5)))
    streamed = open_source(str(tmp_path / "raw"), "hf", "train", needed)
    assert streamed.num_rows is None and not streamed.typed
    assert [v["text"] for _, v in all_rows(streamed, 0, 2)] == [texts()[i] for i in (0, 2, 4)]


# ---- prompts -----------------------------------------------------------------------------------


def request(builder, values, row_id="r"):
    return builder.request(Row(row_id, 0, values))


def test_prompt_column_values():
    b = PromptBuilder(prompt_column="p", template=None, chat=False, keep_columns=["k"])
    ok = request(b, {"p": "hello", "k": 7})
    assert (ok.prompt, ok.error, ok.extra) == ("hello", None, {"k": 7, "position": 0})  # position: the row's index
    assert request(b, {"p": [5, 6, 7]}).prompt == [5, 6, 7]  # pre-tokenized
    assert request(b, {"p": None}).error == "source.prompt_column 'p' is null"
    assert request(b, {"p": 3}).error == "source.prompt_column 'p' holds a int, not a string"
    assert request(b, {"p": {"a": 1}}).error == "source.prompt_column 'p' holds a dict, not a string"
    assert request(b, {"p": ""}).prompt == ""  # the generator reports "prompt is empty"
    broken = b.request(Row("x", 4, error="line 5 is not valid JSON"))
    assert broken.error == "line 5 is not valid JSON" and broken.prompt is None


def test_template_renders_and_reports_missing_fields():
    template = "Q: {{ question }}{% if hint %} (hint: {{ hint }}){% endif %}\nA:"
    assert template_columns(template) == ["hint", "question"]
    b = PromptBuilder(prompt_column=None, template=template, chat=False)
    assert request(b, {"question": "why?", "hint": "x"}).prompt == "Q: why? (hint: x)\nA:"
    missing = request(b, {"hint": "x"})
    assert missing.prompt is None and missing.error == "source.template: 'question' is undefined (null or missing in this row)"
    assert "'question' is undefined" in request(b, {"question": None, "hint": "x"}).error
    with pytest.raises(SourceError, match=r"source.template: .*\(line 1\)"):
        template_columns("{{ question ")


def test_template_is_sandboxed(tmp_path):
    marker = tmp_path / "pwned"
    attack = "{{ cycler.__init__.__globals__.os.system('touch " + str(marker) + "') }}"
    b = PromptBuilder(prompt_column=None, template=attack, chat=False)
    r = request(b, {})
    assert r.error is not None and r.error.startswith("source.template:")
    assert not marker.exists()
    dunder = PromptBuilder(prompt_column=None, template="{{ x.__class__.__mro__ }}", chat=False)
    assert request(dunder, {"x": "s"}).error.startswith("source.template:")


def test_chat_messages():
    tok = build_tokenizer()
    b = PromptBuilder(prompt_column="messages", template=None, chat=True, tokenizer=tok)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]
    expected = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    r = request(b, {"messages": messages})
    assert r.prompt == expected and r.error is None
    assert tok.convert_ids_to_tokens(r.prompt)[:2] == ["<s>", "<|system|>"]  # BOS once, from the template
    assert tok.convert_ids_to_tokens(r.prompt)[-1] == "<|assistant|>"  # add_generation_prompt
    wrapped = request(b, {"messages": "hello world"})  # a plain string is one user message
    assert wrapped.prompt == tok.apply_chat_template([{"role": "user", "content": "hello world"}],
                                                     add_generation_prompt=True, tokenize=True, return_dict=False)
    assert request(b, {"messages": []}).error == "chat messages must be a non-empty list, got list"
    assert request(b, {"messages": [{"content": "x"}]}).error == "chat message 0 has no string 'role'"
    assert request(b, {"messages": ["hi"]}).error == "chat message 0 is a str, not a {role, content} object"
    assert request(b, {"messages": [{"role": "user", "content": None}]}).error == "chat message 0 has no string 'content'"
    templated = PromptBuilder(prompt_column=None, template="what {{ w }}", chat=True, tokenizer=tok)
    assert tok.decode(request(templated, {"w": "hello"}).prompt).endswith("what hello <|assistant|>")


def test_chat_needs_a_chat_template():
    tok = build_tokenizer()
    tok.chat_template = None
    with pytest.raises(SourceError, match="no chat template"):
        PromptBuilder(prompt_column="m", template=None, chat=True, tokenizer=tok)


def test_inferred_keep_types_are_checked_per_row():
    b = PromptBuilder(prompt_column="p", template=None, chat=False, keep_columns=["n"],
                      keep_schema=pa.schema([("n", pa.int64())]), check_columns=["n"])
    assert request(b, {"p": "x", "n": 3}).error is None
    assert request(b, {"p": "x", "n": None}).error is None
    assert request(b, {"p": "x", "n": "three"}).error == "keep column 'n': 'three' is not of the column's type int64"
