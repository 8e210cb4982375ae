"""`python -m batchspec.report`: a page built from real small jobs (one job, a two-member sweep), checked
for its tables, numbers and embedded images; the config in the Parquet metadata; hive-readable sweep
folders; and the page rendered by a headless chromium where one is installed, showing every plot the
terminal summary counts."""

from __future__ import annotations

import base64
import glob
import json
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from batchspec import report
from batchspec.jobs.cli import sweep_subdir
from batchspec.jobs.schema import CONFIG_KEY
from batchspec.report import data
from conftest_jobs import REPO, WORDS, run_inprocess, tiny_job, tiny_models, write_job  # noqa: F401 (fixture)

PROMPTS = [" ".join(WORDS[(5 * i + j) % len(WORDS)] for j in range(4 + i % 7)) for i in range(9)]
BAD_ROW_ERROR = "source.prompt_column 'text' is null"


@pytest.fixture(scope="module")
def jobs(tiny_models, tmp_path_factory) -> Path:
    """In one folder: `one` (drafter model, k 3, 10 rows of which one fails) and `sweep` (drafter ngram,
    -m drafter.k=1,3: two members of the 9 good rows), each run as `python -m batchspec` runs."""
    import torch

    root = tmp_path_factory.mktemp("report-jobs")
    pq.write_table(pa.table({"text": PROMPTS + [None]}), root / "in.parquet")
    write_job(root, "rep", tiny_job(tiny_models, {"path": "in.parquet", "prompt_column": "text"}))
    pq.write_table(pa.table({"text": PROMPTS}), root / "good.parquet")
    write_job(root, "sw", tiny_job(tiny_models, {"path": "good.parquet", "prompt_column": "text"}))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as mp:
            assert run_inprocess(root, "job=rep", "drafter=model", "drafter.k=3", "output.dir=one",
                                 monkeypatch=mp) == 0
            assert run_inprocess(root, "-m", "job=sw", "drafter=ngram", "drafter.k=1,3", "output.dir=sweep",
                                 monkeypatch=mp) == 0
    finally:
        torch.set_num_threads(threads)
    return root


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


class Page(HTMLParser):
    """The tables (rows of cell texts; a <br> in a header becomes a newline) and images of a page."""

    def __init__(self, text: str):
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.images: list[str] = []
        self.figure_count = 0  # <figure> elements: a plot each
        self.cell: list[str] | None = None
        self.best: list[str] = []  # texts of highlighted cells
        self.highlight = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.cell, self.highlight = [], "best" in (attrs.get("class") or "")
        elif tag == "br" and self.cell is not None:
            self.cell.append("\n")
        elif tag == "img":
            self.images.append(attrs["src"])
        elif tag == "figure":
            self.figure_count += 1

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            text = "".join(self.cell).strip()
            self.tables[-1][-1].append(text)
            if self.highlight:
                self.best.append(text)
            self.cell = None

    def handle_data(self, text):
        if self.cell is not None:
            self.cell.append(text)

    def figures(self) -> dict[str, list[str]]:
        """The figures table (the first with a 'figure' header): figure -> values, one per output."""
        table = next(t for t in self.tables if t[0][0] == "figure")
        return {row[0]: row[1:] for row in table[1:]}


def printed_plots(printed: str) -> int:
    """The plots the terminal summary says the page holds (0: tables only)."""
    first = printed.splitlines()[0]
    if "(tables only: " in first:
        return 0
    return int(re.fullmatch(r".* \((\d+) plots\)", first).group(1))


def assert_plots_on_page(text: str, printed: str) -> int:
    """Every plot the summary counts is on the written page: as many <img> elements, each in a <figure>
    of its own, and as many lines holding an <img> (a line-by-line reader of the file, grep -c, counts
    the same). Returns the count."""
    count, page = printed_plots(printed), Page(text)
    assert len(page.images) == page.figure_count == count, (len(page.images), page.figure_count, count)
    assert sum("<img" in line for line in text.splitlines()) == text.count("<img") == count
    return count


def png_images(page: Page) -> list[bytes]:
    prefix = "data:image/png;base64,"
    assert all(src.startswith(prefix) for src in page.images), "every image is embedded"
    return [base64.b64decode(src[len(prefix):]) for src in page.images]


