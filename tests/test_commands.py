"""The commands as users run them (issue 11, items 12-18): a wheel install, a mistyped model path,
generate() with a bare string, the offline chat and own-file demo jobs, what seeded sampling keeps,
and the smaller items (resume message, summary, resume refusal, status in a pipe, newline stop
strings, Ctrl-C while loading, the second-signal rule)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

import batchspec
from batchspec.jobs.config import ASSETS_DIR
from conftest_jobs import (  # noqa: F401 (fixtures)
    REPO, WORDS, cli_env, one_line_error, one_thread, read_output, run_inprocess, tiny_job, tiny_models, write_job,
)

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [" ".join(WORDS[(5 * i + j) % len(WORDS)] for j in range(3 + i % 7)) for i in range(12)]
TINY = ["source.limit=2", "sampling.max_new_tokens=2", "progress.mode=off"]
needs_demo = pytest.mark.skipif(not (ASSETS_DIR / "demo" / "target").is_dir(), reason="the demo pair is not built")


@pytest.fixture
def workdir(tmp_path, tiny_models):
    pq.write_table(pa.table({"text": PROMPTS}), tmp_path / "in.parquet")
    write_job(tmp_path, "tiny", tiny_job(tiny_models, {"path": "in.parquet", "prompt_column": "text"}))
    return tmp_path


# ---- 12. a wheel install ------------------------------------------------------------------------


@pytest.mark.slow
@needs_demo
def test_a_wheel_install_finds_its_config_and_shipped_jobs(tmp_path):
    """Build a wheel from a copy of the sources, install it into a fresh venv (the test venv's
    site-packages lent for torch and friends through a .pth, which imports nothing of it), and run
    the CLI from an unrelated directory: conf/ and jobs/ must come from the installed package."""
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("batchspec", "conf", "jobs"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    run = dict(capture_output=True, text=True, timeout=300)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(src)], **run)
    assert built.returncode == 0, built.stderr
    wheel = next((tmp_path / "dist").glob("batchspec-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, **run).stdout.strip())
    (site / "lent-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                                "--no-index", "-q", str(wheel)], **run)
    assert installed.returncode == 0, installed.stderr

    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in cli_env().items() if k != "PYTHONPATH"}
    where = subprocess.run([python, "-c", "import batchspec.jobs.config as c; print(c.CONF_DIR, c.SHIPPED_JOBS_DIR)"],
                           cwd=work, env=env, **run)
    assert where.stdout.split() == [str(site / "batchspec" / "_conf"), str(site / "batchspec" / "_jobs")], where
    composed = subprocess.run([python, "-m", "batchspec", "job=demo_chat", "--cfg", "job", "--resolve"],
                              cwd=work, env=env, **run)
    assert composed.returncode == 0, composed.stderr
    status = subprocess.run([python, "-m", "batchspec.status", "--help"], cwd=work, env=env, **run)
    assert status.returncode == 0 and "usage:" in status.stdout, status.stderr  # entry/ on the package's path
    assert yaml.safe_load(composed.stdout)["source"]["path"] == str(site / "batchspec" / "assets" / "demo" / "chat.jsonl")
    job = subprocess.run([venv / "bin" / "batchspec", "job=demo", *TINY], cwd=work, env=env, **run)
    assert job.returncode == 0, job.stderr
    assert json.loads((work / "outputs" / "demo" / "summary.json").read_text())["rows"] == 2


@pytest.mark.parametrize("offline", ["HF_HUB_OFFLINE", "unreachable"])
def test_a_hub_id_while_the_hub_is_off_is_one_line_at_once(offline, capsys, monkeypatch, workdir):
    """model.target=smollm2 with no such folder (issue 58 item 5): with HF_HUB_OFFLINE, or a hub that refuses
    the connection, one line at once that names the folder and the hub (transformers retried for 44 s)."""
    from huggingface_hub import constants

    if offline == "HF_HUB_OFFLINE":
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    else:
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # the discard port: refused
    started = time.perf_counter()
    assert run_inprocess(workdir, "job=tiny", "model.target=smollm2-not-here", monkeypatch=monkeypatch) == 2
    assert time.perf_counter() - started < 10
    line = one_line_error(capsys)
    assert line.startswith("model.target: no local folder 'smollm2-not-here' here") and "the hub is off" in line
    with pytest.raises(ValueError, match="no local folder 'smollm2-not-here' here"):
        batchspec.generate(["x"], target="smollm2-not-here")


# ---- 14. a mistyped local model path ------------------------------------------------------------


@pytest.mark.parametrize("path", ["/nonexistent/model", "models/nope", "./nope", "../nope-batchspec-model"])
def test_a_missing_local_model_path_is_one_line_at_once(path, capsys, monkeypatch, workdir):
    (workdir / "models").mkdir()  # so that models/nope reads as a path, not as the hub id org/name
    started = time.perf_counter()
    assert run_inprocess(workdir, "job=tiny", f"model.target={path}", monkeypatch=monkeypatch) == 2
    assert time.perf_counter() - started < 10
    assert one_line_error(capsys).startswith(f"model.target: no such local directory {path!r} (resolved to ")
    assert run_inprocess(workdir, "job=tiny", "drafter=model", f"model.draft={path}", monkeypatch=monkeypatch) == 2
    assert one_line_error(capsys).startswith(f"model.draft: no such local directory {path!r}")
    with pytest.raises(ValueError, match=f"cannot load model '{path}': no such local directory"):
        batchspec.generate(["hello"], target=path)


# ---- 15. generate() with a bare string ----------------------------------------------------------


def test_generate_refuses_a_bare_string(tiny_models):
    with pytest.raises(TypeError, match=r"prompts must be a list, got a str; for one prompt pass \[prompt\]"):
        batchspec.generate("def f(x):", target=str(tiny_models.target))
    with pytest.raises(TypeError, match="ids must be a list, got a str"):
        batchspec.generate(["a", "b", "c"], ids="abc", target=str(tiny_models.target))
    one = batchspec.generate(["hello world"], target=str(tiny_models.target), max_new_tokens=2, device="cpu")
    assert len(one) == 1 and one[0].completion_tokens == 2


# ---- 16. chat and own-file jobs offline ---------------------------------------------------------


@needs_demo
def test_offline_chat_job_and_own_file_job(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_demo", REPO / "tools" / "build_demo.py")
    build_demo = importlib.util.module_from_spec(spec)
    sys.modules["build_demo"] = build_demo
    spec.loader.exec_module(build_demo)
    for name in ("target", "draft"):  # a rebuild of the demo writes the same template
        assert (ASSETS_DIR / "demo" / name / "chat_template.jinja").read_text() == build_demo.CHAT_TEMPLATE

    assert run_inprocess(tmp_path, "job=demo_chat", "source.limit=3", "sampling.max_new_tokens=4",
                         monkeypatch=monkeypatch) == 0
    rows = read_output(tmp_path / "outputs" / "demo_chat")
    assert [r["id"] for r in rows] == ["chat-000", "chat-001", "chat-002"]
    assert all(r["error"] is None and r["completion_tokens"] == 4 for r in rows)
    assert rows[0]["prompt"] == ("<s># system: You answer with Python code from the standard library.\n"
                                 "# user: Write a function that returns the sum of a list of numbers.\n# assistant:\n")
    assert rows[0]["topic"] == "sum"

    (tmp_path / "mine.jsonl").write_text('{"prompt": "def add(a, b):"}\n{"prompt": "class Stack:"}\n')
    assert run_inprocess(tmp_path, "job=demo_file", "source.path=mine.jsonl", "output.dir=outputs/mine",
                         "sampling.max_new_tokens=4", monkeypatch=monkeypatch) == 0
    mine = read_output(tmp_path / "outputs" / "mine")
    assert [r["prompt"] for r in mine] == ["def add(a, b):", "class Stack:"] and mine[0]["error"] is None


# ---- 17. what seeded sampling keeps, as the README says -----------------------------------------


@needs_demo
def test_what_seeded_sampling_keeps():
    """The README: with coupled verification (the default) seeded sampled output depends on nothing but
    (seed, id, prompt) (tests/test_coupled.py checks every axis); with rejection sampling it does not
    depend on the batch size for a fixed drafter and k (adaptive off), but changing k or the drafter
    changes it (on the trained demo pair, whose drafts are often accepted); greedy output never changes."""
    prompts = [r["prompt"] for r in pq.read_table(ASSETS_DIR / "demo" / "prompts.parquet").to_pylist()[:4]]
    common = dict(target=str(ASSETS_DIR / "demo" / "target"), draft=str(ASSETS_DIR / "demo" / "draft"),
                  max_new_tokens=16, temperature=1.0, seed=5, adaptive=False, device="cpu")

    def tokens(**kw):
        return [r.completion_token_ids for r in batchspec.generate(prompts, **{**common, **kw})]

    coupled = tokens(drafter="model", k=3, batch_size=4)
    for other in (dict(drafter="model", k=1), dict(drafter="ngram", k=3), dict(drafter="none")):
        assert tokens(batch_size=4, **other) == coupled, other
    model_k3 = tokens(drafter="model", k=3, batch_size=4, verify="rejection")
    assert tokens(drafter="model", k=3, batch_size=1, verify="rejection") == model_k3
    for other in (dict(drafter="model", k=1), dict(drafter="ngram", k=3), dict(drafter="none")):
        assert all(a != b for a, b in zip(tokens(batch_size=4, verify="rejection", **other), model_k3)), other
    greedy = {"temperature": 0.0, "adaptive": None, "batch_size": 4}
    runs = [tokens(**greedy, **kw) for kw in (dict(drafter="none"), dict(drafter="model", k=1),
                                              dict(drafter="ngram", k=4))]
    assert runs[0] == runs[1] == runs[2]
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "With coupled sampling (and greedy decoding) a request's output depends only on" in readme
    assert "but changes with the drafter or k" in readme


# ---- 18. smaller items --------------------------------------------------------------------------


def test_resume_message_counts_this_shards_rows(workdir, monkeypatch, capsys):
    assert run_inprocess(workdir, "job=tiny", "shard.count=2", "shard.index=1", monkeypatch=monkeypatch) == 0
    capsys.readouterr()
    assert run_inprocess(workdir, "job=tiny", "shard.count=2", "shard.index=0", monkeypatch=monkeypatch) == 0
    assert "tiny shard 0/2: 6 rows to do (0 already done; 6 rows of other shards in the dir)" in capsys.readouterr().out


@pytest.mark.parametrize("args, shown", [
    (["drafter=none"], "drafter none, batch 3"),
    (["drafter=ngram", "drafter.adaptive=null"], "drafter ngram (adaptive, k <= 4), batch 3"),
    (["drafter=ngram", "drafter.adaptive=null", "sampling=nucleus"], "drafter ngram (adaptive, k <= 4), batch 3"),
    (["drafter=ngram", "drafter.adaptive=null", "sampling=nucleus", "sampling.verify=rejection"],
     "drafter ngram (k=4), batch 3"),
    (["drafter=model", "drafter.k=2"], "drafter model (k=2), batch 3"),
])
def test_summary_says_what_the_drafter_did(args, shown, workdir, monkeypatch, capsys):
    assert run_inprocess(workdir, "job=tiny", "source.limit=2", *args, monkeypatch=monkeypatch) == 0
    out = capsys.readouterr().out
    assert "models loaded in " in out and f"({shown})" in out
    name = shown.removeprefix("drafter ").removesuffix(", batch 3")
    assert f"  drafter                   {name}\n" in out


def test_resume_refusal_names_the_key(workdir, monkeypatch, capsys):
    assert run_inprocess(workdir, "job=tiny", "source.limit=2", monkeypatch=monkeypatch) == 0
    capsys.readouterr()
    assert run_inprocess(workdir, "job=tiny", "sampling.top_k=5", monkeypatch=monkeypatch) == 2
    assert one_line_error(capsys).startswith(
        "output.dir outputs/tiny holds rows made with a different sampling.top_k (0, now 5): choose another")


def test_status_into_a_closed_pipe(workdir, monkeypatch):
    assert run_inprocess(workdir, "job=tiny", "source.limit=2", monkeypatch=monkeypatch) == 0
    proc = subprocess.Popen([sys.executable, "-m", "batchspec.status", "outputs/tiny", "--json"], cwd=workdir,
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # as `| head` does once it has its lines: the report is written into a closed pipe
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert proc.returncode == 0


def test_newline_stop_strings_from_the_command_line(workdir, monkeypatch, capsys):
    """docs/jobs.md: bash's $'...' quoting gives Hydra real newlines; a literal backslash-n gets a warning."""
    args = subprocess.run(["bash", "-c", """printf '%s\\0' $'sampling.stop=["\\n\\n", "x\\ty"]'"""],
                          capture_output=True, check=True).stdout.split(b"\0")[:-1]
    assert run_inprocess(workdir, "job=tiny", args[0].decode(), "--cfg", "job", monkeypatch=monkeypatch) == 0
    assert yaml.safe_load(capsys.readouterr().out)["sampling"]["stop"] == ["\n\n", "x\ty"]
    assert run_inprocess(workdir, "job=tiny", "source.limit=1", 'sampling.stop=["\\n\\n"]', monkeypatch=monkeypatch) == 0
    assert "sampling.stop '\\\\n\\\\n' holds a backslash, not a newline or tab" in capsys.readouterr().out


