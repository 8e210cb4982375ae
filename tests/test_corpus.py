"""drafter.corpus (batchspec/sources/corpus.py): the newest rows up to the bound, read and tokenized from the newest
backwards (the same rows as tokenizing everything and keeping the newest), and one-line errors that name
the path and what is wrong with it (issue 34, items 6 and 7)."""

from __future__ import annotations

import codecs
import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from batchspec.sources import corpus as corpus_module
from batchspec.sources import corpus_read as corpus_read
from batchspec.sources.corpus import CorpusError, load_corpus
from batchspec.sources import open_source
from conftest_jobs import one_line_error, run_inprocess, tiny_job, tiny_models, write_job  # noqa: F401 (fixture)

DEMO = Path(__file__).resolve().parent.parent / "batchspec" / "assets" / "demo" / "target"
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex the jolly cat again".split()
TEXTS = [" ".join(WORDS[(3 * i + j) % len(WORDS)] for j in range(2 + (7 * i) % 11)) + ("" if i % 4 else " é ☃ 日本")
         for i in range(40)]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEMO)


class CountingTokenizer:
    """The tokenizer, counting the texts it was given."""

    def __init__(self, tokenizer):
        self.tokenizer, self.texts = tokenizer, 0

    def __call__(self, texts, **kw):
        self.texts += 1 if isinstance(texts, str) else len(texts)
        return self.tokenizer(texts, **kw)


def newest(lists, bound):
    """Keep the newest lists while fewer than `bound` tokens are kept (the last kept may pass it)."""
    if bound is None:
        return lists
    kept, total = [], 0
    for tokens in reversed(lists):
        if total >= bound:
            break
        kept.append(tokens)
        total += len(tokens)
    return kept[::-1]


def reference(path, tokenizer, bound, column=None):
    """Yesterday's loader: every row read forwards (the job's sources), each tokenized on its own, then the
    newest kept; an output folder's completion_token_ids read whole."""
    data = Path(path) / "data"
    if column is None and data.is_dir():
        table = pa.concat_tables([pq.read_table(p, columns=["completion_token_ids", "finish_reason"])
                                  for p in sorted(data.glob("*.parquet"))])
        lists = [ids for ids, reason in zip(table.column(0).to_pylist(), table.column(1).to_pylist())
                 if ids and reason != "error"]
        return newest(lists, bound)
    source = open_source(str(path), "auto", "train", {column or "text": "drafter.corpus"})
    texts = [v[column or "text"] for _, v in source.rows(0, 1, None) if isinstance(v, dict)]
    return newest([tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts if isinstance(t, str) and t],
                  bound)


def write_jsonl(path: Path, texts, *, bom=False, crlf=False, noise=True) -> Path:
    """Texts as JSONL lines, with blank lines, lines that are no object, an empty text and no final newline."""
    end = b"\r\n" if crlf else b"\n"
    lines = []
    for i, text in enumerate(texts):
        lines.append(json.dumps({"id": i, "text": text}, ensure_ascii=i % 2 == 0).encode())
        if noise and i % 9 == 3:
            lines += [b"", b"   ", b"[1, 2]", b"{not json", json.dumps({"id": -1, "text": ""}).encode(),
                      json.dumps({"id": -2}).encode()]
    data = end.join(lines)
    path.write_bytes((codecs.BOM_UTF8 if bom else b"") + data)
    return path