def test_one_job_report(jobs, capsys):
    out, html = jobs / "one", jobs / "one.html"
    s = summary(out)
    assert report.main([str(out), "--html", str(html)]) == 0
    printed = capsys.readouterr().out
    text = html.read_text()
    page = Page(text)
    figures = page.figures()

    assert figures["rows"] == ["10"] and figures["errors"] == ["1"]
    assert figures["tokens/s"] == [f"{s['tokens_per_s']:.1f}"]
    assert figures["tokens per target forward"] == [f"{s['tokens_per_target_forward']:.2f}"]
    assert figures["acceptance"] == [f"{s['acceptance_rate']:.3f}"]
    assert figures["acceptance by position"] == [" ".join(f"{a:.2f}" for a in s["acceptance_by_position"])]
    assert figures["shards finished"] == ["1/1"]
    assert "model k=3 fixed, greedy, batch 3" in text
    # Errors by reason, with the message of the failed row.
    tables = {t[0][0]: t for t in page.tables}
    assert sorted(tables["finish reason"][1:]) == sorted([r, str(n)] for r, n in s["finish_reasons"].items())
    assert tables["error (most frequent first)"][1][1] == "1"
    assert BAD_ROW_ERROR in tables["error (most frequent first)"][1][0]
    # Best and worst drafting requests: real rows, ranked by tokens per forward.
    rows = {r["id"]: r for r in pads.dataset(out / "data").to_table().to_pylist()}
    ranked = [t for t in page.tables if t[0][:2] == ["id", "tokens/forward"]]
    best, worst = ranked[0][1:], ranked[1][1:]
    drafted = sum(r["draft_tokens"] > 0 and r["finish_reason"] != "error" for r in rows.values())
    assert drafted >= 7 and len(best) == 5 and len(worst) == min(5, drafted - 5)  # none listed twice
    assert {r[0] for r in best}.isdisjoint(r[0] for r in worst)
    for row in best + worst:
        assert row[1] == f"{rows[row[0]]['tokens_per_forward']:.2f}"
    assert float(best[-1][1]) >= float(worst[-1][1])
    # Six plots, embedded as PNG; nothing fetched from elsewhere.
    images = png_images(page)
    assert len(images) == 6 and all(i.startswith(b"\x89PNG") and len(i) > 5000 for i in images)
    assert not re.search(r"(src|href)=\"(https?:|//)", text) and "<script" not in text and "<link" not in text
    assert "no cost curve" in text
    # The terminal summary.
    assert printed.splitlines()[0] == f"batchspec report: 1 output -> {html} (6 plots)"
    assert assert_plots_on_page(text, printed) == 6
    assert f"  tokens per target forward    {s['tokens_per_target_forward']:.2f}" in printed


def test_sweep_report_side_by_side(jobs, capsys):
    sweep = jobs / "sweep"
    members = ["drafter.k=1/drafter=ngram", "drafter.k=3/drafter=ngram"]
    assert report.main([str(sweep)]) == 0  # a folder without data/: every output below it
    printed = capsys.readouterr().out
    html = sweep / "compare.html"
    page = Page(html.read_text())
    assert assert_plots_on_page(html.read_text(), printed) == 7
    figures = page.figures()
    header = next(t for t in page.tables if t[0][0] == "figure")[0]
    assert header == ["figure", f"{members[0]}\nngram k=1 fixed", f"{members[1]}\nngram k=3 fixed"]
    summaries = [summary(sweep / m) for m in members]
    assert figures["rows"] == ["9", "9"]
    assert figures["tokens/s"] == [f"{s['tokens_per_s']:.1f}" for s in summaries]
    assert figures["tokens per target forward"] == [f"{s['tokens_per_target_forward']:.2f}" for s in summaries]
    fastest = max(summaries, key=lambda s: s["tokens_per_s"])
    assert f"{fastest['tokens_per_s']:.1f}" in page.best
    assert len(png_images(page)) == 7  # the six, overlaid, and throughput by configuration
    lines = printed.splitlines()
    assert lines[0] == f"batchspec report: 2 outputs -> {html} (7 plots)"
    assert [line.split()[:3] for line in lines[2:4]] == [[members[0], "ngram", "k=1"], [members[1], "ngram", "k=3"]]


