"""What every part of the test cluster (cluster.py) shares: its names, its error, the handle a started cluster
is known by, and where the SLURM, munge and MariaDB programs are."""

from __future__ import annotations

import os
import shutil
import subprocess
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