def write_parquet_folder(folder: Path, texts, files=3, row_group=4) -> Path:
    folder.mkdir(parents=True)
    per = -(-len(texts) // files)
    for f in range(files):
        chunk = texts[f * per:(f + 1) * per]
        pq.write_table(pa.table({"text": chunk + [None], "n": list(range(len(chunk) + 1))}),
                       folder / f"part-{f}.parquet", row_group_size=row_group)
    return folder


def write_output_folder(folder: Path, lists, parts=3, row_group=3) -> Path:
    """A batchspec output folder: data/ parts with completion_token_ids and finish_reason (error rows among them)."""
    (folder / "data").mkdir(parents=True)
    (folder / "job.json").write_text("{}")
    per = -(-len(lists) // parts)
    for p in range(parts):
        chunk = lists[p * per:(p + 1) * per]
        ids = chunk + [[9, 9, 9], []]
        reasons = ["length"] * len(chunk) + ["error", "stop"]
        pq.write_table(pa.table({"id": [str(i) for i in range(len(ids))], "completion_token_ids": ids,
                                 "finish_reason": reasons}),
                       folder / "data" / f"shard-00000-of-00001-part-{p:06d}.parquet", row_group_size=row_group)
    return folder


def bounds(lists):
    """Bounds smaller than one row, inside a row, at row boundaries, across several rows, the whole and more."""
    sizes = [len(t) for t in lists]
    total, last = sum(sizes), sizes[-1]
    return sorted({1, max(1, last - 1), last, last + 1, last + sizes[-2], last + sizes[-2] + 1, total // 3,
                   total // 2 + 5, total - 1, total, total + 1, 10 * total}) + [None]


INPUTS = ["jsonl", "jsonl-bom-crlf", "jsonl-gz", "parquet-folder", "parquet-file", "output-folder", "jsonl-folder",
          "saved-dataset"]


def make_input(kind: str, tmp_path: Path, tokenizer) -> tuple[str, str | None]:
    if kind == "jsonl":
        return str(write_jsonl(tmp_path / "texts.jsonl", TEXTS)), None
    if kind == "jsonl-bom-crlf":
        return str(write_jsonl(tmp_path / "texts.jsonl", TEXTS, bom=True, crlf=True)), None
    if kind == "jsonl-gz":
        plain = write_jsonl(tmp_path / "plain.jsonl", TEXTS)
        (tmp_path / "texts.jsonl.gz").write_bytes(gzip.compress(plain.read_bytes()))
        return str(tmp_path / "texts.jsonl.gz"), None
    if kind == "parquet-folder":
        return str(write_parquet_folder(tmp_path / "texts", TEXTS)), None
    if kind == "jsonl-folder":  # read as a stream (datasets' json builder)
        (tmp_path / "texts").mkdir()
        write_jsonl(tmp_path / "texts" / "a.jsonl", TEXTS[:25], noise=False)
        write_jsonl(tmp_path / "texts" / "b.jsonl", TEXTS[25:], noise=False)
        return str(tmp_path / "texts"), None
    if kind == "saved-dataset":
        import datasets

        datasets.Dataset.from_dict({"completion": TEXTS[:3] + [""] + TEXTS[3:]}).save_to_disk(tmp_path / "saved")
        return str(tmp_path / "saved"), "completion"
    if kind == "parquet-file":
        pq.write_table(pa.table({"body": TEXTS}), tmp_path / "texts.parquet", row_group_size=5)
        return str(tmp_path / "texts.parquet"), "body"
    lists = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    return str(write_output_folder(tmp_path / "out", lists)), None


@pytest.mark.parametrize("kind", INPUTS)
def test_the_newest_rows_are_those_of_tokenizing_everything(kind, tmp_path, tokenizer, monkeypatch):
    """Read backwards in small blocks (so that lines and UTF-8 characters straddle them) and tokenized in
    chunks, the corpus keeps exactly the rows the whole-corpus reference keeps, for every bound."""
    monkeypatch.setattr(corpus_read, "BLOCK_BYTES", 7)
    monkeypatch.setattr(corpus_module, "FIRST_CHUNK", 2)
    monkeypatch.setattr(corpus_read, "SLICE_ROWS", 2)
    path, column = make_input(kind, tmp_path, tokenizer)
    everything = reference(path, tokenizer, None, column)
    assert len(everything) == len(TEXTS)
    for bound in bounds(everything):
        assert load_corpus(path, tokenizer, column=column, max_tokens=bound) == reference(path, tokenizer, bound,
                                                                                          column), bound


def test_the_default_block_size_gives_the_same_rows(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "texts.jsonl", TEXTS * 30)
    everything = reference(path, tokenizer, None)
    for bound in (1, 500, sum(map(len, everything)) - 3, None):
        assert load_corpus(str(path), tokenizer, max_tokens=bound) == reference(path, tokenizer, bound)


@pytest.mark.parametrize("kind", ["jsonl", "jsonl-gz", "parquet-folder"])
def test_only_the_newest_rows_are_tokenized(kind, tmp_path, tokenizer):
    """The work is bounded by max_tokens, not by the corpus: a bound of a few rows tokenizes a few chunks."""
    if kind == "jsonl":
        path = str(write_jsonl(tmp_path / "big.jsonl", TEXTS * 50))
    elif kind == "jsonl-gz":
        plain = write_jsonl(tmp_path / "p.jsonl", TEXTS * 50)
        (tmp_path / "big.jsonl.gz").write_bytes(gzip.compress(plain.read_bytes()))
        path = str(tmp_path / "big.jsonl.gz")
    else:
        path = str(write_parquet_folder(tmp_path / "big", TEXTS * 50, files=5, row_group=64))
    counting = CountingTokenizer(tokenizer)
    got = load_corpus(path, counting, max_tokens=100)
    assert got == reference(path, tokenizer, 100)
    assert counting.texts <= 4 * len(got) + 16, (counting.texts, len(got))  # of 2,000 rows
    counting.texts = 0
    assert len(load_corpus(path, counting)) == len(TEXTS) * 50  # unbounded: every row


def test_token_ids_are_read_from_the_newest_part_backwards(tmp_path, tokenizer, monkeypatch):
    """An output folder's token ids need no tokenizing, and a small bound reads only the newest row groups."""
    lists = [[i, i + 1, i + 2] for i in range(300)]
    folder = write_output_folder(tmp_path / "out", lists, parts=6, row_group=10)
    read = []
    original = pq.ParquetFile.read_row_group
    monkeypatch.setattr(pq.ParquetFile, "read_row_group",
                        lambda self, i, **kw: read.append(i) or original(self, i, **kw))

    def no_tokenizer(*a, **kw):
        raise AssertionError("token ids are not tokenized")

    assert load_corpus(str(folder), no_tokenizer, max_tokens=7) == lists[-3:]
    assert read == [5, 4]  # the last part's last two row groups (the last holds an error row and an empty one)
    assert load_corpus(str(folder), no_tokenizer) == lists


def test_a_parquet_file_with_token_ids_gives_them(tmp_path, tokenizer):
    pq.write_table(pa.table({"completion_token_ids": [[1, 2], [3], []], "completion": ["x", "y", "z"]}),
                   tmp_path / "rows.parquet")
    assert load_corpus(str(tmp_path / "rows.parquet"), tokenizer) == [[1, 2], [3]]


def test_text_that_is_not_utf8_is_skipped(tmp_path, tokenizer):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"text": "good one"}\n{"text": "bad \xff byte"}\n{"text": "good two"}\n')
    assert load_corpus(str(path), tokenizer) == [tokenizer(t, add_special_tokens=False)["input_ids"]
                                                 for t in ("good one", "good two")]


# ---- errors: one line, naming the path and what is wrong ------------------------------------------------


def _txt_folder(tmp_path):
    for i in range(3):
        (tmp_path / "notes" / f"{i}.txt").parent.mkdir(exist_ok=True)
        (tmp_path / "notes" / f"{i}.txt").write_text("some text")
    (tmp_path / "notes" / "table.csv").write_text("a,b\n1,2\n")
    return tmp_path / "notes"


def _empty_folder(tmp_path):
    (tmp_path / "nothing").mkdir()
    return tmp_path / "nothing"


def _unsupported_file(tmp_path):
    (tmp_path / "notes.txt").write_text("some text")
    return tmp_path / "notes.txt"


def _no_column_jsonl(tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"prompt": "a", "answer": "b"}\n')
    return tmp_path / "rows.jsonl"


def _no_column_parquet(tmp_path):
    pq.write_table(pa.table({"prompt": ["a"], "score": [1]}), tmp_path / "rows.parquet")
    return tmp_path / "rows.parquet"


def _empty_texts(tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"text": ""}\n{"text": null}\n\n')
    return tmp_path / "rows.jsonl"


def _empty_file(tmp_path):
    (tmp_path / "rows.jsonl").write_text("\n")
    return tmp_path / "rows.jsonl"


def _only_error_rows(tmp_path):
    return write_output_folder(tmp_path / "out", [], parts=1)


def _output_without_parts(tmp_path):
    (tmp_path / "out" / "data").mkdir(parents=True)
    (tmp_path / "out" / "job.json").write_text("{}")
    return tmp_path / "out"


ERRORS = [
    ("missing", lambda tmp_path: tmp_path / "outputs" / "last-week", r"=\S*outputs/last-week does not exist"),
    ("txt-folder", _txt_folder,
     r"notes is a folder with no Parquet or JSONL files \(it holds 3 \.txt files, 1 \.csv file\)"),
    ("empty-folder", _empty_folder, r"nothing is an empty folder"),
    ("unsupported-file", _unsupported_file, r"notes\.txt is a file of an unsupported kind \(\.txt\)"),
    ("no-column-jsonl", _no_column_jsonl,
     r"rows\.jsonl: no completion_token_ids and no text column to read: it has the columns prompt, answer; "
     r"the corpus reads completion_token_ids or a text column \(completion, text\)"),
    ("no-column-parquet", _no_column_parquet, r"rows\.parquet: no completion_token_ids and no text column to read: "
                                              r"it has the columns prompt, score"),
    ("empty-texts", _empty_texts, r"rows\.jsonl: the corpus is empty: no row has a non-empty text in column 'text'"),
    ("empty-file", _empty_file, r"rows\.jsonl: the corpus is empty: the file has no rows"),
    ("only-error-rows", _only_error_rows, r"out: the corpus is empty: none of the 2 rows of its 1 Parquet file\(s\) "
                                          r"has completion_token_ids"),
    ("output-without-parts", _output_without_parts, r"out is a batchspec output folder without output rows"),
    ("no-glob-match", lambda tmp_path: tmp_path / "*.parquet", r"\*\.parquet matches no files"),
]


@pytest.mark.parametrize("make,pattern", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_errors_say_what_is_wrong_in_one_line(make, pattern, tmp_path, tokenizer, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    path = str(make(tmp_path))
    with pytest.raises(CorpusError, match=pattern) as caught:
        load_corpus(path, tokenizer)
    message = str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert "\n" not in message and message.startswith(f"drafter.corpus={path}"), message


def test_a_named_column_that_is_missing(tmp_path, tokenizer):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"text": "a"}\n')
    with pytest.raises(CorpusError, match=r"it has the columns text; the corpus reads the column 'body'"):
        load_corpus(str(path), tokenizer, column="body")


def test_a_job_reports_a_bad_corpus_as_a_one_line_setup_error(tmp_path, tiny_models, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    pq.write_table(pa.table({"text": ["the quick brown fox", "hello world"]}), tmp_path / "in.parquet")
    write_job(tmp_path, "c", tiny_job(tiny_models, {"path": "in.parquet", "prompt_column": "text"}))
    _txt_folder(tmp_path)
    assert run_inprocess(tmp_path, "job=c", "drafter=suffix", "drafter.corpus=outputs/old",
                         monkeypatch=monkeypatch) == 2
    assert one_line_error(capsys) == "drafter.corpus=outputs/old does not exist (no such file or folder)"
    assert run_inprocess(tmp_path, "job=c", "drafter=suffix", "drafter.corpus=notes", monkeypatch=monkeypatch) == 2
    assert "drafter.corpus=notes is a folder with no Parquet or JSONL files (it holds 3 .txt files, 1 .csv file)" \
        in one_line_error(capsys)