def test_predicted_speedup_from_a_cost_curve(jobs):
    sweep, member = jobs / "sweep", jobs / "sweep" / "drafter.k=3" / "drafter=ngram"
    curve = {"drafter": "ngram", "context_tokens": 20,
             "curves": {"3": {"target_ms": [10.0, 12.0, 13.0, 15.0], "draft_ms": 0.0},
                        "16": {"target_ms": [30.0, 31.0, 40.0, 45.0], "draft_ms": 0.0}}}
    (sweep / "calibrate.json").write_text(json.dumps(curve))
    try:
        outs, html, printed = report.build_report([sweep], jobs / "sweep.html")
        s = summary(member)
        rounds = {k: n for k, n in enumerate(s["rounds_by_k"]) if n}
        mean_ms = sum(n * curve["curves"]["3"]["target_ms"][k] for k, n in rounds.items()) / sum(rounds.values())
        expected = s["tokens_per_target_forward"] * 10.0 / mean_ms
        assert outs[1].prediction["speedup"] == pytest.approx(expected)
        assert f"{expected:.2f}" in Page(html.read_text()).figures()["predicted speedup vs plain decoding"]
        assert f"{expected:.2f}" in printed
        # The same curve as bench --json writes it; a model drafter needs the draft model's time.
        bench = {"batch_size": 3, "cost_ms": {"context": 20, "target_ms_1": 10.0, "draft_ms_1": 0.0,
                                              "target_ms_2": 12.0, "target_ms_3": 13.0, "target_ms_4": 15.0}}
        (jobs / "bench.json").write_text(json.dumps([bench]))
        from_bench = data.read_cost_curves(jobs / "bench.json")
        assert data.predict(outs[1], from_bench)["speedup"] == pytest.approx(expected)
        one = data.load_output(jobs / "one")
        assert "draft-model time" in data.predict(one, from_bench)["why"]
        assert "none at this job's batch size 3" in data.predict(outs[1], [data.CostCurve(
            Path("x.json"), 16, {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}, None, None)])["why"]
    finally:
        (sweep / "calibrate.json").unlink()


