"""The GPU build of a topology schedule, keys to CSR rows, with one host sync; after the centroids it is
replayed from a CUDA graph.

Stages, all on the keys' device: block centroids (:mod:`.centroids`), their finiteness flag, saliences
(:mod:`.salience`) and the rule's rows (:mod:`.rule_rows`). Everything after the centroids is captured once
per (device, stream, lanes, blocks, head dim, dtype, rule) and replayed: launched one by one from Python, its
launches cost more host time than the GPU spends on a shared schedule at 32k. The centroid kernel runs before
the replay and writes into the graph's input buffer (a copy of the keys into a fixed buffer would cost more
than its launch). The one host sync then reads back the entry count and the finiteness flag, and the rows are
copied out of the graph's buffers, so a schedule never aliases them.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import triton

from ..validation import raise_unless_finite
from .centroids import block_centroids_kernel
from .rule_rows import rule_launch
from .rule_rows import split_rows
from .salience import salience_and_finite

GRAPH_MAX_BYTES = 512 * 2**20
"""Largest distance scratch (``lanes * n * n`` entries of the build's dtype) that a cached graph may hold;
larger builds run launch by launch (their GPU time dwarfs the launches)."""

MAX_GRAPHS = 8
"""Most graphs kept; the least recently used one is dropped first."""

USE_GRAPHS = True
"""Set to False to run every build launch by launch (for profiling the stages)."""

_graphs: OrderedDict[tuple, "_BuildGraph"] = OrderedDict()


def _stages(centroids: torch.Tensor, topk: int, sinks: int, window: int):
    """Centroids ``[L, n, D]`` -> ``(rows buffer, status)`` of :func:`.rule_rows.rule_launch`, with no host
    sync; the status holds the centroids' finiteness flag."""
    salience, finite = salience_and_finite(centroids)
    return rule_launch(salience, topk, sinks, window, finite)


class _BuildGraph:
    """The stages after the centroids, captured for one shape and rule; ``centroids`` is its input."""

    def __init__(self, lanes: int, n: int, dim: int, dtype: torch.dtype, device: torch.device,
                 rule: tuple[int, int, int]):
        # features first in memory, the layout the distance kernel reads (no transposed copy in the graph)
        self.centroids = torch.zeros(lanes, dim, n, dtype=dtype, device=device).transpose(1, 2)
        # -- one run outside the graph compiles the kernels; then the capture
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            _stages(self.centroids, *rule)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = _stages(self.centroids, *rule)


def clear_graphs() -> None:
    """Drop the cached build graphs and the GPU memory they hold."""
    _graphs.clear()


def _graph_for(key: tuple, lanes: int, n: int, dim: int, dtype: torch.dtype, device: torch.device,
               rule: tuple[int, int, int]) -> _BuildGraph:
    graph = _graphs.pop(key, None)
    if graph is None:
        graph = _BuildGraph(lanes, n, dim, dtype, device, rule)
    _graphs[key] = graph  # most recently used last
    while len(_graphs) > MAX_GRAPHS:
        _graphs.popitem(last=False)
    return graph


def build_rows(keys: torch.Tensor, block_size: int, dtype: torch.dtype, topk: int, sinks: int,
               window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR ``(offsets, indices)`` (int32) of the topology rule for CUDA keys ``[L, S, D]`` (any float dtype and
    strides), with centroids and distances in ``dtype`` (float32 or float64). ``topk <= n``, ``sinks <= n``
    and ``window < n`` for ``n = ceil(S / block_size) <= MAX_GPU_BLOCKS``. Raises ``ValueError`` if a centroid is
    not finite (NaN or Inf keys)."""
    lanes, seq, dim = keys.shape
    n = triton.cdiv(seq, block_size)
    rule = (topk, sinks, window)
    scratch = lanes * n * n * torch.finfo(dtype).bits // 8
    graphed = keys.is_cuda and USE_GRAPHS and scratch <= GRAPH_MAX_BYTES
    if graphed:
        device = keys.device
        key = (device, torch.cuda.current_stream(device).cuda_stream, lanes, n, dim, dtype, rule)
        graph = _graph_for(key, lanes, n, dim, dtype, device, rule)
        block_centroids_kernel(keys, block_size, dtype, out=graph.centroids)
        graph.graph.replay()
        rows, status = graph.outputs
    else:
        rows, status = _stages(block_centroids_kernel(keys, block_size, dtype), *rule)
    total, finite = status.tolist()
    raise_unless_finite("keys", bool(finite))
    row_count = lanes * n
    if graphed:  # the graph's buffers are overwritten by its next replay: one copy of offsets and indices
        rows = rows[:row_count + 1 + total].clone()
    return split_rows(rows, row_count, total)
