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
