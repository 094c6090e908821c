"""The GPU build of a topology schedule, keys to CSR rows, replayed from a CUDA graph; the host waits only for
the entry count.

Stages, all on the keys' device: block centroids (:mod:`.centroids`), their finiteness flag, saliences
(:mod:`.salience`) and the rule's rows (:mod:`.rows`). All of them are captured once per (device,
stream, keys' shape, strides and dtype, dtype, rule) and replayed: launched one by one from Python, the
launches cost more host time than the GPU spends on a shared schedule at 32k. The centroid kernel reads the
keys in place and the rows kernel writes a new buffer for each build, so a schedule never aliases the graph's
buffers: both addresses are written to pinned host memory before each replay and copied to the device by the
graph's first node. The rows kernel writes the entry count and the finiteness flag to pinned host memory,
which the host polls (:data:`STATUS_SPINS`). On Hopper the kernels are chained by programmatic dependent
launch (:mod:`.pdl`).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import triton

from .centroids import block_centroids_kernel
from .rows import rows_size, rule_launch, split_rows
from .salience import choose_mst, finite_flags, salience_and_finite

GRAPH_MAX_BYTES = 512 * 2**20
"""Largest distance scratch (``lanes * n * n`` entries of the build's dtype) that a cached graph may hold;
larger builds run launch by launch (their GPU time dwarfs the launches)."""

MAX_GRAPHS = 8
"""Most graphs kept; the least recently used one is dropped first."""

USE_GRAPHS = True
"""Set to False to run every build launch by launch (for profiling the stages)."""

STATUS_SPINS = 20000
"""After a replay the host reads the status (entry count, finiteness flag) from pinned memory as soon as the
rows kernel has written it, polling up to this many times (a few milliseconds), instead of waiting for the
whole graph in a stream sync; a build that takes longer falls back to the sync. 0: always the sync. The
returned rows may still be being written then: like any CUDA result, they are ordered on the stream."""

_graphs: OrderedDict[tuple, "_BuildGraph"] = OrderedDict()


LANE_GROUPS = 2
"""Per-lane builds of at least :data:`GROUP_MIN_BLOCKS` blocks split their lanes into this many groups whose
saliences are computed on parallel streams: one group's latency-bound steps (the hooks of Boruvka, Prim's
order: one program per lane) overlap another's distances."""

GROUP_MIN_BLOCKS = 256


def _lane_groups(lanes: int, n: int, dtype: torch.dtype) -> int:
    """How many groups :func:`_stages` splits the lanes into: :data:`LANE_GROUPS` for Boruvka builds of at
    least :data:`GROUP_MIN_BLOCKS` blocks (on the H200, 32 lanes of 512 blocks in float64: 1.04 -> 0.82 ms),
    else 1 (Prim over all pairs at 1024 blocks got slower in groups: 2.40 -> 2.48 ms)."""
    groups = LANE_GROUPS if n >= GROUP_MIN_BLOCKS and choose_mst(lanes, n, dtype) == "boruvka" else 1
    return groups if lanes >= 2 * groups and lanes % groups == 0 else 1


def _stages(centroids: torch.Tensor, topk: int, sinks: int, window: int, status: torch.Tensor | None = None,
            rows_at: torch.Tensor | None = None):
    """Centroids ``[L, n, D]`` -> ``(rows buffer, status)`` of :func:`.rows.rule_launch`, with no host
    sync; the status holds the centroids' finiteness flag (written to ``status`` if given; the rows to the
    buffer whose address ``rows_at`` holds, if given)."""
    lanes, n, _ = centroids.shape
    groups = _lane_groups(lanes, n, centroids.dtype) if centroids.is_cuda else 1
    if groups == 1:
        salience, finite = salience_and_finite(centroids)
        return rule_launch(salience, topk, sinks, window, finite, status, rows_at)
    # -- lane groups on parallel streams, each writing its share of the saliences and flags
    size = lanes // groups
    salience = torch.empty(lanes, n, dtype=centroids.dtype, device=centroids.device)
    finite = torch.stack([finite_flags(size, n, centroids.dtype, centroids.device) for _ in range(groups)])
    main = torch.cuda.current_stream(centroids.device)
    streams = [torch.cuda.Stream(centroids.device) for _ in range(groups)]
    for g, stream in enumerate(streams):
        stream.wait_stream(main)
        with torch.cuda.stream(stream):
            lanes_g = slice(g * size, (g + 1) * size)
            salience_and_finite(centroids[lanes_g], out=salience[lanes_g], finite=finite[g])
    for stream in streams:
        main.wait_stream(stream)
    return rule_launch(salience, topk, sinks, window, finite, status, rows_at)


