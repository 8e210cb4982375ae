"""One writer per shard: an exclusive lock held for the whole run of a shard.

Two runs of one shard into one output dir (a double-submitted SLURM task, a cron job overlapping
itself) would both skip the same done rows and write the same rows again, and each would delete the
other's temp files. So a run takes `.locks/shard-I-of-N.lock` with flock(LOCK_EX | LOCK_NB) before it
reads anything and holds it until it exits; a second run is refused with one line naming the holder.
The kernel drops the lock when its holder exits in any way (kill -9 included), so a stale lock
file never blocks a rerun.

Shards of different shard counts split the rows differently, so they must not run at the same time
either: a run also holds a shared lock on `.locks/count-N.lock` and makes sure no run holds one for
another count. Every run takes its own shared lock before it looks for others, so of two runs
starting together at least one sees the other.

flock is advisory and local to one kernel on some network filesystems; where the filesystem does not
support it the run goes on with a warning.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import time
from pathlib import Path

from .config import ConfigError
from .layout import shard_name

log = logging.getLogger("batchspec")
UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)


class ShardLock:
    """`with ShardLock(out_dir, index, count):` — raises ConfigError if another run holds the shard,
    or runs a different shard count, in this output dir."""

    def __init__(self, out_dir: Path, index: int, count: int):
        self.dir = Path(out_dir) / ".locks"
        self.shard_path = self.dir / f"{shard_name(index, count)}.lock"
        self.count_path = self.dir / f"count-{count:05d}.lock"
        self.index, self.count = index, count
        self.fds: list[int] = []

    def __enter__(self) -> "ShardLock":
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            self._acquire()
        except BaseException:
            self.release()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        for fd in reversed(self.fds):
            os.close(fd)  # closing the descriptor drops its lock
        self.fds = []

    def _acquire(self) -> None:
        fd = self._open(self.shard_path)
        if not self._lock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB):
            holder = self.shard_path.read_text(errors="replace").strip() or "another process"
            raise ConfigError(f"{self.dir.parent}: shard {self.index} of {self.count} is being written by another "
                              f"run ({holder}); a second writer would duplicate its rows, so this run stops")
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
                 .encode())
        fd = self._open(self.count_path)
        self._lock(fd, fcntl.LOCK_SH)  # blocks only while another run probes it (below), a moment
        for other in sorted(self.dir.glob("count-*.lock")):
            if other == self.count_path:
                continue
            probe = os.open(other, os.O_RDONLY)
            try:
                if not self._lock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB):
                    raise ConfigError(f"{self.dir.parent} is being written by a run with shard.count="
                                      f"{int(other.stem.split('-')[1])} (this one has shard.count={self.count}); "
                                      "shard counts split the rows differently, so they cannot run at the same time")
            finally:
                os.close(probe)

    def _open(self, path: Path) -> int:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.fds.append(fd)
        return fd

    def _lock(self, fd: int, how: int) -> bool:
        """True when locked (or locking is unsupported here), False when another process holds it."""
        try:
            fcntl.flock(fd, how)
            return True
        except BlockingIOError:
            return False
        except OSError as e:
            if e.errno not in UNSUPPORTED:
                raise
            log.warning("cannot lock %s (%s): this filesystem does not support flock, so a second run of "
                        "the same shard would not be refused", self.dir, e.strerror)
            return True


class DirLock:
    """`with DirLock(out_dir):` — an exclusive lock on `.locks/job.lock`, held only while a run compares
    its config with job.json and writes it, so that of two runs starting together (shards of one array
    with different settings) the second sees what the first wrote. Waits for the holder: a moment."""

    def __init__(self, out_dir: Path):
        self.path = Path(out_dir) / ".locks" / "job.lock"
        self.fd: int | None = None

    def __enter__(self) -> "DirLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError as e:
            if e.errno not in UNSUPPORTED:
                os.close(self.fd)
                raise
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)  # closing the descriptor drops its lock


def other_runs(out_dir: Path, index: int, count: int) -> list[str]:
    """The shard locks of this output dir that another run holds now (their holders' lines), this
    shard's own left out: a run that holds one is running, whatever its shard count."""
    own = f"{shard_name(index, count)}.lock"
    holders = []
    for path in sorted((Path(out_dir) / ".locks").glob("shard-*.lock")):
        if path.name == own:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holders.append(path.read_text(errors="replace").strip() or "another process")
        except OSError as e:
            if e.errno not in UNSUPPORTED:
                raise
        finally:
            os.close(fd)  # drops the probe's lock, if it got it
    return holders
