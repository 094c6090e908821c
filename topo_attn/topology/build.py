"""Building a topology schedule: the one place where the exact CPU path (:mod:`.persistence`) or the GPU kernels
(:mod:`.gpu`) are chosen, for block centroids, saliences, the rule's rows and ``topology_schedule``.

``schedule_sources`` says, for each scheduled block, which part of the rule put it there.
"""

from __future__ import annotations

import torch

from .._checks import check_finite, check_int, check_keys, check_tensor, raise_unless_finite
from ..rule import clamp_to_blocks, rule_schedule, source_labels
from ..schedule import BlockSchedule, num_blocks
from .gpu import MAX_BLOCKS as MAX_GPU_BLOCKS
from .persistence import block_means, check_centroids, lane_saliences, top_salient_blocks


def cpu_build_reason(device: torch.device, blocks: int) -> str | None:
    """Why the topology for ``blocks`` key blocks per lane on ``device`` is built on the CPU (the exact path:
    float64, numpy, one lane after another), or None when the GPU kernels build it (CUDA, at most
    :data:`MAX_GPU_BLOCKS` blocks per lane): the one place that decides, for the salience and
    :func:`topology_schedule`."""
    if device.type != "cuda":
        return f"keys on {device.type}: the exact CPU path (float64, numpy), one lane after another"
    if blocks > MAX_GPU_BLOCKS:
        return f"{blocks} blocks per lane, more than the GPU build's {MAX_GPU_BLOCKS}: the exact CPU path"
    return None


def block_centroids(keys: torch.Tensor, block_size: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Mean of each key block. keys: ``[..., S, D]`` -> ``[..., n, D]`` with ``n = ceil(S / block_size)``;
    a partial last block averages its real rows. Computed in ``dtype`` (float64 by default), on the keys' device.

    Floating-point keys on a CUDA device with a float32 or float64 ``dtype`` go through a Triton kernel
    (:mod:`.gpu.centroids`) that reads the keys once in their own dtype and strides. Its sums run in another
    order than torch's, so they can differ in the last bits, except where they are exact: float64 sums of
    float16 keys, or of bfloat16 keys of ordinary range, equal the CPU result bit for bit.

    Raises ``TypeError`` for a non-tensor and ``ValueError`` for ``block_size < 1`` or keys of fewer than two
    dimensions."""
    keys = check_tensor("keys", keys)
    block_size = check_int("block_size", block_size, 1)
    if keys.ndim >= 2 and keys.is_cuda and keys.is_floating_point() and dtype in (torch.float32, torch.float64):
        from .gpu.centroids import block_centroids_kernel  # triton is imported on first use

        seq, dim = keys.shape[-2], keys.shape[-1]
        out = block_centroids_kernel(keys.reshape(keys.shape[:-2].numel(), seq, dim), block_size, dtype)
        return out.reshape(*keys.shape[:-2], out.shape[-2], dim)
    return block_means(keys, block_size, dtype)


def block_salience(centroids: torch.Tensor, check: bool = True) -> torch.Tensor:
    """#22's elder-rule salience of each block. centroids: ``[..., n, D]`` (floating, finite) -> ``[..., n]``,
    on the centroids' device.

    Kruskal over pairs ordered by ``(distance, i, j)``; when an edge joins two components, every block of
    the smaller one (equal sizes: the one holding ``i``) takes that distance, overwriting earlier values.
    A block that is never on the smaller side keeps 0; a single block gets 1.

    On the CPU: float64 distances, Prim and the union-find in numpy, one lane after another; the result is
    float64. On a CUDA device (``n <=`` :data:`MAX_GPU_BLOCKS`): Triton kernels, all lanes at once
    (:mod:`.gpu.salience`), computed and returned in the centroids' dtype (float32 unless float64). float64
    centroids give the CPU path's trees and saliences (distances may differ in the last bit: the sum of
    squares is rounded in another order, which changes a schedule only if two distances agree to about
    1e-16). With float32 centroids, distances within about ``1e-7 * sqrt(D)`` of each other can swap places,
    which may change the tree, the saliences and so the schedule where keys nearly tie.

    ``check=False`` skips the checks (and the host sync of the finiteness check), for centroids the kit made
    itself from finite keys.

    Raises ``TypeError`` for non-floating centroids and ``ValueError`` for a wrong shape, no blocks or
    NaN/Inf entries."""
    return _salience(check_centroids(centroids, batched=True) if check else centroids)


def key_block_salience(keys: torch.Tensor, block_size: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The elder-rule salience of each key block among its lane's blocks, from the keys: ``[..., S, D]`` ->
    ``[..., n]``, trusting the keys (finite, floating: the kit's own; no check and no host sync).

    On a CUDA device (``n <=`` :data:`MAX_GPU_BLOCKS`) with a float32 or float64 ``dtype``: the centroids in
    ``dtype`` (one launch) and the salience kernels replayed from a CUDA graph
    (:func:`.gpu.graph.salience_of_keys`), the same saliences as :func:`block_salience` of
    :func:`block_centroids` with fewer launches. Otherwise :func:`block_salience` of :func:`block_centroids` in
    ``dtype`` (float64 on the CPU)."""
    seq, dim = keys.shape[-2], keys.shape[-1]
    n = num_blocks(seq, block_size)
    if cpu_build_reason(keys.device, n) is None and dtype in (torch.float32, torch.float64):
        from .gpu.graph import salience_of_keys  # triton is imported on first use

        flat = keys.reshape(keys.shape[:-2].numel(), seq, dim)
        return salience_of_keys(flat, block_size, dtype).reshape(*keys.shape[:-2], n)
    return _salience(block_centroids(keys, block_size, dtype if keys.is_cuda else torch.float64))


