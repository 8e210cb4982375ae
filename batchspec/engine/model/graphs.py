"""Static-shape steps: run eagerly, as they would be captured, captured into CUDA graphs, or compiled.

A *step* is a function that reads and writes only the tensors it is given (buffers that live as long
as the generator: inputs copied in before it runs, outputs read after) and takes every shape from its
key: a model forward of T tokens over a length bucket, a round's acceptance, a prefill chunk. Nothing
it allocates outlives it, so its outputs are never views into a graph's memory. `StepGraphs` runs a
step by key, in one of four modes:

  - None (eager): call it;
  - "static": call it, counted by a LaunchCounter as one replay: the CPU stand-in for a captured step,
    so that the test suite runs the captured code paths and can count what a GPU would launch outside
    graphs;
  - "cuda_graphs": every declared step is captured when `capture_all` runs at start, largest first,
    into one memory pool that every graph of the generator shares (a graph's temporaries are free once
    its capture ends, so the next capture reuses them; graphs never run concurrently), and replayed
    after; a step run with other tensors than it was captured with has them copied in first;
  - "inductor" (CPU opt-in): steps declared `compile=True` (model forwards) run through
    torch.compile(fullgraph=True, dynamic=False), compiled on first use; the rest run as in "static";
  - "cuda_inductor" (GPU opt-in, gpt-fast's recipe): as "cuda_graphs", except that steps declared
    `compile=True` are compiled by inductor, which fuses a forward's small kernels, and captured the first
    time they run (a compile per shape takes tens of seconds, so only the shapes a job uses pay it).

A capture that fails raises CaptureError: one line naming the step and the error (never a silent slow
path). A step that was never declared runs eagerly with one warning per key.
"""

from __future__ import annotations

import gc
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Hashable

import torch

from .host_device import LaunchCounter

log = logging.getLogger("batchspec")

CAPTURE_MODES = (None, "static", "cuda_graphs", "inductor", "cuda_inductor")
CAPTURED = ("cuda_graphs", "cuda_inductor")  # modes that replay CUDA graphs
# Every inductor step compiles the same code object (a runner's `_step`, its shape fixed by the partial's
# arguments), and dynamo counts each (width, bucket) as a recompile of that object, across all runners in
# the process: past torch's default of 8, fullgraph=True turns that into a hard failure. Each key is one
# deliberate specialization, so the limit is raised while ours compile.
RECOMPILE_LIMIT = 4096


class CaptureError(ValueError):
    """The captured steps cannot be made (a capture failed, or they do not fit the memory budget): a setup
    error, one line naming the step or the sizes, the error and what to do."""


def resolve_capture(compile: str | bool | None, device: torch.device) -> str | None:
    """The capture mode for a `compile=` setting: auto (CUDA graphs on a GPU, eager on CPU, where an eager
    forward is not launch-bound), on (CUDA graphs; torch.compile on CPU), inductor (the forwards compiled by
    torch.compile, then captured into CUDA graphs, on first use; on CPU as on), off (eager), static (the
    static shapes of the captured path, run without capturing: for tests and launch counts)."""
    if compile in (None, "auto"):
        return "cuda_graphs" if device.type == "cuda" else None
    if compile in (False, "off"):
        return None
    if compile in (True, "on"):
        return "cuda_graphs" if device.type == "cuda" else "inductor"
    if compile == "inductor":
        return "cuda_inductor" if device.type == "cuda" else "inductor"
    if compile == "static":
        return "static"
    raise ValueError(f"compile={compile!r}: choose auto, on, inductor, off or static")


@dataclass(slots=True)
class _Declared:
    fn: Callable[..., None]
    args: tuple[torch.Tensor | None, ...]
    size: int  # an ordering hint: larger steps are captured first
    compile: bool


@dataclass(slots=True)
class _Graph:
    graph: "torch.cuda.CUDAGraph"
    args: tuple[torch.Tensor, ...]


