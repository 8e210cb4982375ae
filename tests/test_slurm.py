"""jobs/slurm_array.sh and Hydra's submitit launcher against a real single-node SLURM cluster
(conftest_slurm.py): a 3-task array, a task pre-empted with SIGUSR2 and requeued, a task cancelled and
the array resubmitted, and a submitit multirun over two K values with one member pre-empted.

Every case runs the shipped demo job (trained pair, greedy) on the same rows, so every output must equal
the uninterrupted array's row for row. The timings printed with `pytest -s` are measurements of this
machine (2 CPU cores shared with other work), not limits.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from batchspec.jobs.config import ASSETS_DIR
from batchspec.jobs.status import format_status
from conftest_jobs import REPO, read_output
from conftest_slurm import Slurm, log_times, slurm_cluster  # noqa: F401 (fixture)

pytestmark = pytest.mark.skipif(not (ASSETS_DIR / "demo" / "target").is_dir(), reason="the demo pair is not built")

SCRIPT = str(REPO / "jobs" / "slurm_array.sh")
ROWS = 120  # of the demo's 200 prompts: long enough (~6 s of generation) to signal a task mid-run
DEMO = ["job=demo", f"source.limit={ROWS}", "sampling.max_new_tokens=32", "output.rows_per_file=6"]
TASK = ["-c", "1", "--mem=1G"]  # the script asks for 4 CPUs and 16G; the test node has 2 CPUs
ARRAY = ["--array=0-2", *TASK]


def parts(out: Path, shard: str = "") -> int:
    return len(list((out / "data").glob(f"{shard}*.parquet")))


def wait_for_parts(out: Path, shard: str, n: int, slurm: Slurm, job: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while parts(out, shard) < n:
        assert slurm.queued(job), f"job {job} ended before {shard} wrote {n} parts"
        assert time.monotonic() < deadline, f"{shard}: fewer than {n} parts after {timeout:.0f} s"
        time.sleep(0.1)


def report(out: Path, slurm: Slurm, cwd: Path) -> tuple[int, dict]:
    """`python -m batchspec.status OUT --json`: (exit status, report)."""
    proc = slurm.cmd(sys.executable, "-m", "batchspec.status", str(out), "--json", cwd=cwd, check=False)
    return proc.returncode, json.loads(proc.stdout)


def assert_exactly_once(rows: list[dict]) -> None:
    ids = [r["id"] for r in rows]
    assert len(ids) == ROWS and len(set(ids)) == ROWS


def markers(out: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in (out / "shards").glob("*.json")}


# Session-scoped: the SLURM tests share one worker (conftest.py), which may run other files' tests between them,
# and a module fixture would then be torn down and this minute-long array run again.
@pytest.fixture(scope="session")
def uninterrupted(slurm_cluster, tmp_path_factory):
    """`sbatch --array=0-2 jobs/slurm_array.sh job=demo ...`, run to the end: (workdir, job id, rows)."""
    work = tmp_path_factory.mktemp("array")
    started = time.monotonic()
    job = slurm_cluster.sbatch(work, *ARRAY, "-o", "log-%a.out", SCRIPT, *DEMO)
    slurm_cluster.wait_done(job)
    print(f"\n3-task array over {ROWS} rows: {time.monotonic() - started:.1f} s from sbatch to done")
    return work, job, read_output(work / "outputs" / "demo")


@pytest.mark.slurm
def test_array_three_tasks_complete_exactly_once(uninterrupted, slurm_cluster):
    work, job, rows = uninterrupted
    out = work / "outputs" / "demo"
    assert slurm_cluster.states(job) == {f"{job}_{i}": "COMPLETED" for i in range(3)}
    assert_exactly_once(rows)
    assert all(r["finish_reason"] in ("stop", "length") and r["error"] is None for r in rows)
    for i in range(3):  # each task ran its own shard, into the one output dir
        log = (work / f"log-{i}.out").read_text()
        assert f"demo shard {i}/3" in log and "exit 0" in log, log
        assert parts(out, f"shard-{i:05d}-of-00003-part-") >= 1
    code, status = report(out, slurm_cluster, work)
    assert code == 0 and status["complete"] and status["rows"] == ROWS and status["duplicate_id_count"] == 0
    assert [(s["shard"], s["count"], s["finished"]) for s in status["shards"]] == [(i, 3, True) for i in range(3)]
    assert sum(s["rows"] for s in status["shards"]) == ROWS
    assert not list((out / ".tmp").iterdir())  # no half-written parts left behind
    printed = format_status(status)
    assert printed.startswith(f"{out}: complete: {ROWS} rows (0 errors), 3/3 shards finished"), printed


@pytest.mark.slurm
def test_task_preempted_with_usr2_is_requeued_and_resumes(uninterrupted, slurm_cluster, tmp_path):
    """`scancel --signal=USR2` on a running task: batchspec writes the rows in flight and exits 140, the
    script requeues the task, and the requeued task finishes the shard: same output as uninterrupted."""
    job = slurm_cluster.sbatch(tmp_path, *ARRAY, "-o", "log-%a.out", SCRIPT, *DEMO)
    out = tmp_path / "outputs" / "demo"
    wait_for_parts(out, "shard-00000-of-00003-part-", 2, slurm_cluster, job)
    before = parts(out, "shard-00000")
    signalled = time.time()
    slurm_cluster.cmd("scancel", "--signal=USR2", f"{job}_0")
    slurm_cluster.wait_done(job)
    log = (tmp_path / "log-0.out").read_text()
    assert "SIGUSR2: finishing the rows in flight" in log, log
    assert "stopped by a signal (exit 140)" in log and "requeueing task" in log, log
    assert "restart 1" in log and "already done" in log and "exit 0" in log, log
    written = int(log.split("rows written this run")[0].rsplit("stopped by signal 12: ", 1)[1])
    assert before * 6 <= written < ROWS // 3 + 1, "the signal did not arrive mid-run"
    assert slurm_cluster.states(job) == {f"{job}_{i}": "COMPLETED" for i in range(3)}
    rows = read_output(out)
    assert_exactly_once(rows)
    assert rows == uninterrupted[2]  # row for row, token for token
    assert report(out, slurm_cluster, tmp_path)[0] == 0
    restarted = log_times(log, r"starting on .* restart 1")
    stopped = log_times(log, r"SIGUSR2: finishing")
    print(f"\nUSR2 -> batchspec caught it after {stopped[0] - signalled:.1f} s; the requeued task started "
          f"{restarted[0] - signalled:.0f} s after the signal (its log stamp has 1 s resolution)")


@pytest.mark.slurm
def test_cancelled_task_then_resubmitted_array_computes_only_missing_rows(uninterrupted, slurm_cluster, tmp_path):
    """`scancel` (SIGTERM) on a running task: the complete rows are written, the task is not requeued
    and the report says incomplete; resubmitting the same array redoes only that shard's missing rows."""
    job = slurm_cluster.sbatch(tmp_path, *ARRAY, "-o", "log-%a.out", SCRIPT, *DEMO)
    out = tmp_path / "outputs" / "demo"
    wait_for_parts(out, "shard-00000-of-00003-part-", 1, slurm_cluster, job)
    cancelled = time.monotonic()
    slurm_cluster.cmd("scancel", f"{job}_0")
    while any(line.startswith(f"{job}_0 ") for line in slurm_cluster.queued(job)):
        time.sleep(0.2)
    exit_s = time.monotonic() - cancelled
    slurm_cluster.wait_done(job)
    states = slurm_cluster.states(job)
    assert states[f"{job}_0"].startswith("CANCELLED") and states[f"{job}_1"] == states[f"{job}_2"] == "COMPLETED"
    log = (tmp_path / "log-0.out").read_text()
    assert "SIGTERM: finishing the rows in flight" in log and "requeue" not in log, log
    code, status = report(out, slurm_cluster, tmp_path)
    assert code == 1 and not status["complete"]
    assert [s["finished"] for s in status["shards"]] == [False, True, True]
    had, had_0 = status["rows"], status["shards"][0]["rows"]  # all shards' rows; shard 0's
    assert had < ROWS and status["duplicate_id_count"] == 0
    finished_before = markers(out)

    again = slurm_cluster.sbatch(tmp_path, *ARRAY, "-o", "again-%a.out", SCRIPT, *DEMO)
    slurm_cluster.wait_done(again)
    assert slurm_cluster.states(again) == {f"{again}_{i}": "COMPLETED" for i in range(3)}
    for i in (1, 2):  # finished shards do nothing, and keep their markers
        assert "nothing to do" in (tmp_path / f"again-{i}.out").read_text()
    marker = markers(out)
    assert {k: marker[k] for k in finished_before} == finished_before
    assert marker["shard-00000-of-00003.json"]["last_run"]["rows"] == ROWS - had  # only the missing rows
    assert f"({had_0} already done; {had - had_0} rows of other shards in the dir)" in (
        tmp_path / "again-0.out").read_text()
    rows = read_output(out)
    assert_exactly_once(rows)
    assert rows == uninterrupted[2]
    assert report(out, slurm_cluster, tmp_path)[0] == 0
    print(f"\nscancel -> task left the queue in {exit_s:.1f} s; {had} rows kept, {ROWS - had} redone")