def _salience(centroids: torch.Tensor) -> torch.Tensor:
    """:func:`block_salience` of already checked centroids."""
    n = centroids.shape[-2]
    if cpu_build_reason(centroids.device, n) is None:
        from .gpu.salience import salience_kernels  # triton is imported on first use

        flat = centroids.reshape(-1, n, centroids.shape[-1])
        if flat.dtype not in (torch.float32, torch.float64):
            flat = flat.to(torch.float32)
        return salience_kernels(flat.contiguous()).reshape(centroids.shape[:-1])
    return lane_saliences(centroids)


def schedule_from_salience(salience: torch.Tensor, block_size: int, seq_len: int, window: int, sinks: int,
                           topk: int, lanes: tuple[int, int] | None = None) -> BlockSchedule:
    """The rule's schedule (:mod:`topo_attn.rule`) for given saliences: per query block ``qb``, sink blocks
    ``0..sinks-1``, the window ``qb-window..qb``, and those of the ``topk`` most salient blocks (chosen once per
    lane, ties to the lower index, :func:`~topo_attn.top_salient_blocks`) that are ``<= qb``; sorted and
    without duplicates.

    Arguments:
        salience: real ``[n]`` (shared schedule) or ``[..., n]`` holding ``L`` lanes (``L = B * H``; e.g.
            ``[L, n]``), finite, with ``n = ceil(seq_len / block_size)``.
        block_size, seq_len: ints ``>= 1``.
        window, sinks, topk: ints ``>= 0``; values beyond ``n`` blocks act as ``n`` (``n - 1`` for the window).
        lanes: ``None`` for one shared lane, else ``(B, H)`` with ``B * H == L``.

    Returns:
        A :class:`~topo_attn.BlockSchedule` on the salience's device. On the CPU,
        :func:`topo_attn.rule.rule_schedule` of the top-k blocks; on a CUDA device, the same rows from two
        Triton launches (:mod:`.gpu.rows`; saliences other than float32 and float64 are converted to float64)
        and one host sync.

    Raises:
        TypeError: a non-tensor salience or a non-int size.
        ValueError: ``block_size`` or ``seq_len`` below 1, ``window``, ``sinks`` or ``topk`` below 0, a salience
            whose last dimension is not ``n``, a lane count that does not match ``lanes``, or NaN/Inf
            saliences."""
    block_size, seq_len = check_int("block_size", block_size, 1), check_int("seq_len", seq_len, 1)
    window, sinks, topk = check_int("window", window), check_int("sinks", sinks), check_int("topk", topk)
    nb = num_blocks(seq_len, block_size)
    salience = check_tensor("salience", salience)
    if salience.ndim == 0 or salience.shape[-1] != nb:
        raise ValueError(f"salience must have shape [..., {nb}] ({nb} blocks of {block_size} for "
                         f"seq_len={seq_len}), got shape {tuple(salience.shape)}")
    sal = salience.reshape(-1, nb)
    lane_count = sal.shape[0]
    if lanes is not None:
        lanes = (check_int("lanes[0]", lanes[0], 1), check_int("lanes[1]", lanes[1], 1))
    if lane_count != (1 if lanes is None else lanes[0] * lanes[1]):
        raise ValueError(f"salience holds {lane_count} lanes, but lanes={lanes} needs "
                         f"{1 if lanes is None else lanes[0] * lanes[1]}")
    topk, sinks, window = clamp_to_blocks(nb, topk, sinks, window)
    if sal.is_cuda:  # two Triton launches instead of about twenty small torch ones
        from .gpu.rows import rule_rows

        if not sal.is_floating_point() or sal.dtype not in (torch.float32, torch.float64):
            sal = sal.to(torch.float64)
        # the saliences' finiteness is read back in the assembly's host sync
        offsets, indices, finite = rule_rows(sal, topk, sinks, window, torch.isfinite(sal).all())
        raise_unless_finite("salience", finite)
        return BlockSchedule.unchecked(offsets, indices, block_size, seq_len, lanes)
    check_finite("salience", sal)
    return rule_schedule(top_salient_blocks(sal, topk), block_size, seq_len, sinks, window, lanes)


