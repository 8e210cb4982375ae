"""A single-node SLURM cluster under one temporary root, for the test suite and for trying things out.

    python tools/slurm/cluster.py start /tmp/slurm-test     # prints `export SLURM_CONF=...`
    export SLURM_CONF=/tmp/slurm-test/etc/slurm.conf
    sbatch --array=0-2 --cpus-per-task=1 --mem=1G jobs/slurm_array.sh job=demo
    python tools/slurm/cluster.py stop /tmp/slurm-test

start() writes slurm.conf / slurmdbd.conf under ROOT and runs, in this order and each in the
foreground of its own session: munged -> mariadbd -> slurmdbd -> slurmctld -> slurmd, then waits until
the node is idle. mariadbd + slurmdbd are there so that `sacct` works: submitit learns the state of a
killed job only from sacct. Every daemon's PID (and start time, so a reused PID is never hit) is
recorded in ROOT/pids.json as soon as it starts; stop() sends SIGTERM, then SIGKILL to whatever is
still running after a few seconds (slurmd ignores SIGTERM while it retries a dead controller).

Everything runs as root (SlurmUser=root, SlurmdUser=root), on free TCP ports, with its state, spool,
pid and log files under ROOT; jobs and commands find the cluster only through SLURM_CONF. The daemons
come from Debian's slurm-wlm, slurmdbd, munge and mariadb-server (tools/slurm/install.sh). Settings
that matter on SLURM 22.05: auth/munge (22.05 has no auth/slurm) with cred_expire=5 (a requeued job
otherwise waits ~120 s before it may start again), proctrack/linuxproc and task/none (no cgroups),
select/cons_tres with CR_Core_Memory and DefMemPerCPU (otherwise every job claims the whole node and
array tasks run one at a time), sched_interval=1, ReturnToService=2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # the cluster_* modules beside this script (the tests
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # load this file by its path)

# The parts live beside this file, one module each: cluster_common (names, Cluster, ClusterError),
# cluster_conf (ports, config files), cluster_procs (daemons by PID). Their public names are handed on here.
from cluster_common import (CLUSTER_NAME, DAEMONS, DB_PASS, DB_USER, PARTITION, REQUIRED, Cluster,  # noqa: E402
                            ClusterError, missing_programs, program)
from cluster_conf import available_memory_mb, free_ports, write_configs  # noqa: E402
from cluster_procs import (node_state, port_open, quiet, reap, record, running, spawn, start_time,  # noqa: E402
                           step_daemons, tail, terminate, wait_until)

__all__ = ["CLUSTER_NAME", "DAEMONS", "DB_PASS", "DB_USER", "PARTITION", "REQUIRED", "Cluster", "ClusterError",
           "available_memory_mb", "drain", "free_ports", "main", "missing_programs", "node_state", "port_open",
           "program", "quiet", "reap", "record", "running", "spawn", "start", "start_time", "step_daemons", "stop",
           "tail", "terminate", "wait_until", "write_configs"]


# ---- start ---------------------------------------------------------------------------------------


def start(root: Path, timeout: float = 90) -> Cluster:
    """Start a fresh single-node cluster under `root` (created; must not hold a running one)."""
    root = Path(root).resolve()
    check_can_start(root)
    ports = prepare(root)
    env = Cluster(root).env()
    start_munged(root, timeout)
    start_mariadbd(root, ports, timeout)
    start_slurm(root, ports, env, timeout)
    return Cluster(root)


def check_can_start(root: Path) -> None:
    """The programs are there, this runs as root, and ROOT holds no running cluster."""
    if missing := missing_programs():
        raise ClusterError(f"not installed: {', '.join(missing)} (run tools/slurm/install.sh as root)")
    if os.geteuid() != 0:
        raise ClusterError("the test cluster runs its daemons as root (SlurmUser=root); run as root")
    if (root / "pids.json").exists() and running(root):
        raise ClusterError(f"{root} already has running daemons ({', '.join(running(root))}); stop it first")


def prepare(root: Path) -> dict[str, int]:
    """ROOT's folders, free ports and config files; returns the ports by daemon."""
    for d in ("etc", "munge", "mysql/data", "mysql/tmp", "state", "spool", "run", "log"):
        (root / d).mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # munged checks that no one else can write the dirs above its socket and key
    (root / "pids.json").unlink(missing_ok=True)
    ports = free_ports(("slurmctld", "slurmd", "slurmdbd", "mariadb"))
    write_configs(root, ports)
    return ports


def start_munged(root: Path, timeout: float) -> None:
    """munged on its own key and socket under ROOT/munge; ready once a credential round-trips."""
    log = root / "log"
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    sock = root / "munge" / "munge.socket"
    munged = spawn(root, "munged", [program("munged"), "--foreground", "--force", f"--socket={sock}",
                                    f"--key-file={key}", f"--pid-file={root}/run/munged.pid",
                                    f"--log-file={log}/munged.log", f"--seed-file={root}/munge/munged.seed"])
    wait_until("munged", lambda: sock.exists() and quiet(["sh", "-c", f"munge -n -S {sock} | unmunge -S {sock}"]),
               munged, log / "munged.out", timeout)


