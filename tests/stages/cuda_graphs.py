"""A call captured in a CUDA graph as the runtime captures one, for the native ops' GPU tests."""

from __future__ import annotations

from collections.abc import Iterator

import torch


def replays(call, times: int = 1) -> Iterator[torch.Tensor]:
    """``call()``'s output after each of ``times`` replays of a CUDA graph of it (the call warmed up
    on the capture stream first, as the runtime captures)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = call()
    for _ in range(times):
        graph.replay()
        torch.cuda.synchronize()
        yield out


def replayed(call) -> torch.Tensor:
    """``call()``'s output as one replay of a CUDA graph of it gives it."""
    (out,) = replays(call)
    return out