def schedule_sources(salience: torch.Tensor, block_size: int, seq_len: int, window: int, sinks: int,
                     topk: int) -> torch.Tensor:
    """Why each block of :func:`schedule_from_salience`'s schedule is scheduled, as int8 labels
    (:func:`topo_attn.rule.source_labels` of its block mask).

    ``[..., qb, kb]`` is ``SINK`` (1) when ``kb < sinks``, else ``WINDOW`` (2) when ``qb - window <= kb``, else
    ``TOPOLOGY`` (3) when ``kb`` is one of the ``topk`` most salient blocks, else ``SKIPPED`` (0); blocks after
    the query block (``kb > qb``) are ``SKIPPED``. A block that two parts of the rule pick takes the first label
    in that order. The labelled blocks are exactly the schedule's block mask. ``SOURCE_NAMES[label]`` names a
    label.

    Arguments:
        salience: real ``[n]`` (shared) or ``[..., n]`` (one per lane, e.g. ``[L, n]`` or ``[B, H, n]``), finite.
        block_size, seq_len, window, sinks, topk: as for :func:`schedule_from_salience`.

    Returns:
        int8 ``[..., n, n]`` on the salience's device.

    Raises:
        TypeError, ValueError: as :func:`schedule_from_salience`."""
    salience = check_tensor("salience", salience)
    block_size, seq_len = check_int("block_size", block_size, 1), check_int("seq_len", seq_len, 1)
    window, sinks, topk = check_int("window", window), check_int("sinks", sinks), check_int("topk", topk)
    nb = num_blocks(seq_len, block_size)
    if salience.ndim == 0 or salience.shape[-1] != nb:
        raise ValueError(f"salience must have shape [..., {nb}] ({nb} blocks of {block_size} for "
                         f"seq_len={seq_len}), got shape {tuple(salience.shape)}")
    lanes = None if salience.ndim == 1 else (salience.numel() // nb, 1)
    scheduled = schedule_from_salience(salience, block_size, seq_len, window, sinks, topk, lanes).to_block_mask()
    # every scheduled block that is neither a sink nor in the window was put there by its salience
    return source_labels(scheduled, sinks, window).reshape(*salience.shape[:-1], nb, nb)


def topology_schedule(keys: torch.Tensor, block_size: int, window: int, sinks: int, topk: int, *,
                      shared_lane: tuple[int, int] | None = None,
                      dtype: torch.dtype = torch.float64, q_len: int | None = None,
                      check: bool = True) -> BlockSchedule:
    """Build a causal block schedule from the topology of the key blocks.

    keys: ``[S, D]`` gives a shared schedule; ``[B, H, S, D]`` gives one schedule per lane, or, with
    ``shared_lane=(b, h)``, one shared schedule built from ``keys[b, h]`` (what #22 does with ``k[0, 0]``).
    For GQA, pass the key heads expanded to the query heads (``k.repeat_interleave(H // H_kv, 1)``) to get
    per-query-head lanes, or use ``shared_lane``.

    Per query block ``qb``: sinks ``0..sinks-1``, the window ``qb-window..qb`` and the ``topk`` most salient
    blocks (elder-rule salience of the block centroids, :func:`block_salience`) that are ``<= qb``. The
    schedule lives on the keys' device. ``S`` need not be a multiple of ``block_size``.

    Keys on a CUDA device are handled there from end to end, all lanes at once, in Triton kernels (up to
    4096 blocks): centroids, distances, minimum spanning trees, saliences, top-k and the CSR assembly, the
    host waiting only for the entry count (the schedule's tensors may still be being written when this
    returns; like any CUDA result they are ordered on the current stream); every launch is replayed from a
    CUDA graph cached per shape (:mod:`.gpu.graph`). ``dtype`` is the precision of centroids and distances: float64 (the default) gives
    exactly the CPU path's schedules; float32 is faster on GPUs and gives the same schedules unless key
    blocks nearly tie (see :func:`block_salience`). The CPU path always computes in float64. Keys that
    require grad are detached: the schedule carries no gradient. ``q_len``: the rows of the last ``q_len``
    queries only (:meth:`BlockSchedule.for_queries`; chunked prefill, which reads the entry count back), the
    salience still over every key block.

    ``check=False`` (for keys the caller trusts, such as a model's own: the selectors' path) makes the GPU build
    wait for nothing: the keys' finiteness is not read back (NaN or Inf keys give meaningless rows, in bounds)
    and the schedule is *padded* (:attr:`BlockSchedule.padded`: its indices are read from a buffer of the most
    entries the rule can give, the exact count known on the device only). The CPU path checks all the same."""
    schedule = _topology_schedule(keys, block_size, window, sinks, topk, shared_lane, dtype, check)
    return schedule if q_len is None else schedule.for_queries(q_len)


def _topology_schedule(keys, block_size, window, sinks, topk, shared_lane, dtype, check) -> BlockSchedule:
    if not isinstance(check, bool):
        raise TypeError(f"check must be True or False, got {type(check).__name__}")
    keys = check_keys(keys, finite=False)  # the centroids of the lanes used are checked below
    block_size = check_int("block_size", block_size, 1)
    window, sinks, topk = check_int("window", window), check_int("sinks", sinks), check_int("topk", topk)
    lanes = None
    if keys.ndim == 4:
        if shared_lane is not None:
            b, h = shared_lane
            if not (0 <= b < keys.shape[0] and 0 <= h < keys.shape[1]):
                raise ValueError(f"shared_lane must index keys' (B, H) = {tuple(keys.shape[:2])}, got {shared_lane}")
            keys = keys[b:b + 1, h]  # [1, S, D]: the GPU build's layout, one view (a shared schedule)
        else:
            lanes = (keys.shape[0], keys.shape[1])
    elif shared_lane is not None:
        raise ValueError("shared_lane applies only to keys of shape [B, H, S, D]")
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    seq, nb = keys.shape[-2], num_blocks(keys.shape[-2], block_size)
    if cpu_build_reason(keys.device, nb) is None:
        from .gpu.graph import build_rows  # triton is imported on first use

        # NaN or Inf keys (or block sums that overflow) reach the centroids, whose finiteness is read back with
        # the entry count (the kernels stay in bounds on any input; they only read the keys, so
        # keys that require grad need no detached view)
        flat = keys if keys.ndim == 3 else keys.reshape(-1, seq, keys.shape[-1])
        offsets, indices, finite = build_rows(flat, block_size, dtype, *clamp_to_blocks(nb, topk, sinks, window),
                                              read_status_back=check)
        if not check:
            return BlockSchedule.unchecked(offsets, indices, block_size, seq, lanes, padded=True)
        raise_unless_finite("keys", finite)
        return BlockSchedule.unchecked(offsets, indices, block_size, seq, lanes)
    keys = (keys[0] if keys.ndim == 3 else keys).detach()  # (a shared lane: [S, D])
    centroids = block_centroids(keys, block_size, dtype if keys.is_cuda else torch.float64)
    check_finite("keys", centroids)
    return schedule_from_salience(_salience(centroids), block_size, seq, window, sinks, topk, lanes)