SLOW_LOAD = """
import os, sys, time
marker, watched = sys.argv[1], sys.argv[2]
def hook(event, args):  # the model's config.json is being opened: say so, then take a while
    if event == "open" and isinstance(args[0], str) and args[0].startswith(watched) and not os.path.exists(marker):
        with open(marker + ".tmp", "w"):
            pass
        os.replace(marker + ".tmp", marker)
        time.sleep(60)
sys.addaudithook(hook)
sys.argv = ["batchspec", *sys.argv[3:]]
from batchspec.jobs.cli import main
main()
"""


def default_sigint() -> None:
    """Ctrl-C as in a terminal: a suite started in the background (`pytest &` from a script) ignores SIGINT,
    and a child would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_while_the_model_loads_is_one_line(workdir, tiny_models):
    marker = workdir / "loading"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_LOAD, str(marker), str(tiny_models.target / "config.json"),
                             "job=tiny"], cwd=workdir, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=default_sigint)
    deadline = time.time() + 120
    while not marker.exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == ("batchspec: error: interrupted (SIGINT); the rows already in the output "
                                           "dir are kept: rerun the same command to resume")


class FakeGenerator:
    """A result every `step` seconds; after stop_admitting, IN_FLIGHT more (the rows in flight), then done."""

    IN_FLIGHT = 30

    def __init__(self, step: float):
        from batchspec.engine.runstats import RunStats

        self.stats, self.step, self.admitting = RunStats(), step, True

    def stop_admitting(self):
        self.admitting = False

    def run(self, requests):
        from batchspec.engine.types import Result

        left = self.IN_FLIGHT
        for request in requests:
            if not self.admitting:
                left -= 1
                if left < 0:
                    return
            time.sleep(self.step)
            yield Result.error_result(request, "fake")


@pytest.mark.parametrize("second, delay, stops_now", [
    (signal.SIGTERM, 0.2, False),  # srun's copy of the same SIGTERM: one request
    (signal.SIGTERM, 1.2, True),  # a SIGTERM a second or more later: a second signal
    (signal.SIGINT, 0.2, True),  # any other signal: a second signal
])
def test_the_second_signal_rule(second, delay, stops_now, tmp_path):
    """docs/jobs.md: a second signal stops at once, except a SIGTERM within 1 s of a SIGTERM."""
    from batchspec.jobs.job import Progress, run_job
    from batchspec.jobs.sink import ParquetSink
    from batchspec.engine.types import Request

    generator = FakeGenerator(step=0.05)
    sink = ParquetSink(tmp_path, shard_index=0, shard_count=1, rows_per_file=1000)
    requests = (Request(id=str(i), prompt="x") for i in range(1000))
    sent: list[float] = []

    class SignalAfterFirstRow(Progress):
        def update(self, *args, **kwargs):
            super().update(*args, **kwargs)
            if not sent:
                sent.append(time.monotonic())
                os.kill(os.getpid(), signal.SIGTERM)
            elif len(sent) == 1 and time.monotonic() - sent[0] >= delay:
                sent.append(time.monotonic())
                os.kill(os.getpid(), second)

    outcome = run_job(requests, generator, sink, SignalAfterFirstRow("off", total=None))
    assert outcome.interrupted_by == signal.SIGTERM and len(sent) == 2
    finished_in_flight = outcome.rows == 1 + FakeGenerator.IN_FLIGHT
    assert finished_in_flight != stops_now, outcome
    doc = " ".join((REPO / "docs" / "jobs.md").read_text().split())
    assert "a SIGTERM that follows a SIGTERM within 1 second is taken as the same request" in doc


def test_every_package_is_in_the_wheel():
    """pyproject lists the packages a wheel carries: a new sub-package must be listed too (a wheel
    without batchspec.engine.drafters could not run a job)."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "batchspec").rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)


def test_the_gpu_tools_need_no_job_runner_packages():
    """The device machines have torch, transformers and pyarrow but not hydra-core, omegaconf or datasets:
    the Python API, the bench, calibrate and the GPU tools must import and parse their arguments without
    them (docs/benchmarks.md: On a GPU)."""
    root = Path(__file__).resolve().parents[1]
    script = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("hydra", "omegaconf", "datasets"):
            raise ImportError("not on the device machine: " + name)
sys.meta_path.insert(0, Block())
sys.path.insert(0, {str(root / "tools")!r})
import batchspec, batchspec.bench, batchspec.calibrate, gpu_check, synthetic_pair, tree_bound
from batchspec.bench.calibrate import read_prompts
assert len(read_prompts({str(ASSETS_DIR / "demo" / "prompts.parquet")!r}, 3, "prompt", None)) == 3
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=root, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
