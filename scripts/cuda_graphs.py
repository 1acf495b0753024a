"""A CUDA graph of repeated calls, for the timing scripts beside it (scripts/ab_time.py,
scripts/fp8_decode_bench.py): imported from this folder, so that it works with whichever cutlassfa build is
installed."""

from __future__ import annotations

from typing import Any, Callable


def graph_of(torch: Any, call: Callable[[], Any], calls: int) -> Any:
    """call() x `calls` captured in a CUDA graph, after a warm-up on a side stream (the capture's
    allocations and lazy initialisation happen outside it)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            call()
    return graph


def replay_kernels(torch: Any, graph: Any) -> dict[str, tuple[int, float]]:
    """The kernels of one replay of `graph` under the profiler: name (60 characters) -> (count, mean
    microseconds); a programmatic dependent's duration includes its wait for its primary."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        graph.replay()
        torch.cuda.synchronize()
    durations: dict[str, list[float]] = {}
    for event in profile.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            durations.setdefault(event.name[:60], []).append(event.device_time)
    return {name: (len(d), round(sum(d) / len(d), 2)) for name, d in durations.items()}