class _BuildGraph:
    """Every stage, keys ``[L, S, D]`` to the rows buffer, captured for one shape, strides and rule. The
    centroid kernel reads the keys' address from device memory when the graph runs, so the keys are read in
    place wherever they are: no copy into the graph, no launch outside it."""

    def __init__(self, keys: torch.Tensor, block_size: int, dtype: torch.dtype, rule: tuple[int, int, int]):
        lanes, seq, dim = keys.shape
        n = triton.cdiv(seq, block_size)
        device = keys.device
        self.stream = torch.cuda.current_stream(device)  # (the graph's key holds this stream's handle)
        # features first in memory, the layout the distance kernel reads (no transposed copy in the graph)
        self.centroids = torch.zeros(lanes, dim, n, dtype=dtype, device=device).transpose(1, 2)
        # the addresses of the keys and of the rows buffer (rows_size entries, a new one per build), set by
        # the host in pinned memory through a numpy view (a microsecond) and copied to the device by the
        # graph's first node: the kernels read them from device memory (from pinned memory, every warp of
        # every program would cross PCIe: H200, shared 32k build +17 us, NOTES.md v11)
        self.rows_size = rows_size(lanes, n, *rule)
        self.next_rows = torch.empty(self.rows_size, dtype=torch.int32, device=device)  # the next build's
        self.addresses_host = torch.tensor([keys.data_ptr(), self.next_rows.data_ptr()], dtype=torch.int64).pin_memory()
        self.addresses_numpy = self.addresses_host.numpy()
        self.addresses = torch.empty(2, dtype=torch.int64, device=device)
        # the status (entry count, finiteness flag): written by the rows kernel to pinned memory, read after
        # the sync
        self.status = torch.empty(2, dtype=torch.int64, pin_memory=True)
        self.status_numpy = self.status.numpy()

        def stages():
            self.addresses.copy_(self.addresses_host, non_blocking=True)
            block_centroids_kernel(keys, block_size, dtype, out=self.centroids, keys_at=self.addresses[:1])
            return _stages(self.centroids, *rule, status=self.status, rows_at=self.addresses[1:])

        # -- one run outside the graph compiles the kernels; then the capture
        side = torch.cuda.Stream(device)
        side.wait_stream(self.stream)
        with torch.cuda.stream(side):
            stages()
        self.stream.wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            stages()
        self.stream.synchronize()


def clear_graphs() -> None:
    """Drop the cached build graphs and the GPU memory they hold."""
    _graphs.clear()


def _graph_for(key: tuple, keys: torch.Tensor, block_size: int, dtype: torch.dtype,
               rule: tuple[int, int, int]) -> _BuildGraph:
    graph = _graphs.pop(key, None)
    if graph is None:
        graph = _BuildGraph(keys, block_size, dtype, rule)
    _graphs[key] = graph  # most recently used last
    while len(_graphs) > MAX_GRAPHS:
        _graphs.popitem(last=False)
    return graph


def _read_status(graph: _BuildGraph) -> tuple[int, int]:
    """The replay's (entry count, finiteness flag), polled from pinned memory (see :data:`STATUS_SPINS`)."""
    status = graph.status_numpy
    for _ in range(STATUS_SPINS):
        total, finite = status.tolist()
        if total >= 0 and finite >= 0:
            return total, finite
    graph.stream.synchronize()
    total, finite = status.tolist()
    if total < 0 or finite < 0:
        raise RuntimeError("the schedule build's graph finished without writing its status")
    return total, finite


def build_rows(keys: torch.Tensor, block_size: int, dtype: torch.dtype, topk: int, sinks: int,
               window: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """CSR ``(offsets, indices, finite)`` of the topology rule for CUDA keys ``[L, S, D]`` (any float dtype and
    strides), with centroids and distances in ``dtype`` (float32 or float64): int32 offsets and indices, and
    whether every centroid was finite (False for NaN or Inf keys: the rows are then meaningless but in bounds,
    and the caller raises). ``topk <= n``, ``sinks <= n`` and ``window < n`` for ``n = ceil(S / block_size) <=``
    :data:`~topo_attn.topology.gpu.MAX_BLOCKS`."""
    lanes, seq, dim = keys.shape
    n = triton.cdiv(seq, block_size)
    rule = (topk, sinks, window)
    scratch = lanes * n * n * torch.finfo(dtype).bits // 8
    if keys.is_cuda and USE_GRAPHS and scratch <= GRAPH_MAX_BYTES:
        device = keys.get_device()
        # (the raw handle of the current stream: a fraction of torch.cuda.current_stream's 5-10 us)
        key = (device, torch._C._cuda_getCurrentRawStream(device), keys.shape, keys.stride(), keys.dtype,
               block_size, dtype, rule)
        graph = _graph_for(key, keys, block_size, dtype, rule)
        # a new rows buffer for each build, written by the graph (no copy out of the graph's buffers); it was
        # allocated after the previous build's replay, and the next one is allocated while the GPU works
        rows = graph.next_rows
        graph.addresses_numpy[0] = keys.data_ptr()
        graph.addresses_numpy[1] = rows.data_ptr()
        graph.status_numpy[:] = -1  # (not a status: the rows kernel writes a count >= 0 and a flag 0 or 1)
        graph.graph.replay()
        graph.next_rows = torch.empty(graph.rows_size, dtype=torch.int32, device=keys.device)
        offsets, tail = split_rows(rows, lanes * n)
        total, finite = _read_status(graph)
    else:
        rows, status = _stages(block_centroids_kernel(keys, block_size, dtype), *rule)
        offsets, tail = split_rows(rows, lanes * n)
        total, finite = status.tolist()
    return offsets, tail[:total], bool(finite)