def start_mariadbd(root: Path, ports: dict[str, int], timeout: float) -> None:
    """MariaDB (slurmdbd's storage) on its port, its data under ROOT/mysql (installed there on the first start)."""
    log = root / "log"
    datadir = root / "mysql" / "data"
    # Its own temp dir, not /tmp: a bootstrap once failed on a temp table that vanished from the shared /tmp
    # ("Could not remove temporary table '/tmp/#sql-temptable-...'", during a full test run).
    tmpdir = root / "mysql" / "tmp"
    if not (datadir / "mysql").is_dir():
        install = subprocess.run([program("mariadb-install-db"), "--no-defaults", f"--datadir={datadir}",
                                  f"--tmpdir={tmpdir}", "--user=root", "--skip-test-db",
                                  "--auth-root-authentication-method=socket"],
                                 stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        if install.returncode != 0:
            raise ClusterError(f"mariadb-install-db: exit {install.returncode}: {install.stderr.strip()[-2000:]}")
    mariadbd = spawn(root, "mariadbd", [
        program("mariadbd"), "--no-defaults", f"--datadir={datadir}", f"--tmpdir={tmpdir}", "--user=root",
        "--bind-address=127.0.0.1",
        f"--port={ports['mariadb']}", f"--socket={root}/mysql/mysqld.sock", f"--pid-file={root}/run/mariadbd.pid",
        f"--init-file={root}/mysql/init.sql", f"--log-error={log}/mariadbd.log", "--skip-log-bin",
        "--innodb-buffer-pool-size=64M"])
    wait_until("mariadbd", lambda: port_open(ports["mariadb"]), mariadbd, log / "mariadbd.log", timeout)


def start_slurm(root: Path, ports: dict[str, int], env: dict, timeout: float) -> None:
    """slurmdbd, slurmctld and slurmd, each waited for; ready once the node is idle."""
    log = root / "log"
    slurmdbd = spawn(root, "slurmdbd", [program("slurmdbd"), "-D"])
    wait_until("slurmdbd", lambda: port_open(ports["slurmdbd"]), slurmdbd, log / "slurmdbd.log", timeout)

    slurmctld = spawn(root, "slurmctld", [program("slurmctld"), "-D", "-i", "-f", str(root / "etc" / "slurm.conf")])
    wait_until("slurmctld", lambda: quiet(["scontrol", "ping"], env), slurmctld, log / "slurmctld.log", timeout)

    slurmd = spawn(root, "slurmd", [program("slurmd"), "-D", "-f", str(root / "etc" / "slurm.conf")])
    wait_until("slurmd (node idle)", lambda: node_state(env) == "idle", slurmd, log / "slurmd.log", timeout)


# ---- stop ----------------------------------------------------------------------------------------


def stop(root: Path, grace: float = 10) -> list[str]:
    """Cancel the jobs left in the queue, then stop the daemons recorded in ROOT/pids.json (controller
    first): SIGTERM, then SIGKILL after `grace` seconds; then any job step daemon (slurmstepd) of this
    cluster that is still there. Returns the names of the daemons that were running."""
    root = Path(root).resolve()
    path = root / "pids.json"
    if not path.exists():
        return []
    pids = json.loads(path.read_text())
    alive = running(root)
    if "slurmctld" in alive and "slurmd" in alive:
        drain(Cluster(root), timeout=30)
    order = [name for name in DAEMONS if name in alive]
    for name in order:
        terminate(pids[name], grace)
    for pid in step_daemons(root):  # they outlive slurmd and retry the controller for minutes
        terminate({"pid": pid, "start": start_time(pid)}, grace)
    return order


def drain(cluster: Cluster, timeout: float) -> None:
    """Cancel every job and wait (at most `timeout` s) until slurmd has finished them: a job whose
    program has just exited is still completing, and its slurmstepd is still talking to slurmctld."""
    cluster.run("scancel", f"--partition={PARTITION}", check=False)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queue = cluster.run("squeue", "-h", "-o", "%i", check=False)
        if queue.returncode != 0 or not queue.stdout.strip():
            return
        time.sleep(0.5)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop", "status"):
        print("usage: cluster.py start|stop|status ROOT", file=sys.stderr)
        return 2
    command, root = argv[0], Path(argv[1]).resolve()
    if command == "start":
        started = time.perf_counter()
        try:
            cluster = start(root)
        except ClusterError as e:
            stop(root)
            print(f"cluster.py: error: {e}", file=sys.stderr)
            return 1
        print(f"# cluster up in {time.perf_counter() - started:.1f} s; stop with: {sys.argv[0]} stop {root}",
              file=sys.stderr)
        print(f"export SLURM_CONF={cluster.conf}")
    elif command == "stop":
        stopped = stop(root)
        print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
    else:
        alive = running(root)
        print(f"running: {', '.join(alive) or 'nothing'}")
        return 0 if alive else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
