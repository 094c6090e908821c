"""The GPU build of a topology schedule, keys to CSR rows, replayed from a CUDA graph; the host waits only for
the entry count, or (a padded schedule's build, :func:`build_rows` with ``read_status_back=False``) for nothing.

Stages, all on the keys' device: block centroids (:mod:`.centroids`), their finiteness flag, saliences
(:mod:`.salience`) and the rule's rows (:mod:`.rows`). All of them are captured once per (device,
stream, keys' shape, strides and dtype, dtype, rule) and replayed: launched one by one from Python, the
launches cost more host time than the GPU spends on a shared schedule at 32k. The centroid kernel reads the
keys in place and the rows kernel writes a new buffer for each build, so a schedule never aliases the graph's
buffers: both addresses are written to pinned host memory before each replay and copied to the device by the
graph's first node. The rows kernel writes the entry count and the finiteness flag to pinned host memory,
which the host polls (:func:`read_status`). A padded build, whose host does not wait, cannot pass addresses
through host memory (the next build would overwrite them before the replay read them): its graph starts after
the centroids, which one launch writes into the graph's buffer, and its rows are copied out, all ordered on
the stream. On Hopper the kernels are chained by programmatic dependent launch (:mod:`.pdl`).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextvars import ContextVar

import torch
import triton

from .centroids import block_centroids_kernel
from .distances import finite_flags
from .rows import rows_size, rule_launch, split_rows
from .salience import choose_mst, salience_and_finite

GRAPH_MAX_BYTES = 512 * 2**20
"""Largest distance scratch (``lanes * n * n`` entries of the build's dtype) that a cached graph may hold;
larger builds run launch by launch (their GPU time dwarfs the launches)."""

MAX_GRAPHS = 8
"""Most graphs kept; the least recently used one is dropped first."""

STATUS_SPINS = 20000
"""How many times :func:`build_rows` polls a replay's status by default (a few milliseconds) before it falls back
to a stream sync."""

_graphs: OrderedDict[tuple, object] = OrderedDict()

_graphs_allowed: ContextVar[bool] = ContextVar("topo_attn_cached_graphs", default=True)


@contextlib.contextmanager
def no_cached_graphs() -> Iterator[None]:
    """Within this context, :func:`build_rows` and :func:`salience_of_keys` launch their kernels one by one
    instead of replaying (or first building) a cached graph. For code that runs in another graph's memory pool:
    ``torch.compile``'s CUDA graphs (``mode="reduce-overhead"``) warm up and record a compiled function there,
    and a cached graph's buffers, allocated on its first use, would outlive the call in that pool (which
    cudagraph trees refuse: "tensors in the cudagraph pool not tracked as outputs"). The outer graph then holds
    the launches itself, so nothing is lost."""
    token = _graphs_allowed.set(False)
    try:
        yield
    finally:
        _graphs_allowed.reset(token)


def cached_graphs_allowed() -> bool:
    """Whether :func:`build_rows` and :func:`salience_of_keys` may replay cached graphs here (False within
    :func:`no_cached_graphs`)."""
    return _graphs_allowed.get()


LANE_GROUPS = 2
"""Per-lane builds of at least :data:`GROUP_MIN_BLOCKS` blocks split their lanes into this many groups whose
saliences are computed on parallel streams: one group's latency-bound steps (the hooks of Boruvka, Prim's
order: one program per lane) overlap another's distances."""

GROUP_MIN_BLOCKS = 256
"""Fewest blocks for lane groups (from H200 timings: groups sped up Boruvka builds of 512 blocks and slowed
Prim over all pairs; topology/NOTES.md, "Numbers that were in the code")."""