def test_tables_without_matplotlib(jobs, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    _, html, printed = report.build_report([jobs / "one"], jobs / "no-plots.html")
    page = Page(html.read_text())
    assert page.images == [] and page.figures()["rows"] == ["10"]
    assert "matplotlib is not installed" in html.read_text() and "tables only" in printed
    assert assert_plots_on_page(html.read_text(), printed) == 0


def test_not_an_output(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert "is not a batchspec output dir" in capsys.readouterr().err


def test_parts_record_their_configuration(jobs):
    parts = sorted((jobs / "one" / "data").glob("*.parquet")) + sorted((jobs / "sweep").glob("*/*/data/*.parquet"))
    assert len(parts) >= 4
    for part in parts:
        config = json.loads(pq.read_schema(part).metadata[CONFIG_KEY])
        model = "/one/" in str(part)
        assert config["drafter"] == ("model" if model else "ngram") and config["adaptive"] is False
        assert config["k_max"] == (3 if model else int(part.parts[-4].split("=")[1]))
        assert config["sampling"]["temperature"] == 0.0 and config["sampling"]["max_new_tokens"] == 12
        assert config["batch_size"] == 3 and config["max_seq_len"] >= 12 and config["job"] == ("rep" if model else "sw")
        assert config["model"]["compile"] == "auto" and config["model"]["dtype"] == "float32"


def test_sweep_folders_are_hive_partitions(jobs, tmp_path):
    sweep = jobs / "sweep"
    files = glob.glob(f"{sweep}/**/data/*.parquet", recursive=True)
    table = pads.dataset(files, partitioning="hive", partition_base_dir=str(sweep)).to_table()
    pairs = set(zip(table.column("drafter").to_pylist(), table.column("drafter.k").to_pylist()))
    assert pairs == {("ngram", 1), ("ngram", 3)} and table.num_rows == 18
    # Values that are not folder names come back decoded.
    exclude = ["job", "output.dir"]
    name = sweep_subdir(["job=x", "model.draft=/models/d1", "sampling.stop=[a,b]", "drafter.k=2"], exclude)
    assert name == "drafter.k=2/model.draft=%2Fmodels%2Fd1/sampling.stop=%5Ba%2Cb%5D"
    (tmp_path / name).mkdir(parents=True)
    pq.write_table(pa.table({"id": ["0"]}), tmp_path / name / "part.parquet")
    row = pads.dataset(str(tmp_path), partitioning="hive").to_table().to_pylist()[0]
    assert row == {"id": "0", "drafter.k": 2, "model.draft": "/models/d1", "sampling.stop": "[a,b]"}


def test_drafts_per_round_column_and_the_docs_snippet(jobs):
    """Each row's drafts_per_round: one entry per target forward, summing to draft_tokens, bounding
    accepted_per_round; drafter model with fixed k drafts min(k_max, room left) (rows that ended on
    length: no round cut by EOS). docs/jobs.md's snippet runs on the output."""
    checked = capped = 0
    for part in sorted((jobs / "one" / "data").glob("*.parquet")):
        config = json.loads(pq.read_schema(part).metadata[CONFIG_KEY])
        for row in pq.read_table(part).to_pylist():
            drafts, accepted = row["drafts_per_round"], row["accepted_per_round"]
            if row["finish_reason"] == "error":
                assert drafts == accepted == []
                continue
            assert len(drafts) == row["target_forwards"] and drafts[0] == 0
            assert sum(drafts) == row["draft_tokens"] and all(a <= d for a, d in zip(accepted, drafts))
            if row["finish_reason"] != "length":
                continue
            emitted = 1  # the prefill emitted the first token
            for d, a in zip(drafts[1:], accepted[1:]):
                room = min(config["sampling"]["max_new_tokens"] - emitted,
                           config["max_seq_len"] - row["prompt_tokens"] - emitted) - 1
                assert d == max(0, min(config["k_max"], room))
                capped += d < config["k_max"]
                emitted += a + 1
            checked += 1
    assert checked >= 3 and capped >= 1
    text = (REPO / "docs" / "jobs.md").read_text()
    code = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "drafts_per_round" in b)
    exec(code.replace("outputs/demo/data", str(jobs / "one" / "data")), {})


def chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def headless(html: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless chromium on the page `html`: kept offline, with a fresh profile under tmp_path."""
    offline = ["--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update",
               "--disable-sync"]
    return subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", *offline,
                           f"--user-data-dir={tmp_path / 'profile'}", *args, html.resolve().as_uri()],
                          capture_output=True, text=True, timeout=120, check=True)


needs_chromium = pytest.mark.skipif(chromium() is None,
                                    reason="no chromium on PATH (Debian: apt-get install -y chromium)")


@needs_chromium
def test_page_renders_in_headless_chromium(jobs, tmp_path):
    from matplotlib.image import imread

    html = jobs / "sweep" / "rendered.html"
    report.build_report([jobs / "sweep"], html)
    shot = tmp_path / "page.png"
    headless(html, tmp_path, "--hide-scrollbars", f"--screenshot={shot}", "--window-size=1280,1800")
    pixels = imread(shot)
    assert pixels.shape[:2] == (1800, 1280)
    # The plots are drawn: many pixels of the first two series' colours (matplotlib's C0 blue, C1 orange).
    rgb = (pixels[..., :3] * 255).round()
    blue = ((abs(rgb - [31, 119, 180]).sum(axis=-1)) < 30).sum()
    orange = ((abs(rgb - [255, 127, 14]).sum(axis=-1)) < 30).sum()
    assert blue > 2000 and orange > 2000, (blue, orange)


# Run in the page once it has loaded: how many <img> elements the browser has, and how many of them it
# decoded and laid out (a broken or hidden image has no natural or no laid-out width).
SHOWN = ("<script>addEventListener('load', () => { const images = [...document.images]; "
         "document.body.dataset.images = images.length; document.body.dataset.shown = images.filter(i => "
         "i.complete && i.naturalWidth > 0 && i.getBoundingClientRect().width > 0).length; });</script>")


@needs_chromium
@pytest.mark.parametrize("output, plots", [("one", 6), ("sweep", 7)])
def test_browser_shows_every_plot_the_summary_counts(jobs, tmp_path, output, plots):
    html = tmp_path / "page.html"
    _, _, printed = report.build_report([jobs / output], html)
    assert printed_plots(printed) == plots
    probe = tmp_path / "probe.html"  # the page as written, with SHOWN run in it
    probe.write_text(html.read_text().replace("</body>", SHOWN + "</body>"))
    dom = headless(probe, tmp_path, "--virtual-time-budget=10000", "--dump-dom").stdout
    body = re.search(r"<body ([^>]*)>", dom)
    assert body, dom[:500]
    counts = dict(re.findall(r'data-(images|shown)="(\d+)"', body.group(1)))
    assert counts == {"images": str(plots), "shown": str(plots)}, counts