class StepGraphs:
    """Runs static-shape steps by key in one capture mode (module docstring). One per generator: the
    target's and the draft's runners and the acceptance share its memory pool and its counter."""

    def __init__(self, mode: str | None, device: torch.device, counter: LaunchCounter | None = None):
        if mode not in CAPTURE_MODES:
            raise ValueError(f"capture={mode!r}: choose one of {CAPTURE_MODES}")
        if mode in CAPTURED and device.type != "cuda":
            raise ValueError(f"capture={mode!r} needs a CUDA device")
        self.mode, self.device, self.counter = mode, device, counter
        self.declared: dict[Hashable, _Declared] = {}
        self.graphs: dict[Hashable, _Graph] = {}
        self.compiled: dict[Hashable, Callable] = {}
        self.capture_s = 0.0  # seconds spent capturing or compiling
        self._pool = None
        self._warned: set[Hashable] = set()
        self._lazy_told = 0

    @property
    def static(self) -> bool:
        """Steps run over every slot at static shapes (any mode but eager)."""
        return self.mode is not None

    def declare(self, key: Hashable, fn: Callable[..., None], args: tuple[torch.Tensor, ...], *, size: int = 0,
                compile: bool = False) -> None:
        """A step the job may run: captured by `capture_all` (cuda_graphs), compiled on first use (inductor,
        when `compile`). args are the buffers it will be run with."""
        if self.mode is not None:
            self.declared[key] = _Declared(fn, tuple(args), size, compile)

    def capture_all(self, reset: Callable[[], None] = lambda: None) -> None:
        """Capture every declared step not yet captured, largest first (cuda_graphs; in cuda_inductor the steps
        not compiled). Capturing runs each step twice (a warm-up, then the capture) on whatever its buffers
        hold: `reset` restores the state the steps wrote (lengths) afterwards."""
        if self.mode not in CAPTURED:
            return
        todo = sorted((k for k in self.declared if k not in self.graphs and not self._lazy(k)),
                      key=lambda k: -self.declared[k].size)
        started = time.perf_counter()
        with _no_gc():
            for key in todo:
                self.graphs[key] = self._capture(key, self.declared[key].fn, self.declared[key].args)
        reset()
        torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - started
        self.capture_s += seconds
        if todo:
            log.info("captured %d steps in %.1f s (%d in all)", len(todo), seconds, len(self.graphs))
        lazy = sum(1 for k in self.declared if k not in self.graphs and self._lazy(k))
        if lazy > self._lazy_told:  # once per new set of declared steps, not per call
            self._lazy_told = lazy
            log.info("compile=inductor: %d forward shapes are compiled the first time each runs (tens of seconds "
                     "each for a large model; compile=on captures them all now without compiling)", lazy)

    def _lazy(self, key: Hashable) -> bool:
        """Compiled, then captured, the first time it runs (cuda_inductor)."""
        return self.mode == "cuda_inductor" and self.declared[key].compile

    def _capture(self, key: Hashable, fn: Callable[..., None], args: tuple) -> _Graph:
        try:
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            # warm-up: lazy inits, cuBLAS handles, and a compiled step's compile and autotuning
            with torch.cuda.stream(stream), torch.inference_mode(), _recompiles():
                fn(*args)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.inference_mode(), torch.cuda.graph(graph, pool=self._pool), _recompiles():
                fn(*args)
            self._pool = graph.pool()
            return _Graph(graph, args)
        except Exception as e:  # noqa: BLE001 - any failure: one line naming the step, then stop
            first = (str(e).splitlines() or [""])[0][:200]
            raise CaptureError(f"capturing step {key} failed ({type(e).__name__}: {first}); run with compile=off "
                               "(model.compile=off in a job) to use eager forwards instead") from e

    def run(self, key: Hashable, fn: Callable[..., None], args: tuple[torch.Tensor, ...]) -> None:
        """Run step `key` (fn with args, its shapes fixed by the key)."""
        if self.mode is None:
            fn(*args)
            return
        counting = self.counter.step(key) if self.counter is not None else _nothing()
        graph = self.graphs.get(key)
        if graph is None and key in self.declared and self._lazy(key):
            graph = self.graphs[key] = self._compile_and_capture(key, args)
        with counting:
            if graph is not None:
                _copy_into(graph.args, args)
                graph.graph.replay()
                return
            declared = self.declared.get(key)
            if declared is None and self.mode in (*CAPTURED, "inductor") and key not in self._warned:
                self._warned.add(key)
                log.warning("step %s was not declared, so not captured at start: it runs eagerly (slower than "
                            "the captured ones)", key)
            if self.mode == "inductor" and declared is not None and declared.compile:
                compiled = self.compiled.get(key)
                started = time.perf_counter() if compiled is None else None
                if compiled is None:
                    compiled = self.compiled[key] = torch.compile(fn, fullgraph=True, dynamic=False)
                with _recompiles():
                    compiled(*args)
                if started is not None:
                    self.capture_s += time.perf_counter() - started
                return
            fn(*args)

    def _compile_and_capture(self, key: Hashable, args: tuple) -> _Graph:
        """cuda_inductor: compile a step at its first run and capture the compiled step on its declared buffers
        (which outlive the graph) into the shared pool. The run's inputs are copied in first, so the warm-up
        and the capture write what the run writes (cache entries where the run's plan puts them, not where
        stale inputs would), and the replay that follows writes the same again."""
        started = time.perf_counter()
        log.info("compiling step %s (inductor, once per shape)", key)
        declared = self.declared[key]
        _copy_into(declared.args, args)
        compiled = torch.compile(declared.fn, fullgraph=True, dynamic=False)
        with _no_gc():
            graph = self._capture(key, compiled, declared.args)
        torch.cuda.synchronize(self.device)
        self.capture_s += time.perf_counter() - started
        return graph


def _copy_into(buffers: tuple, given: tuple) -> None:
    """A step's buffers take the tensors it is run with, where those are other tensors (None: nothing)."""
    for buffer, tensor in zip(buffers, given):
        if tensor is not None and buffer is not None and tensor.data_ptr() != buffer.data_ptr():
            buffer.copy_(tensor)


@contextmanager
def _no_gc():
    """A garbage collection during a capture that frees an earlier engine's graphs (a cycle holding a
    CUDAGraph) resets them mid-capture, which invalidates the capture: collect first, then hold it off."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _recompiles():
    return torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT, accumulated_recompile_limit=RECOMPILE_LIMIT)


@contextmanager
def _nothing():
    yield