def lane_groups(lanes: int, n: int, dtype: torch.dtype) -> int:
    """How many groups of lanes a build of CUDA centroids ``[lanes, n, D]`` of ``dtype`` runs on parallel
    streams: :data:`LANE_GROUPS` for Boruvka builds (:func:`.salience.choose_mst`) of at least
    :data:`GROUP_MIN_BLOCKS` blocks whose lanes split evenly into groups of at least two, else 1."""
    groups = LANE_GROUPS if n >= GROUP_MIN_BLOCKS and choose_mst(lanes, n, dtype) == "boruvka" else 1
    return groups if lanes >= 2 * groups and lanes % groups == 0 else 1


def _saliences(centroids: torch.Tensor, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`.salience.salience_and_finite` of centroids ``[L, n, D]``, its lanes in :func:`lane_groups` groups
    on parallel streams; ``out``: an ``[L, n]`` tensor for the saliences, or None. No host sync."""
    lanes, n, _ = centroids.shape
    groups = lane_groups(lanes, n, centroids.dtype) if centroids.is_cuda else 1
    if groups == 1:
        return salience_and_finite(centroids, out=out)
    # -- lane groups on parallel streams, each writing its share of the saliences and flags
    size = lanes // groups
    salience = torch.empty(lanes, n, dtype=centroids.dtype, device=centroids.device) if out is None else out
    finite = torch.stack([finite_flags(size, n, centroids.device) for _ in range(groups)])
    main = torch.cuda.current_stream(centroids.device)
    streams = [torch.cuda.Stream(centroids.device) for _ in range(groups)]
    for g, stream in enumerate(streams):
        stream.wait_stream(main)
        with torch.cuda.stream(stream):
            lanes_g = slice(g * size, (g + 1) * size)
            salience_and_finite(centroids[lanes_g], out=salience[lanes_g], finite=finite[g])
    for stream in streams:
        main.wait_stream(stream)
    return salience, finite


def _stages(centroids: torch.Tensor, topk: int, sinks: int, window: int, status: torch.Tensor | None = None,
            rows_at: torch.Tensor | None = None):
    """Centroids ``[L, n, D]`` -> ``(rows buffer, status)`` of :func:`.rows.rule_launch`, with no host
    sync; the status holds the centroids' finiteness flag (written to ``status`` if given; the rows to the
    buffer whose address ``rows_at`` holds, if given)."""
    salience, finite = _saliences(centroids)
    return rule_launch(salience, topk, sinks, window, finite, status, rows_at)


def _graph_fits(lanes: int, n: int, dtype: torch.dtype) -> bool:
    """Whether a build of ``lanes`` lanes of ``n`` blocks in ``dtype`` may be held by a cached graph: its distance
    scratch within :data:`GRAPH_MAX_BYTES`."""
    return lanes * n * n * torch.finfo(dtype).bits // 8 <= GRAPH_MAX_BYTES


def _centroid_buffer(lanes: int, n: int, dim: int, dtype: torch.dtype, device) -> torch.Tensor:
    """A graph's input centroids ``[L, n, D]``, features first in memory: the layout the distance kernel reads
    (no transposed copy in the graph)."""
    return torch.zeros(lanes, dim, n, dtype=dtype, device=device).transpose(1, 2)


def _captured(stages: Callable[[], object], stream: torch.cuda.Stream, device) -> torch.cuda.CUDAGraph:
    """``stages()`` run once on a side stream (it compiles the kernels), then captured; the capture has finished
    on ``stream`` when this returns."""
    side = torch.cuda.Stream(device)
    side.wait_stream(stream)
    with torch.cuda.stream(side):
        stages()
    stream.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        stages()
    stream.synchronize()
    return graph


class _BuildGraph:
    """Every stage, keys ``[L, S, D]`` to the rows buffer, captured for one shape, strides and rule. The
    centroid kernel reads the keys' address from device memory when the graph runs, so the keys are read in
    place wherever they are: no copy into the graph, no launch outside it."""

    def __init__(self, keys: torch.Tensor, block_size: int, dtype: torch.dtype, rule: tuple[int, int, int]):
        lanes, seq, dim = keys.shape
        n = triton.cdiv(seq, block_size)
        device = keys.device
        self.stream = torch.cuda.current_stream(device)  # (the graph's key holds this stream's handle)
        self.centroids = _centroid_buffer(lanes, n, dim, dtype, device)
        # the addresses of the keys and of the rows buffer (rows_size entries, a new one per build), set by
        # the host in pinned memory through a numpy view (a microsecond) and copied to the device by the
        # graph's first node: the kernels read them from device memory (from pinned memory, every warp of
        # every program would cross PCIe; see topology/NOTES.md)
        self.rows_size = rows_size(lanes, n, *rule)
        self.next_rows = torch.empty(self.rows_size, dtype=torch.int32, device=device)  # the next build's
        self.addresses_host = torch.tensor([keys.data_ptr(), self.next_rows.data_ptr()], dtype=torch.int64).pin_memory()
        self.addresses_numpy = self.addresses_host.numpy()
        self.addresses = torch.empty(2, dtype=torch.int64, device=device)
        # the status (entry count, finiteness flag): written by the rows kernel to pinned memory, polled by
        # the host
        self.status = torch.empty(2, dtype=torch.int64, pin_memory=True)
        self.status_numpy = self.status.numpy()

        def stages():
            self.addresses.copy_(self.addresses_host, non_blocking=True)
            block_centroids_kernel(keys, block_size, dtype, out=self.centroids, keys_at=self.addresses[:1])
            return _stages(self.centroids, *rule, status=self.status, rows_at=self.addresses[1:])

        self.graph = _captured(stages, self.stream, device)


class _CentroidsInGraph:
    """Stages that start from block centroids ``[L, n, D]``, captured for one (lanes, blocks, features, dtype) and
    stage function: a padded schedule's build (:func:`build_rows` with ``read_status_back=False``) and the
    saliences of :func:`salience_of_keys`. Neither host waits for a replay before the next call, so no address
    may go through host memory (the next call would overwrite it before this replay's first node read it): the
    graph's input is its own centroid buffer, which :func:`_replay_on_keys` fills with one launch reading the keys
    in place, and its output is copied out, all stream-ordered."""

    def __init__(self, lanes: int, n: int, dim: int, dtype: torch.dtype, device: torch.device,
                 stages: Callable[[torch.Tensor], torch.Tensor]):
        self.stream = torch.cuda.current_stream(device)
        self.centroids = _centroid_buffer(lanes, n, dim, dtype, device)
        self.out = torch.empty(0)

        def captured_stages():
            self.out = stages(self.centroids)  # (the capture's own output: allocated in the graph's pool)

        self.graph = _captured(captured_stages, self.stream, device)


def _replay_on_keys(tag: tuple, keys: torch.Tensor, block_size: int, dtype: torch.dtype,
                    stages: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``stages(centroids)`` of the block centroids of CUDA ``keys`` ``[L, S, D]`` in ``dtype``, from the
    :class:`_CentroidsInGraph` cached per (``tag``, device, stream, lanes, blocks, features, ``dtype``): one
    centroid launch into the graph's buffer, the replay, and a copy of its output (the next replay rewrites it).
    ``tag`` names the stages (and their arguments) in the cache key. No host sync."""
    lanes, seq, dim = keys.shape
    n = triton.cdiv(seq, block_size)
    device = keys.get_device()
    key = (*tag, device, torch._C._cuda_getCurrentRawStream(device), lanes, n, dim, dtype)
    graph = _graph_for(key, lambda: _CentroidsInGraph(lanes, n, dim, dtype, keys.device, stages))
    block_centroids_kernel(keys, block_size, dtype, out=graph.centroids)
    graph.graph.replay()
    return graph.out.clone()


def clear_graphs() -> None:
    """Drop the cached build graphs and the GPU memory they hold."""
    _graphs.clear()


def cached_graphs() -> int:
    """How many build graphs are cached (at most :data:`MAX_GRAPHS`)."""
    return len(_graphs)


def _graph_for(key: tuple, build: Callable[[], object]):
    """The cached graph of ``key``, built by ``build()`` when there is none (the least recently used ones dropped
    beyond :data:`MAX_GRAPHS`)."""
    graph = _graphs.pop(key, None)
    if graph is None:
        graph = build()
    _graphs[key] = graph  # most recently used last
    while len(_graphs) > MAX_GRAPHS:
        _graphs.popitem(last=False)
    return graph


def read_status(graph, spins: int) -> tuple[int, int]:
    """A replay's status, read from pinned memory as soon as the rows kernel has written it, instead of waiting
    for the whole graph in a stream sync.

    Arguments:
        graph: a build graph: ``graph.status_numpy``, an int64 numpy ``[2]`` view of the pinned status that the
            host set to -1 before the replay, and ``graph.stream``, the stream the replay runs on.
        spins: how many times to poll before a sync of ``graph.stream`` (0: the sync at once).

    Returns:
        ``(entry count, finiteness flag)``.

    Raises:
        RuntimeError: the status is still unwritten (negative) after the sync.
    """
    status = graph.status_numpy
    for _ in range(spins):
        total, finite = status.tolist()
        if total >= 0 and finite >= 0:
            return total, finite
    graph.stream.synchronize()
    total, finite = status.tolist()
    if total < 0 or finite < 0:
        raise RuntimeError("the schedule build's graph finished without writing its status")
    return total, finite


def _replayable(keys: torch.Tensor, n: int, dtype: torch.dtype, use_graph: bool) -> bool:
    """Whether a cached graph may serve a build over ``keys`` ``[L, S, D]`` of ``n`` blocks per lane: CUDA keys,
    ``use_graph``, cached graphs allowed (not within :func:`no_cached_graphs`) and the distance scratch within
    :data:`GRAPH_MAX_BYTES`."""
    return keys.is_cuda and use_graph and cached_graphs_allowed() and _graph_fits(keys.shape[0], n, dtype)


def build_rows(keys: torch.Tensor, block_size: int, dtype: torch.dtype, topk: int, sinks: int, window: int,
               use_graph: bool = True, status_spins: int = STATUS_SPINS, read_status_back: bool = True
               ) -> tuple[torch.Tensor, torch.Tensor, bool | None]:
    """CSR rows of the topology rule for keys on the GPU: centroids, saliences and the rule's rows, with one
    wait for the entry count (none with ``read_status_back=False``). On a CUDA device the launches are captured
    once per (device, stream, keys' shape, strides and dtype, ``dtype``, rule) and replayed (up to
    :data:`GRAPH_MAX_BYTES` of distance scratch); with ``read_status_back=False`` the stages after the centroids,
    once per (device, stream, lanes, blocks, features, ``dtype``, rule) (:class:`_CentroidsInGraph`).

    Arguments:
        keys: ``[L, S, D]``, any float dtype and strides, on a CUDA device or (Triton's interpreter, launch by
            launch) the CPU.
        block_size: key rows per block, ``>= 1``; ``n = ceil(S / block_size) <=``
            :data:`~topo_attn.topology.gpu.MAX_BLOCKS`.
        dtype: the dtype of centroids and distances, float32 or float64.
        topk, sinks, window: the rule, with ``topk <= n``, ``sinks <= n`` and ``window < n``.
        use_graph: replay a cached CUDA graph where it applies (True; not within :func:`no_cached_graphs`) or
            launch every kernel from Python (False).
        status_spins: how many times the host polls a replay's status before a stream sync
            (:func:`read_status`); returned rows may then still be being written, ordered on the current stream
            like any CUDA result.
        read_status_back: wait for the entry count and the finiteness flag (True), or return at once (False):
            the indices are then the whole buffer of :func:`.rows.rule_bound` entries per lane, of which the first
            ``offsets[-1]`` are the rows (a padded schedule's buffer), and ``finite`` is None (not checked).

    Returns:
        ``(offsets, indices, finite)``: int32 ``[L * n + 1]`` and ``[offsets[-1]]`` on the keys' device, and
        whether every centroid was finite (False for NaN or Inf keys: the rows are then meaningless but in
        bounds, and the caller raises).

    Raises:
        RuntimeError: a replay finished without writing its status.
    """
    lanes, seq, _ = keys.shape
    n = triton.cdiv(seq, block_size)
    rule = (topk, sinks, window)
    use_graph = _replayable(keys, n, dtype, use_graph)
    if use_graph and not read_status_back and not torch.cuda.is_current_stream_capturing():
        rows = _replay_on_keys(("padded", rule), keys, block_size, dtype,
                               lambda centroids: _stages(centroids, *rule)[0])
        offsets, tail = split_rows(rows, lanes * n)
        return offsets, tail, None
    if use_graph and read_status_back:
        device = keys.get_device()
        # (the raw handle of the current stream: a fraction of torch.cuda.current_stream's cost)
        key = (device, torch._C._cuda_getCurrentRawStream(device), keys.shape, keys.stride(), keys.dtype,
               block_size, dtype, rule)
        graph = _graph_for(key, lambda: _BuildGraph(keys, block_size, dtype, rule))
        # a new rows buffer for each build, written by the graph (no copy out of the graph's buffers); it was
        # allocated after the previous build's replay, and the next one is allocated while the GPU works
        rows = graph.next_rows
        graph.addresses_numpy[0] = keys.data_ptr()
        graph.addresses_numpy[1] = rows.data_ptr()
        graph.status_numpy[:] = -1  # (not a status: the rows kernel writes a count >= 0 and a flag 0 or 1)
        graph.graph.replay()
        graph.next_rows = torch.empty(graph.rows_size, dtype=torch.int32, device=keys.device)
        offsets, tail = split_rows(rows, lanes * n)
        total, finite = read_status(graph, status_spins)
    else:
        rows, status = _stages(block_centroids_kernel(keys, block_size, dtype), *rule)
        offsets, tail = split_rows(rows, lanes * n)
        if not read_status_back:
            return offsets, tail, None
        total, finite = status.tolist()
    return offsets, tail[:total], bool(finite)


def salience_of_keys(keys: torch.Tensor, block_size: int, dtype: torch.dtype, use_graph: bool = True) -> torch.Tensor:
    """The elder-rule salience of each block of ``keys`` among its lane's blocks, with no host sync: the block
    centroids (one launch, the keys read in place) and the saliences, which on a CUDA device replay a graph
    cached per (device, stream, lanes, blocks, features, dtype) (up to :data:`GRAPH_MAX_BYTES` of distance
    scratch): three launches instead of the two dozen of the salience kernels.

    Arguments:
        keys: ``[L, S, D]``, any float dtype and strides, on a CUDA device or (Triton's interpreter, launch by
            launch) the CPU; ``n = ceil(S / block_size) <=`` :data:`~topo_attn.topology.gpu.MAX_BLOCKS`.
        block_size: key rows per block, ``>= 1``.
        dtype: the dtype of centroids, distances and saliences, float32 or float64.
        use_graph: replay a cached CUDA graph where it applies (True; not while the current stream is being
            captured, nor within :func:`no_cached_graphs`) or launch every kernel from Python (False).

    Returns:
        ``[L, n]`` in ``dtype``, a tensor of its own (the graph's buffer is copied out: the next replay rewrites
        it). Centroids that are not finite give meaningless saliences (in bounds): callers check the keys.
    """
    n = triton.cdiv(keys.shape[1], block_size)
    # (inside a caller's capture, e.g. a captured forward, the kernels are captured there one by one)
    if _replayable(keys, n, dtype, use_graph) and not torch.cuda.is_current_stream_capturing():
        return _replay_on_keys(("salience",), keys, block_size, dtype, lambda centroids: _saliences(centroids)[0])
    return _saliences(block_centroids_kernel(keys, block_size, dtype))[0]
