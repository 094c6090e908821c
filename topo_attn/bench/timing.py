"""Timing and work counting shared by the benchmark suites.

Every suite times a call with :func:`median_ms` (passed to its ``run_*_case`` as ``median_ms``, so that tests
can hand in a stand-in timer) and counts the work of a block-sparse kernel in :func:`visited_pairs`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def median_ms(fn: Callable[[], object], warmup_ms: float = 50, rep_ms: float = 300) -> float:
    """Median time of ``fn()`` in milliseconds, by ``triton.testing.do_bench`` (``warmup_ms`` of warm-up, then
    ``rep_ms`` of repetitions; the L2 cache is flushed between calls). Needs a CUDA GPU."""
    import triton

    return triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def host_us(fn: Callable[[], object], calls: int = 200, warmup: int = 20, repeats: int = 5) -> float:
    """Host time of one call of ``fn()`` in microseconds: the wall time of ``calls`` back-to-back calls
    without synchronising, divided by ``calls`` (median of ``repeats``; ``warmup`` calls first). While the GPU
    keeps up (each call's kernels are shorter than its host path, and the launch queue does not fill), this is
    the Python and launch work between a call and its kernels, which a short kernel waits for. Needs a CUDA
    GPU."""
    import statistics
    import time

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def idle_host_us(fn: Callable[[], object], calls: int = 50, warmup: int = 5) -> float:
    """Median host time of one call of ``fn()`` in microseconds, the device drained before each call (so the
    call never waits for a full launch queue): the Python and launch work a layer's kernels wait for when the
    GPU is ahead of the host. On a CPU it is simply the call's time
    (:func:`topo_attn.prefill_speed.idle_call_us` after ``warmup`` calls)."""
    from ..prefill_speed import idle_call_us

    for _ in range(warmup):
        fn()
    return idle_call_us(fn, calls)


def graph_median_ms(fn: Callable[[], object], warmup_ms: float = 50, rep_ms: float = 300) -> float:
    """Median time in milliseconds of replaying a CUDA graph that holds one call of ``fn()`` (captured after
    three eager calls on a side stream), by ``triton.testing.do_bench`` (the L2 cache is flushed between
    replays). The GPU's time for the call without the host's launch path: what a decode loop captured in a
    graph (as serving engines run it) pays. ``fn`` must not synchronise with the host. Needs a CUDA GPU."""
    import triton

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return triton.testing.do_bench(graph.replay, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def visited_pairs(schedule) -> int:
    """Token pairs the kernel computes per lane for ``schedule`` (a :class:`~topo_attn.schedule.BlockSchedule`):
    every query row of an off-diagonal scheduled block against all of its ``block_size`` keys, plus the causal
    part of the diagonal blocks; the first and last query blocks may be partial (queries at the end of the
    keys, a length that is not a multiple of the block size). A dense causal schedule of ``S`` tokens visits
    ``S * (S + 1) // 2`` pairs."""
    bs, S = schedule.block_size, schedule.seq_len
    blocks = schedule.row_blocks(schedule.row_ids())
    start = blocks * bs
    lo = torch.clamp(start, min=schedule.q_offset) - start  # the row's queries, as offsets in its block
    hi = torch.clamp(start + bs, max=S) - start
    diagonal = schedule.indices.long() == blocks
    full = int((hi - lo)[~diagonal].sum()) * bs
    causal = int(((hi * (hi + 1) - lo * (lo + 1)) // 2)[diagonal].sum())  # query at offset a sees a + 1 keys
    return (full + causal) // schedule.num_lanes


def backward_and_step_ms(attention: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, d_out: torch.Tensor,
                         median_ms: Callable[[Callable[[], object]], float]) -> tuple[float, float]:
    """Median ms of ``out.backward(d_out)`` on a kept graph (``out = attention(q, k, v)``), and of forward +
    backward. ``q``, ``k``, ``v`` are leaves that require grad; their ``.grad`` is reset to None before every
    call, so no accumulation kernel is timed. ``median_ms(fn)`` times a call."""
    leaves = (q, k, v)

    def backward_only():
        for t in leaves:
            t.grad = None
        out.backward(d_out, retain_graph=True)

    def step():
        for t in leaves:
            t.grad = None
        attention(q, k, v).backward(d_out)

    out = attention(q, k, v)
    backward_ms = median_ms(backward_only)
    del out
    return backward_ms, median_ms(step)
