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
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CLUSTER_NAME = "batchspec"
PARTITION = "debug"
DB_USER = DB_PASS = "slurm"
DAEMONS = ("slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd", "mariadb-install-db")
REQUIRED = ("munged", "munge", "mariadbd", "mariadb-install-db", "slurmdbd", "slurmctld", "slurmd", "sbatch",
            "squeue", "sacct", "scontrol", "sinfo")


class ClusterError(RuntimeError):
    """The cluster could not be started; the message says which daemon and where its log is."""


@dataclass
class Cluster:
    root: Path

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    def env(self, base: dict | None = None) -> dict:
        """An environment for SLURM commands (and the jobs they submit) that talks to this cluster."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        """A SLURM command against this cluster, e.g. cluster.run("squeue", "-h")."""
        proc = subprocess.run(list(args), env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise ClusterError(f"{' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}")
        return proc


def missing_programs() -> list[str]:
    return [p for p in REQUIRED if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]


def program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


# ---- configuration ------------------------------------------------------------------------------


def free_ports(names: tuple[str, ...]) -> dict[str, int]:
    """A distinct free TCP port for each name (all sockets stay bound until every port is chosen)."""
    sockets = [socket.socket() for _ in names]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return {name: s.getsockname()[1] for name, s in zip(names, sockets)}
    finally:
        for s in sockets:
            s.close()


def available_memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    raise ClusterError("no MemAvailable in /proc/meminfo")


def write_configs(root: Path, ports: dict[str, int]) -> None:
    host = socket.gethostname().split(".")[0]
    munge_socket = root / "munge" / "munge.socket"
    auth = f"AuthType=auth/munge\nAuthInfo=socket={munge_socket},cred_expire=5\n"
    memory = max(available_memory_mb() * 8 // 10, 1000)  # below what is free, or slurmd drains the node
    (root / "etc" / "slurm.conf").write_text(f"""\
# Written by tools/slurm/cluster.py: a single-node test cluster under {root}
ClusterName={CLUSTER_NAME}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ports['slurmctld']}
SlurmdPort={ports['slurmd']}
SlurmUser=root
SlurmdUser=root
{auth}CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
SchedulerParameters=sched_interval=1
ReturnToService=2
MailProg=/bin/true
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={ports['slurmdbd']}
# AccountingStoragePass is the munge socket for talking to slurmdbd
AccountingStoragePass={munge_socket}
JobCompType=jobcomp/none
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory={memory} State=UNKNOWN
PartitionName={PARTITION} Nodes={host} Default=YES MaxTime=INFINITE State=UP
""")
    dbd = root / "etc" / "slurmdbd.conf"
    dbd.write_text(f"""\
{auth}DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={ports['slurmdbd']}
SlurmUser=root
LogFile={root}/log/slurmdbd.log
PidFile={root}/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={ports['mariadb']}
StorageUser={DB_USER}
StoragePass={DB_PASS}
StorageLoc=slurm_acct_db
""")
    dbd.chmod(0o600)  # slurmdbd refuses a config that others can read (it holds the DB password)
    # MariaDB's default anonymous ''@localhost user shadows the slurm user (error 1045): drop it.
    (root / "mysql" / "init.sql").write_text(f"""\
DROP USER IF EXISTS ''@'localhost';
DROP USER IF EXISTS ''@'{host}';
CREATE USER IF NOT EXISTS '{DB_USER}'@'localhost' IDENTIFIED BY '{DB_PASS}';
CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{DB_PASS}';
GRANT ALL ON slurm_acct_db.* TO '{DB_USER}'@'localhost';
GRANT ALL ON slurm_acct_db.* TO '{DB_USER}'@'127.0.0.1';
FLUSH PRIVILEGES;
""")


# ---- processes ----------------------------------------------------------------------------------


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


# ---- lifecycle ----------------------------------------------------------------------------------


def start(root: Path, timeout: float = 90) -> Cluster:
    """Start a fresh single-node cluster under `root` (created; must not hold a running one)."""
    root = Path(root).resolve()
    if missing := missing_programs():
        raise ClusterError(f"not installed: {', '.join(missing)} (run tools/slurm/install.sh as root)")
    if os.geteuid() != 0:
        raise ClusterError("the test cluster runs its daemons as root (SlurmUser=root); run as root")
    if (root / "pids.json").exists() and running(root):
        raise ClusterError(f"{root} already has running daemons ({', '.join(running(root))}); stop it first")
    for d in ("etc", "munge", "mysql/data", "mysql/tmp", "state", "spool", "run", "log"):
        (root / d).mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # munged checks that no one else can write the dirs above its socket and key
    (root / "pids.json").unlink(missing_ok=True)
    ports = free_ports(("slurmctld", "slurmd", "slurmdbd", "mariadb"))
    write_configs(root, ports)
    log = root / "log"
    env = Cluster(root).env()

    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    sock = root / "munge" / "munge.socket"
    munged = spawn(root, "munged", [program("munged"), "--foreground", "--force", f"--socket={sock}",
                                    f"--key-file={key}", f"--pid-file={root}/run/munged.pid",
                                    f"--log-file={log}/munged.log", f"--seed-file={root}/munge/munged.seed"])
    wait_until("munged", lambda: sock.exists() and quiet(["sh", "-c", f"munge -n -S {sock} | unmunge -S {sock}"]),
               munged, log / "munged.out", timeout)

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

    slurmdbd = spawn(root, "slurmdbd", [program("slurmdbd"), "-D"])
    wait_until("slurmdbd", lambda: port_open(ports["slurmdbd"]), slurmdbd, log / "slurmdbd.log", timeout)

    slurmctld = spawn(root, "slurmctld", [program("slurmctld"), "-D", "-i", "-f", str(root / "etc" / "slurm.conf")])
    wait_until("slurmctld", lambda: quiet(["scontrol", "ping"], env), slurmctld, log / "slurmctld.log", timeout)

    slurmd = spawn(root, "slurmd", [program("slurmd"), "-D", "-f", str(root / "etc" / "slurm.conf")])
    wait_until("slurmd (node idle)", lambda: node_state(env) == "idle", slurmd, log / "slurmd.log", timeout)
    return Cluster(root)


def node_state(env: dict) -> str | None:
    proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=env, capture_output=True, text=True, timeout=10)
    return proc.stdout.strip() if proc.returncode == 0 else None


def running(root: Path) -> list[str]:
    """Names of the recorded daemons that are still the same running processes."""
    path = Path(root) / "pids.json"
    pids = json.loads(path.read_text()) if path.exists() else {}
    return [name for name, p in pids.items() if p["start"] is not None and start_time(p["pid"]) == p["start"]]


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
