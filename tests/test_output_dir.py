"""The output folder is the user's data (issue 11, items 7-10): one writer per shard (real processes),
a resume refuses an input whose rows moved under positional ids, stray and damaged files in the
output are reported instead of being read as parts, and an unusable output dir fails up front."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchspec.jobs import status
from conftest_jobs import (  # noqa: F401 (fixtures)
    WORDS, cli_env, one_line_error, one_thread, read_output, run_inprocess, tiny_job, tiny_models,
    write_job,
)

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [" ".join(WORDS[(7 * i + j) % len(WORDS)] for j in range(3 + i % 9)) for i in range(40)]


def ids(out_dir: Path) -> list[str]:
    return [r["id"] for r in read_output(out_dir)]


# ---- 7. one writer per shard --------------------------------------------------------------------


def start_job(workdir: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "batchspec", *args], cwd=workdir, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for_parts(data: Path, n: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while len(list(data.glob("*.parquet"))) < n:
        assert proc.poll() is None, f"job ended before writing {n} parts:\n{proc.stdout.read()}"
        assert time.time() < deadline, "job too slow"
        time.sleep(0.02)


@pytest.mark.slow
def test_a_second_run_of_a_shard_is_refused_while_the_first_runs(tmp_path, tiny_models, monkeypatch, capsys):
    """A double-submitted task: the first run holds the shard (a process of its own, stopped mid-run with
    SIGSTOP, so the overlap is certain); a second run of the same shard, with another rows_per_file as in the
    issue, and a run of another shard count are refused; the first then finishes and every row is there once.
    The runs that only meet the lock run in this process (each a CLI run would spend ~6 s importing)."""
    pq.write_table(pa.table({"text": PROMPTS}), tmp_path / "in.parquet")
    write_job(tmp_path, "lock", tiny_job(tiny_models, {"path": "in.parquet", "prompt_column": "text"},
                                         output={"rows_per_file": 2}, batch_size=2, sampling={"max_new_tokens": 8}))
    out = tmp_path / "outputs" / "lock"
    first = start_job(tmp_path, "job=lock")
    wait_for_parts(out / "data", 1, first)
    first.send_signal(signal.SIGSTOP)
    try:
        for args, refusal in ((["output.rows_per_file=3"], f"is being written by another run (pid {first.pid} on "),
                              (["shard.count=2", "shard.index=1"],
                               "is being written by a run with shard.count=1 (this one has shard.count=2)")):
            capsys.readouterr()
            assert run_inprocess(tmp_path, "job=lock", *args, monkeypatch=monkeypatch) == 2
            err = capsys.readouterr().err
            assert "Traceback" not in err and err.count("batchspec: error:") == 1 and refusal in err, err
    finally:
        first.send_signal(signal.SIGCONT)
    log = first.communicate(timeout=120)[0]
    assert first.returncode == 0, log
    assert sorted(ids(out)) == sorted(str(i) for i in range(len(PROMPTS)))  # every row exactly once

    # The lock is released on exit, and a holder killed with SIGKILL leaves a lock file that blocks nothing.
    (out / "shards" / "shard-00000-of-00001.json").unlink()
    killed = start_job(tmp_path, "job=lock", "output.dir=outputs/killed")
    wait_for_parts(tmp_path / "outputs" / "killed" / "data", 1, killed)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert (tmp_path / "outputs" / "killed" / ".locks" / "shard-00000-of-00001.lock").exists()
    for args in (["job=lock"], ["job=lock", "output.dir=outputs/killed"]):
        assert run_inprocess(tmp_path, *args, monkeypatch=monkeypatch) == 0, capsys.readouterr().err
    assert sorted(ids(tmp_path / "outputs" / "killed")) == sorted(str(i) for i in range(len(PROMPTS)))


# ---- 8. positional ids and an input that changed ------------------------------------------------


def test_positional_ids_refuse_an_input_whose_rows_moved(tmp_path, tiny_models, monkeypatch, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    pq.write_table(pa.table({"text": PROMPTS[:3]}), folder / "b.parquet")
    write_job(tmp_path, "pos", tiny_job(tiny_models, {"path": "in", "prompt_column": "text"}))
    out = tmp_path / "outputs" / "pos"
    assert run_inprocess(tmp_path, "job=pos", monkeypatch=monkeypatch) == 0

    pq.write_table(pa.table({"text": PROMPTS[10:12]}), folder / "a.parquet")  # sorts first: rows 0, 1 move
    capsys.readouterr()
    assert run_inprocess(tmp_path, "job=pos", monkeypatch=monkeypatch) == 2
    message = one_line_error(capsys)
    assert message.startswith("the input changed since the rows in outputs/pos were made: 'in/b.parquet' (rows 3, ")
    assert "is now 'in/a.parquet' (rows 2, " in message and "set source.id_column" in message
    assert sorted(ids(out)) == ["0", "1", "2"]

    (folder / "a.parquet").unlink()
    pq.write_table(pa.table({"text": PROMPTS[20:22]}), folder / "c.parquet")  # sorts last: new rows 3, 4
    assert run_inprocess(tmp_path, "job=pos", monkeypatch=monkeypatch) == 0
    rows = {r["id"]: r for r in read_output(out)}
    assert sorted(rows) == ["0", "1", "2", "3", "4"] and rows["3"]["prompt"] == PROMPTS[20]

    # JSONL: lines appended are new rows; a line inserted before the old ones moves them.
    lines = [json.dumps({"text": p}) + "\n" for p in PROMPTS[:4]]
    (tmp_path / "in.jsonl").write_text("".join(lines[:2]))
    args = ["job=pos", "source.path=in.jsonl", "output.dir=outputs/pos-jsonl"]
    assert run_inprocess(tmp_path, *args, monkeypatch=monkeypatch) == 0
    (tmp_path / "in.jsonl").write_text("".join(lines[:3]))
    assert run_inprocess(tmp_path, *args, monkeypatch=monkeypatch) == 0
    assert sorted(ids(tmp_path / "outputs" / "pos-jsonl")) == ["0", "1", "2"]
    (tmp_path / "in.jsonl").write_text(lines[3] + "".join(lines[:3]))
    capsys.readouterr()
    assert run_inprocess(tmp_path, *args, monkeypatch=monkeypatch) == 2
    assert "the first " in one_line_error(capsys)
    # With an id column rows are matched by id, so the same change is fine.
    (folder / "c.parquet").unlink()
    pq.write_table(pa.table({"text": PROMPTS[:3], "key": ["k0", "k1", "k2"]}), folder / "b.parquet")
    keyed = ["job=pos", "source.id_column=key", "output.dir=outputs/keyed"]
    assert run_inprocess(tmp_path, *keyed, monkeypatch=monkeypatch) == 0
    pq.write_table(pa.table({"text": PROMPTS[10:12], "key": ["k10", "k11"]}), folder / "a.parquet")
    assert run_inprocess(tmp_path, *keyed, monkeypatch=monkeypatch) == 0
    assert sorted(ids(tmp_path / "outputs" / "keyed")) == ["k0", "k1", "k10", "k11", "k2"]


# ---- 9. stray and damaged files in the output ---------------------------------------------------


def test_stray_and_damaged_files_in_the_output(tmp_path, tiny_models, monkeypatch, capsys):
    pq.write_table(pa.table({"text": PROMPTS[:6]}), tmp_path / "in.parquet")
    write_job(tmp_path, "st", tiny_job(tiny_models, {"path": "in.parquet", "prompt_column": "text"}))
    out = tmp_path / "outputs" / "st"
    data = out / "data"
    assert run_inprocess(tmp_path, "job=st", monkeypatch=monkeypatch) == 0
    parts = sorted(data.glob("*.parquet"))
    assert len(parts) == 2

    def report():
        capsys.readouterr()
        code = status.main([str(out)])
        return code, capsys.readouterr().out

    # Foreign files (no id column; a backup copy of a part): resume and the summary ignore them, status reports them.
    pq.write_table(pa.table({"x": [1, 2]}), data / "notes.parquet")
    shutil.copy(parts[0], data / f"{parts[0].stem} (copy).parquet")
    assert run_inprocess(tmp_path, "job=st", monkeypatch=monkeypatch) == 0
    assert "that are not this job's part files" in capsys.readouterr().out  # Hydra logs to stdout
    assert json.loads((out / "summary.json").read_text())["rows"] == 6
    code, text = report()
    assert code == 1 and "PROBLEM: 2 file(s) in data/ that are not part files" in text
    assert "notes.parquet" in text and "(copy).parquet" in text
    assert status.status(out)["rows"] == 6
    for f in (data / "notes.parquet", data / f"{parts[0].stem} (copy).parquet"):
        f.unlink()
    assert report()[0] == 0

    # A file named like a part that is not one (only ids) would mark rows done: refused, and reported.
    fake = data / "shard-00000-of-00001-part-000007.parquet"
    pq.write_table(pa.table({"id": ["0", "1"]}), fake)
    assert run_inprocess(tmp_path, "job=st", monkeypatch=monkeypatch) == 2
    assert one_line_error(capsys) == (f"{fake.relative_to(tmp_path)} is not a batchspec part file (it has no "
                                      f"'prompt' column); move it out of outputs/st/data and rerun")
    code, text = report()
    assert code == 1 and f"PROBLEM: unreadable part file {fake.name}: named like a part file but is not one" in text

    # A truncated part: status names it (no traceback), resume refuses it in one line.
    fake.write_bytes(parts[1].read_bytes()[:100])
    code, text = report()
    assert code == 1 and f"PROBLEM: unreadable part file {fake.name}: " in text
    assert run_inprocess(tmp_path, "job=st", monkeypatch=monkeypatch) == 2
    assert one_line_error(capsys).startswith(f"cannot read output part {fake.relative_to(tmp_path)}: ")
    fake.unlink()

    # A damaged finish marker: status reports it; the shard's own rerun rewrites it. A damaged job.json refuses.
    marker = out / "shards" / "shard-00000-of-00001.json"
    marker.write_text("{not json")
    code, text = report()
    assert code == 1 and f"PROBLEM: unreadable finish marker: {marker} is not valid JSON" in text
    assert run_inprocess(tmp_path, "job=st", monkeypatch=monkeypatch) == 0
    assert report()[0] == 0
    (out / "job.json").write_text("")
    assert run_inprocess(tmp_path, "job=st", monkeypatch=monkeypatch) == 2
    assert one_line_error(capsys).startswith("outputs/st/job.json is not valid JSON (Expecting value")


def test_status_names_the_files_that_hold_duplicate_ids(tmp_path, tiny_models, monkeypatch, capsys):
    pq.write_table(pa.table({"text": PROMPTS[:4]}), tmp_path / "in.parquet")
    write_job(tmp_path, "dup", tiny_job(tiny_models, {"path": "in.parquet", "prompt_column": "text"}))
    assert run_inprocess(tmp_path, "job=dup", monkeypatch=monkeypatch) == 0
    data = tmp_path / "outputs" / "dup" / "data"
    part = sorted(data.glob("*.parquet"))[0]
    shutil.copy(part, data / "shard-00000-of-00001-part-000042.parquet")
    capsys.readouterr()
    assert status.main([str(data.parent)]) == 1
    assert (f"DUPLICATE ids in more than one part file: 4 (e.g. ['0', '1', '2', '3']; in {part.name} and "
            "shard-00000-of-00001-part-000042.parquet)") in capsys.readouterr().out


# ---- 10. an output dir that cannot be written ---------------------------------------------------


def unwritable(tmp_path: Path) -> Path:
    """A folder this process cannot create anything in (root ignores permission bits: use /sys)."""
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        return ro / "out"
    probe = Path("/sys") / "batchspec-probe"
    try:
        probe.mkdir()
    except OSError:
        return Path("/sys") / "batchspec-test" / "out"
    probe.rmdir()
    pytest.skip("no unwritable folder available")


def test_an_output_dir_that_cannot_be_written_is_one_line(tmp_path, tiny_models, monkeypatch, capsys):
    pq.write_table(pa.table({"text": PROMPTS[:2]}), tmp_path / "in.parquet")
    write_job(tmp_path, "w", tiny_job(tiny_models, {"path": "in.parquet", "prompt_column": "text"}))
    (tmp_path / "a-file").write_text("")
    assert run_inprocess(tmp_path, "job=w", "output.dir=a-file", monkeypatch=monkeypatch) == 2
    assert one_line_error(capsys) == "output.dir a-file is a file, not a folder"
    target = unwritable(tmp_path)
    assert run_inprocess(tmp_path, "job=w", f"output.dir={target}", monkeypatch=monkeypatch) == 2
    assert one_line_error(capsys).startswith(f"output.dir {target} is not writable: ")

    # data/ on another filesystem: parts are renamed from .tmp/ into data/, which fails across filesystems.
    other = Path("/dev/shm")
    if not other.is_dir() or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem to put data/ on")
    elsewhere = Path(os.path.realpath(other)) / f"batchspec-test-{os.getpid()}"
    elsewhere.mkdir()
    try:
        (tmp_path / "x-dev").mkdir()
        (tmp_path / "x-dev" / "data").symlink_to(elsewhere)
        assert run_inprocess(tmp_path, "job=w", "output.dir=x-dev", monkeypatch=monkeypatch) == 2
        assert one_line_error(capsys).startswith("output.dir x-dev: data/ and .tmp/ are on different filesystems")
        assert list(elsewhere.iterdir()) == []
    finally:
        shutil.rmtree(elsewhere)