@pytest.mark.slurm
def test_submitit_multirun_over_two_k_values_with_a_preempted_member(uninterrupted, slurm_cluster, tmp_path):
    """`python -m batchspec -m job=demo hydra/launcher=submitit_slurm drafter.k=2,4`: one SLURM job per K,
    each into its own output dir. Member k=2 gets `scancel --signal=USR2` mid-run: submitit's
    checkpoint resubmits it (requeue), and it resumes. Greedy: both equal the uninterrupted output."""
    launcher = ["hydra/launcher=submitit_slurm", "hydra.launcher.timeout_min=60", "hydra.launcher.cpus_per_task=1",
                "hydra.launcher.mem_gb=1"]
    proc = subprocess.Popen([sys.executable, "-m", "batchspec", "-m", *DEMO, *launcher, "drafter.k=2,4"], cwd=tmp_path,
                            env=slurm_cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        name = f"drafter.k={{k}}/output.rows_per_file=6/sampling.max_new_tokens=32/source.limit={ROWS}"  # key=value folders
        k2 = tmp_path / "outputs" / "demo" / name.format(k=2)
        deadline = time.monotonic() + 300
        while parts(k2) < 2:
            assert proc.poll() is None, f"launcher ended before k=2 wrote 2 parts:\n{proc.stdout.read()}"
            assert time.monotonic() < deadline, "k=2 wrote fewer than 2 parts in 300 s"
            time.sleep(0.1)
        member = next(line.split()[0] for line in slurm_cluster.cmd("squeue", "-h", "-o", "%i %T").stdout.splitlines()
                      if line.split() == [line.split()[0], "RUNNING"] and line.split()[0].endswith("_0"))
        slurm_cluster.cmd("scancel", "--signal=USR2", member)
        output = proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output
    submitit_logs = "".join(p.read_text() for p in (tmp_path / "multirun").glob(f"*/.submitit/{member}/*_log.*"))
    assert "this job is preempted" in submitit_logs and "DUE TO JOB REQUEUE" in submitit_logs, submitit_logs
    assert "SIGUSR2: finishing the rows in flight" in submitit_logs, submitit_logs
    reference = {r["id"]: r["completion_token_ids"] for r in uninterrupted[2]}
    for k in (2, 4):
        out = tmp_path / "outputs" / "demo" / name.format(k=k)
        rows = read_output(out)
        assert_exactly_once(rows)  # not split into shards by submitit's array variables
        assert {r["id"]: r["completion_token_ids"] for r in rows} == reference
        summary = json.loads((out / "summary.json").read_text())
        assert summary["config"]["drafter"]["k"] == k and len(summary["acceptance_by_position"]) == k
        assert summary["shards"] == {"count": 1, "finished": [0], "complete": True}
    assert markers(k2)["shard-00000-of-00001.json"]["last_run"]["rows"] < ROWS  # k=2 resumed after the signal


def test_submitit_local_multirun(tmp_path):
    """hydra/launcher=submitit_local (a laptop): the same sweep, run as local processes."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="hydra-submitit-launcher not installed")
    from conftest_jobs import cli_env

    demo = [o for o in DEMO if not o.startswith("source.limit=")]
    proc = subprocess.run([sys.executable, "-m", "batchspec", "-m", *demo, "source.limit=8", "hydra/launcher=submitit_local",
                           "drafter.k=2,4"], cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    demo = tmp_path / "outputs" / "demo"
    outs = sorted(p.parent for p in demo.glob("**/data"))
    assert [str(o.relative_to(demo)).split("/")[0] for o in outs] == ["drafter.k=2", "drafter.k=4"]
    texts = []
    for out in outs:
        rows = read_output(out)
        assert len(rows) == len({r["id"] for r in rows}) == 8
        texts.append([r["completion_token_ids"] for r in rows])
    assert texts[0] == texts[1]


def test_sigterm_abandons_rows_in_flight_after_the_grace_time(tmp_path, monkeypatch, capsys):
    """SIGKILL follows SIGTERM after SLURM's KillWait: rows still in flight TERM_GRACE_S after a SIGTERM
    are abandoned, the complete ones written, exit 143; the rerun completes the output exactly once."""
    import os
    import signal
    import threading

    from batchspec.jobs import job as job_module
    from conftest_jobs import run_inprocess

    monkeypatch.setattr(job_module, "TERM_GRACE_S", 1e-6)  # no time for the rows in flight
    args = ["job=demo", "source.limit=60", "sampling.max_new_tokens=32", "output.rows_per_file=4", "threads=1",
            "output.dir=out"]
    data = tmp_path / "out" / "data"

    def term_after_first_part():
        deadline = time.monotonic() + 120
        while not list(data.glob("*.parquet")) and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=term_after_first_part, daemon=True)
    killer.start()
    assert run_inprocess(tmp_path, *args, monkeypatch=monkeypatch) == 128 + signal.SIGTERM
    killer.join()
    printed = "".join(capsys.readouterr())
    assert "SIGTERM: finishing the rows in flight" in printed and "s after SIGTERM: stopping now" in printed, printed
    first = read_output(tmp_path / "out")
    assert 4 <= len(first) < 60 and len({r["id"] for r in first}) == len(first)
    assert not list((tmp_path / "out" / ".tmp").iterdir())
    assert run_inprocess(tmp_path, *args, monkeypatch=monkeypatch) == 0
    rows = read_output(tmp_path / "out")
    assert len(rows) == len({r["id"] for r in rows}) == 60
