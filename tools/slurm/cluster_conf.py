"""The test cluster's configuration: free ports, and slurm.conf, slurmdbd.conf and MariaDB's init.sql under ROOT
(the settings that matter on SLURM 22.05 are listed in cluster.py's docstring)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from cluster_common import CLUSTER_NAME, DB_PASS, DB_USER, PARTITION, ClusterError


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
    """ROOT/etc/slurm.conf, ROOT/etc/slurmdbd.conf (readable by root only) and ROOT/mysql/init.sql."""
    host = socket.gethostname().split(".")[0]
    munge_socket = root / "munge" / "munge.socket"
    auth = f"AuthType=auth/munge\nAuthInfo=socket={munge_socket},cred_expire=5\n"
    memory = max(available_memory_mb() * 8 // 10, 1000)  # below what is free, or slurmd drains the node
    (root / "etc" / "slurm.conf").write_text(slurm_conf(root, ports, host, auth, munge_socket, memory))
    dbd = root / "etc" / "slurmdbd.conf"
    dbd.write_text(slurmdbd_conf(root, ports, auth))
    dbd.chmod(0o600)  # slurmdbd refuses a config that others can read (it holds the DB password)
    (root / "mysql" / "init.sql").write_text(init_sql(host))


def slurm_conf(root: Path, ports: dict[str, int], host: str, auth: str, munge_socket: Path, memory: int) -> str:
    """slurm.conf: one node of every CPU and `memory` MB, one partition, accounting through slurmdbd."""
    return f"""\
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
"""


def slurmdbd_conf(root: Path, ports: dict[str, int], auth: str) -> str:
    """slurmdbd.conf: the accounting daemon, storing in this cluster's MariaDB."""
    return f"""\
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
"""


def init_sql(host: str) -> str:
    """MariaDB's init file: the slurm user. MariaDB's default anonymous ''@localhost user shadows the slurm user
    (error 1045): it is dropped."""
    return f"""\
DROP USER IF EXISTS ''@'localhost';
DROP USER IF EXISTS ''@'{host}';
CREATE USER IF NOT EXISTS '{DB_USER}'@'localhost' IDENTIFIED BY '{DB_PASS}';
CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{DB_PASS}';
GRANT ALL ON slurm_acct_db.* TO '{DB_USER}'@'localhost';
GRANT ALL ON slurm_acct_db.* TO '{DB_USER}'@'127.0.0.1';
FLUSH PRIVILEGES;
"""
