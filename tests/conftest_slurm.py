"""A real single-node SLURM cluster for the `slurm` tests, started once per session.

Import explicitly: `from conftest_slurm import slurm_cluster, Slurm`.

The fixture installs Debian's slurm-wlm, munge, slurmdbd and mariadb-server with
tools/slurm/install.sh when they are missing, starts munged -> mariadbd -> slurmdbd -> slurmctld ->
slurmd under a session temp dir (tools/slurm/cluster.py), waits for the node to be idle, and stops the
daemons by PID at the end. It skips, saying why, only where SLURM cannot be installed: not root, or
no apt-get, or the install failed. A cluster that is installed but does not start is a test error.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest_jobs import REPO, cli_env

TOOLS = REPO / "tools" / "slurm"
_spec = importlib.util.spec_from_file_location("batchspec_slurm_cluster", TOOLS / "cluster.py")
cluster_tools = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cluster_tools)


@dataclass
class Slurm:
    """The running test cluster and helpers to submit to it as a user would."""

    cluster: object  # cluster_tools.Cluster
    start_s: float  # seconds the daemons took to come up
    install_s: float | None  # seconds the package install took, None when already installed

    def env(self, extra: dict | None = None) -> dict:
        """The job runner's test environment plus SLURM_CONF, with this interpreter's bin/ first on
        PATH so that `python` inside a job is the one running the tests."""
        env = cli_env(extra)
        env["SLURM_CONF"] = str(self.cluster.conf)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        return env

    def cmd(self, *args: str, cwd: Path | None = None, check: bool = True, timeout: float = 60):
        proc = subprocess.run(list(args), cwd=cwd, env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def sbatch(self, workdir: Path, *args: str) -> str:
        """Submit from `workdir`; returns the job id (of the array)."""
        return self.cmd("sbatch", "--parsable", *args, cwd=workdir).stdout.strip().split(";")[0]

    def queued(self, job: str) -> list[str]:
        """`JOBID STATE` of the job's tasks still pending, running or completing."""
        proc = self.cmd("squeue", "-h", "-j", job, "-o", "%i %T", check=False)
        return proc.stdout.split("\n") if proc.returncode == 0 and proc.stdout.strip() else []

    def wait_done(self, job: str, timeout: float = 300) -> float:
        """Wait until no task of the job is queued or running; returns the seconds waited."""
        started = time.monotonic()
        while self.queued(job):
            if time.monotonic() - started > timeout:
                raise AssertionError(f"job {job} still queued after {timeout:.0f} s: {self.queued(job)}\n"
                                     + self.cmd("scontrol", "show", "job", job, check=False).stdout)
            time.sleep(0.5)
        return time.monotonic() - started

    def states(self, job: str, timeout: float = 30) -> dict[str, str]:
        """Final accounting state of each array task (the last record of a requeued task wins), from
        sacct, which lags squeue by a moment: waits until no task is pending, running or completing."""
        deadline = time.monotonic() + timeout
        while True:
            out = self.cmd("sacct", "-n", "-X", "-P", "-j", job, "-o", "JobID,State").stdout
            states = dict(line.split("|") for line in out.splitlines() if line)
            live = {k: v for k, v in states.items() if v in ("PENDING", "RUNNING", "COMPLETING", "REQUEUED")}
            if not live or time.monotonic() > deadline:
                return states
            time.sleep(0.5)


def _install() -> float | None:
    missing = cluster_tools.missing_programs()
    if not missing:
        return None
    if os.geteuid() != 0:
        pytest.skip(f"SLURM is not installed ({', '.join(missing)}) and installing it needs root")
    if shutil.which("apt-get") is None:
        pytest.skip(f"SLURM is not installed ({', '.join(missing)}) and there is no apt-get to install it")
    started = time.perf_counter()
    proc = subprocess.run(["bash", str(TOOLS / "install.sh")], capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        why = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
        pytest.skip(f"could not install SLURM with tools/slurm/install.sh (exit {proc.returncode}): {why[0]}")
    return time.perf_counter() - started


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    install_s = _install()
    if os.geteuid() != 0:
        pytest.skip("the test cluster runs slurmctld, slurmd and munged as root (SlurmUser=root); not root")
    root = tmp_path_factory.mktemp("slurm")
    started = time.perf_counter()
    try:
        cluster = cluster_tools.start(root)
    except BaseException:
        cluster_tools.stop(root)
        raise
    slurm = Slurm(cluster, time.perf_counter() - started, install_s)
    print(f"\nslurm cluster up in {slurm.start_s:.1f} s under {root}"
          + (f" (packages installed in {install_s:.0f} s)" if install_s is not None else ""))
    yield slurm
    stopped = cluster_tools.stop(root)
    assert not cluster_tools.running(root), f"daemons still running after stop: {cluster_tools.running(root)}"
    assert not cluster_tools.step_daemons(root), "slurmstepd processes left after stop"
    print(f"\nslurm cluster stopped: {', '.join(stopped)}")


def log_times(text: str, pattern: str) -> list[float]:
    """Epoch seconds of the `YYYY-MM-DD HH:MM:SS[,mmm]` stamps on the lines of `text` that match `pattern`."""
    stamps = []
    for line in text.splitlines():
        if re.search(pattern, line) and (m := re.search(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:[,.](\d+))?", line)):
            fraction = float(f"0.{m.group(2)}") if m.group(2) else 0.0
            stamps.append(time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + fraction)
    return stamps
