"""The test cluster's processes: each daemon spawned in its own session with its PID and start time recorded
in ROOT/pids.json, waits until it is ready, and the end of a daemon (SIGTERM, then SIGKILL) by that record."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from cluster_common import ClusterError


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


def record(root: Path, name: str, pid: int) -> None:
    path = root / "pids.json"
    pids = json.loads(path.read_text()) if path.exists() else {}
    pids[name] = {"pid": pid, "start": start_time(pid)}
    path.write_text(json.dumps(pids, indent=2) + "\n")


def spawn(root: Path, name: str, args: list[str]) -> subprocess.Popen:
    """Start a daemon in the foreground of its own session, stdin/stdout/stderr away from the caller
    (munged otherwise holds the caller's pipe open), and record its PID."""
    log = open(root / "log" / f"{name}.out", "ab")
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "SLURM_CONF": str(root / "etc" / "slurm.conf")},
                            start_new_session=True)
    log.close()
    record(root, name, proc.pid)
    return proc


def wait_until(what: str, check, proc: subprocess.Popen | None, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        if proc is not None and proc.poll() is not None:
            raise ClusterError(f"{what}: exited with {proc.returncode}; see {log}:\n{tail(log)}")
        if time.monotonic() > deadline:
            raise ClusterError(f"{what}: not ready after {timeout:.0f} s; see {log}:\n{tail(log)}")
        time.sleep(0.2)


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def quiet(args: list[str], env: dict | None = None, timeout: float = 10) -> bool:
    try:
        return subprocess.run(args, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=timeout).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def node_state(env: dict) -> str | None:
    proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=env, capture_output=True, text=True, timeout=10)
    return proc.stdout.strip() if proc.returncode == 0 else None


def running(root: Path) -> list[str]:
    """Names of the recorded daemons that are still the same running processes."""
    path = Path(root) / "pids.json"
    pids = json.loads(path.read_text()) if path.exists() else {}
    return [name for name, p in pids.items() if p["start"] is not None and start_time(p["pid"]) == p["start"]]


def step_daemons(root: Path) -> list[int]:
    """PIDs of the slurmstepd processes started by this cluster's slurmd (they inherit its SLURM_CONF)."""
    mark = f"SLURM_CONF={root / 'etc' / 'slurm.conf'}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "cmdline").read_bytes().startswith(b"slurmstepd") and \
                    mark in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def terminate(p: dict, grace: float) -> None:
    pid, started = p["pid"], p["start"]
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if start_time(pid) != started:
            break
        os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while start_time(pid) == started and time.monotonic() < deadline:
            reap(pid)
            time.sleep(0.1)
    reap(pid)


def reap(pid: int) -> None:
    """Collect the exit status if the daemon is our own child (started in this process)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
