"""Timers. Contenders on one case are timed interleaved: in each round every contender makes one call,
the starting contender rotating from round to round, and a row's time is the median of its rounds. A
drift of the GPU (clocks, temperature, a neighbour) then moves every contender alike instead of
whichever was timed in that stretch.

`timer.time(calls, rounds)` runs `calls[c](i)` for each round i and returns, per contender, its
`rounds` durations in milliseconds."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Protocol, Sequence

Call = Callable[[int], Any]


class ContenderFailed(Exception):
    """A contender raised during interleaved timing (raised by the contender's own wrapper, so any
    timer passes it on); `index` says which one."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(str(error))
        self.index, self.error = index, error


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of no values")
    return float(statistics.median(values))


def round_robin(contenders: int, rounds: int) -> list[tuple[int, int]]:
    """(round, contender) in calling order: every contender once per round, the first one rotating."""
    return [(r, (r + j) % contenders) for r in range(rounds) for j in range(contenders)]


class Timer(Protocol):
    name: str

    def time(self, calls: Sequence[Call], rounds: int) -> list[list[float]]: ...


class TorchEventTimer:
    """torch.cuda.Event pairs on the current stream (the one cutlassfa.forward and SDPA launch on).
    No synchronization between calls: the host runs ahead, so launch overhead is hidden once the
    kernels are longer than it."""

    name = "torch.cuda.Event"

    def time(self, calls: Sequence[Call], rounds: int) -> list[list[float]]:
        import torch

        order = round_robin(len(calls), rounds)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in order]
        for (r, c), (start, end) in zip(order, events):
            start.record()
            calls[c](r)
            end.record()
        torch.cuda.synchronize()
        out: list[list[float]] = [[] for _ in calls]
        for (_, c), (start, end) in zip(order, events):
            out[c].append(start.elapsed_time(end))
        return out


class TorchGraphTimer:
    """Each contender's `calls_per_graph` calls captured into one CUDA graph (torch.cuda.graph), then
    the graphs replayed interleaved and timed by torch.cuda.Event pairs, a call's time being its graph's
    over `calls_per_graph`. This is the GPU time of a call with no host launch cost between calls, as a
    serving loop that replays its decode steps from a graph sees it; back-to-back event timing charges a
    call whose kernels are shorter than its host path for the host's time. The captured calls take
    successive input copies, as back-to-back calls do. First calls (the accuracy sample, the time that
    decides a skip) run eagerly: `eager`."""

    name = "CUDA graph + torch.cuda.Event"

    def __init__(self, calls_per_graph: int = 8) -> None:
        if calls_per_graph < 1:
            raise ValueError("calls_per_graph must be >= 1")
        self.calls_per_graph = calls_per_graph
        self.eager = TorchEventTimer()

    def time(self, calls: Sequence[Call], rounds: int) -> list[list[float]]:
        import torch

        graphs = [self._capture(torch, call) for call in calls]
        order = round_robin(len(calls), rounds)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in order]
        for (_, c), (start, end) in zip(order, events):
            start.record()
            graphs[c].replay()
            end.record()
        torch.cuda.synchronize()
        out: list[list[float]] = [[] for _ in calls]
        for (_, c), (start, end) in zip(order, events):
            out[c].append(start.elapsed_time(end) / self.calls_per_graph)
        return out

    def _capture(self, torch: Any, call: Call) -> Any:
        # One eager call on a side stream first, as torch.cuda.graph asks (lazy initialization, workspace
        # sizing); then the capture.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            call(0)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(self.calls_per_graph):
                call(i)
        return graph


class CudaPythonEventTimer:
    """CUDA runtime events through cuda-python (`cuda.bindings.runtime`), recorded on `stream()`
    (CuPy's current stream: the one cutlassfa.forward launches on for CuPy arrays)."""

    name = "cuda.bindings.runtime events"

    def __init__(self, stream: Callable[[], int] = lambda: 0) -> None:
        try:
            from cuda.bindings import runtime as cudart
        except ImportError:
            from cuda import cudart  # cuda-python < 12.6
        self._rt = cudart
        self._stream = stream

    def _ok(self, result: tuple) -> Any:
        if result[0] != self._rt.cudaError_t.cudaSuccess:
            raise RuntimeError(f"CUDA runtime error {result[0]}")
        return result[1] if len(result) == 2 else result[1:]

    def time(self, calls: Sequence[Call], rounds: int) -> list[list[float]]:
        rt, stream = self._rt, self._stream()
        order = round_robin(len(calls), rounds)
        events = [(self._ok(rt.cudaEventCreate()), self._ok(rt.cudaEventCreate())) for _ in order]
        try:
            for (r, c), (start, end) in zip(order, events):
                self._ok(rt.cudaEventRecord(start, stream))
                calls[c](r)
                self._ok(rt.cudaEventRecord(end, stream))
            self._ok(rt.cudaEventSynchronize(events[-1][1]))
            out: list[list[float]] = [[] for _ in calls]
            for (_, c), (start, end) in zip(order, events):
                out[c].append(float(self._ok(rt.cudaEventElapsedTime(start, end))))
            return out
        finally:
            for pair in events:
                for event in pair:
                    rt.cudaEventDestroy(event)


class WallTimer:
    """time.perf_counter around each call (the cpu backend is synchronous)."""

    name = "time.perf_counter"

    def time(self, calls: Sequence[Call], rounds: int) -> list[list[float]]:
        out: list[list[float]] = [[] for _ in calls]
        for r, c in round_robin(len(calls), rounds):
            t0 = time.perf_counter()
            calls[c](r)
            out[c].append((time.perf_counter() - t0) * 1e3)
        return out
