"""What crosses between host and device each round, and the count of it: persistent host/device buffers
(`HostBuffer`), one sync for several device -> host reads (`host_lists`), a wall clock that waits for the device
(`wall`), and the LaunchCounter that counts what a round launches outside captured steps (graphs.py)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Hashable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def wall(device: torch.device) -> float:
    """time.perf_counter() once the device's queued work is done (eager work on a GPU runs ahead of the
    host): what a forward's time is measured with where adaptive speculation prices by it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class HostBuffer:
    """A persistent host/device pair for values that cross to the device every round (vLLM's CpuGpuBuffer):
    `put` writes host values into a (pinned, on a GPU) host tensor and queues one non-blocking copy into
    the device tensor: no host sync and no allocation per call. The host side is a ring of two; before
    a host tensor is written again, the copy that last read it is waited for (an event, normally long
    done), so a copy in flight never reads half-written values."""

    RING = 2

    def __init__(self, shape: Sequence[int], device: torch.device, dtype: torch.dtype = torch.long,
                 into: torch.Tensor | None = None):
        """into: an existing device tensor to write into (e.g. a buffer a captured step reads)."""
        self.device = into if into is not None else torch.zeros(*shape, dtype=dtype, device=device)
        cuda = self.device.device.type == "cuda"
        self._host = [torch.zeros(*self.device.shape, dtype=self.device.dtype, pin_memory=cuda)
                      for _ in range(self.RING if cuda else 1)]
        self._events: list = [None] * len(self._host)
        self._next = 0

    def put(self, values: list, shape: Sequence[int] | None = None) -> torch.Tensor:
        """values: a list (1-D) or nested lists of equal lengths that fit the buffer's leading slice -> the
        device view holding them. shape: the view's shape when values cannot say it (an empty row)."""
        source = torch.tensor(values, dtype=self.device.dtype)
        if shape is not None:
            source = source.reshape(shape)
        index = tuple(slice(0, n) for n in source.shape)
        device = self.device[index]
        if len(self._host) == 1:  # CPU: the "device" is host memory
            device.copy_(source)
            return device
        i, self._next = self._next, (self._next + 1) % len(self._host)
        if self._events[i] is not None:
            self._events[i].synchronize()
        host = self._host[i][index]
        host.copy_(source)
        device.copy_(host, non_blocking=True)
        self._events[i] = torch.cuda.Event()
        self._events[i].record()
        return device


class LaunchCounter(TorchDispatchMode):
    """Counts the aten ops a round dispatches outside captured steps, per phase: on a GPU each is a kernel
    launch (the cost CUDA graphs remove). Views, tensor creation from host values and metadata queries
    launch nothing and are not counted. Inside a step it counts nothing but the replay, and records any
    host sync or data-dependent shape there (a step that has one cannot be captured)."""

    NOT_KERNELS = {"aten.lift_fresh.default", "aten.detach.default", "aten.sym_size.int", "aten.sym_stride.int",
                   "aten.sym_numel.default", "aten.sym_storage_offset.default", "aten.is_same_size.default"}
    DATA_DEPENDENT = {"aten.nonzero.default", "aten.masked_select.default", "aten._unique2.default",
                      "aten.unique_consecutive.default", "aten.repeat_interleave.Tensor"}

    def __init__(self):
        super().__init__()
        self.phase = "other"
        self.ops: dict[str, int] = {}  # phase -> ops dispatched outside steps
        self.replays: dict[str, int] = {}  # phase -> steps run (one launch each on a GPU)
        self.syncs: dict[str, int] = {}  # phase -> device -> host reads
        self.in_step: list[str] = []  # problems inside steps: "key: op"
        self._depth = 0

    @contextmanager
    def step(self, key: Hashable):
        self.replays[self.phase] = self.replays.get(self.phase, 0) + 1
        self._depth += 1
        self._key = key
        try:
            yield
        finally:
            self._depth -= 1

    def note_sync(self) -> None:
        """A device -> host read the dispatcher does not show (tolist)."""
        self.syncs[self.phase] = self.syncs.get(self.phase, 0) + 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if self._depth:
            if name == "aten._local_scalar_dense.default" or name in self.DATA_DEPENDENT or _bool_index(name, args):
                self.in_step.append(f"{self._key}: {name}")
        elif name == "aten._local_scalar_dense.default":
            self.note_sync()
        elif not (func.is_view or name in self.NOT_KERNELS):
            self.ops[self.phase] = self.ops.get(self.phase, 0) + 1
        return func(*args, **(kwargs or {}))


def _bool_index(name: str, args) -> bool:
    """Indexing with a bool mask: its output shape depends on the data (a hidden nonzero)."""
    if name not in ("aten.index.Tensor", "aten.index_put_.default", "aten.index_put.default"):
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ()) if i is not None)


def host_lists(*tensors: torch.Tensor | None, counter: LaunchCounter | None = None) -> list:
    """[t.tolist() for t in tensors] (None stays None) with one device -> host sync: the copies are queued
    into pinned memory, then one wait. The counter notes the sync (the dispatcher cannot see tolist)."""
    if counter is not None:
        counter.note_sync()
    if any(t is not None and t.device.type == "cuda" for t in tensors):
        host = [t.to("cpu", non_blocking=True) if t is not None else None for t in tensors]
        torch.cuda.current_stream().synchronize()
        tensors = tuple(host)
    return [t.tolist() if t is not None else None for t in tensors]
