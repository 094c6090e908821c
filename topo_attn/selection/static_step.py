"""Selection for one decode step over a static (preallocated) key cache: fixed shapes, no host sync.

With a static cache ``[B, H_kv, S_max, D]`` one captured CUDA graph (or one ``torch.compile`` graph) serves every
decode step, so nothing a step does may depend on the cache's length as a Python int: every shape follows from
``S_max``, the block size and the rule's sizes, and the length is read from a device tensor.

:class:`StaticBlockStats` keeps the statistics of :class:`~topo_attn.selection.incremental.KeyBlockStats` (each
key block's centroid, element-wise minimum and maximum) in buffers of ``nb_max = ceil(S_max / block_size)``
blocks allocated once, and, when asked for, ``topology``'s kept salience (:mod:`.kept_salience`: a bar per block,
changed when a block completes); :meth:`~StaticBlockStats.update` recomputes in place the blocks a step wrote.
:func:`step_block_table` gives the step's key blocks per key/value head as a table of fixed width: the rule's
base (the sinks, the window and the query's own block) and the ``budget`` best candidates, scored by the
selector's own step scores over every block and masked against the device length. Its rows hold the blocks of
:func:`~topo_attn.selection.incremental.select_for_queries` for the same step, except ``topology``'s, which rank
the kept salience instead of the exact salience of the prefix (an approximation, measured by
:mod:`.static_quality`). On a CUDA device it takes one launch (:mod:`.static_step_kernel`: scores, masks,
ranking and the row in one Triton kernel); elsewhere, and where the kernel does not apply, torch ops.
"""

from __future__ import annotations

import torch

from .._checks import check_device_count, check_int, check_tensor
from ..rule import budget_candidates
from ..schedule import num_blocks
from ..topology.persistence import block_means
from .kept_salience import update_kept_salience
from .registry import get, names
from .stats import key_block_bounds
from .topk import ranked_candidates

STATIC_SELECTORS = names("step", static_step=True)
"""The selectors :func:`step_block_table` supports (the registry's ``static_step`` flag)."""

FUSED_SCORES = {"window": "none", "topology": "salience", "centroid": "centroid", "quest": "quest"}
"""The selectors the one-launch kernel (:mod:`.static_step_kernel`) computes, with the kernel's score."""

FUSED_MAX_BLOCKS = 4096
"""The most blocks (``nb_max``) one program of the kernel scores and ranks; ``fused=None`` takes the torch path
beyond."""

REBUILD_GROUP = 256
"""Blocks per group of :meth:`StaticBlockStats.rebuild_salience` (its distances are ``[B, H_kv, group, nb_max]``)."""

_STATS_DTYPES = (torch.float32, torch.float64)


class StaticBlockStats:
    """Per key block statistics of one layer's static key cache ``[B, H_kv, S_max, D]``, in buffers allocated
    once (a CUDA graph captures their storage): ``centroids``, ``lo``, ``hi``, ``[B, H_kv, nb_max, D]`` in
    ``dtype``, the mean, element-wise minimum and maximum of each block's keys (as
    :class:`~topo_attn.selection.incremental.KeyBlockStats`), ``nb_max = ceil(S_max / block_size)``; ``salience``,
    ``[B, H_kv, nb_max]`` in ``dtype`` when asked for (else None), ``topology``'s kept salience: each complete
    block's bar under :mod:`.kept_salience`'s rule (block 0: ``inf``), set when the block completes and shortened
    when later ones complete; ``counters``, int32 ``[B * H_kv]`` zeros, the step kernel's split ranking's
    counts (every launch leaves them zero).

    A block is as fresh as the last :meth:`update` that touched it: complete blocks hold their statistics, the
    block being filled its partial ones (its keys so far), later blocks anything (zeros, or what an earlier
    sequence left). Updates must cover the cache from position 0 on, each starting at or before the previous
    one's end (append, or rewrite from an earlier position). A rewrite from position 0 (a new prompt) starts the
    kept salience over exactly; one from a later position keeps the shortening that the overwritten blocks made
    to the earlier blocks' bars (:meth:`rebuild_salience` recomputes them).

    Arguments:
        batch, kv_heads, max_len, head_dim: the cache's sizes ``B, H_kv, S_max, D``, ints ``>= 1``.
        block_size: tokens per block, ``>= 1``.
        dtype: the statistics' dtype, float32 (default) or float64 (exact comparisons).
        device: where the buffers live (the cache's device).
        salience: keep ``topology``'s salience too (a bool; its update costs one row of ``nb_max`` centroid
            distances per touched block and step).

    Raises:
        TypeError: a non-int size, another dtype, a ``salience`` that is not a bool. ValueError: a size below 1.
    """

    def __init__(self, batch: int, kv_heads: int, max_len: int, head_dim: int, block_size: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 salience: bool = False) -> None:
        sizes = [check_int(name, value, 1) for name, value in (("batch", batch), ("kv_heads", kv_heads),
                                                                 ("max_len", max_len), ("head_dim", head_dim))]
        self.block_size = check_int("block_size", block_size, 1)
        if dtype not in _STATS_DTYPES:
            raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        if not isinstance(salience, bool):
            raise TypeError(f"salience must be a bool, got {type(salience).__name__} {salience!r}")
        batch, kv_heads, self.max_len, head_dim = sizes
        shape = (batch, kv_heads, num_blocks(self.max_len, self.block_size), head_dim)
        self.centroids, self.lo, self.hi = (torch.zeros(shape, dtype=dtype, device=device) for _ in range(3))
        self.salience = torch.zeros(shape[:-1], dtype=dtype, device=device) if salience else None
        self.counters = torch.zeros(batch * kv_heads, dtype=torch.int32, device=device)
        self.kept_tables: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def kept_table(self, sinks: int, window: int, budget: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The buffers in which :func:`decode_step_table`'s kernel keeps ``topology``'s rows for this rule
        between steps (created at the first call; create them outside a captured graph): ``(kept, last)``, int32
        ``[B, H_kv, sinks + window + 1 + budget]`` and int64 ``[B, H_kv]``, ``last = -1`` (no row kept). A
        query-blind row changes only when the query's block changes or a block completes, so the kernel reuses
        a lane's row at the next length and recomputes it otherwise; :meth:`update` and
        :meth:`rebuild_salience` set ``last = -1``."""
        key = (check_int("sinks", sinks), check_int("window", window), check_int("budget", budget))
        if key not in self.kept_tables:
            lanes, device = tuple(self.lo.shape[:2]), self.lo.device
            self.kept_tables[key] = (torch.full((*lanes, sum(key) + 1), -1, dtype=torch.int32, device=device),
                                     torch.full(lanes, -1, dtype=torch.int64, device=device))
        return self.kept_tables[key]

    def buffers(self) -> list[torch.Tensor]:
        """Every tensor the statistics hold (the centroids, bounds, salience, counters and the kept rows'
        buffers): what a compiled step writes, so what must be marked as static addresses for CUDA graphs."""
        held = [self.centroids, self.lo, self.hi, self.salience, self.counters]
        return [t for t in held if t is not None] + [t for pair in self.kept_tables.values() for t in pair]

    def _forget_kept_tables(self) -> None:
        for _, last in self.kept_tables.values():
            last.fill_(-1)

    @classmethod
    def for_cache(cls, keys: torch.Tensor, block_size: int, dtype: torch.dtype = torch.float32,
                  salience: bool = False) -> StaticBlockStats:
        """Statistics for the static key cache ``keys`` ``[B, H_kv, S_max, D]`` (its sizes and device); ``salience``
        as in the constructor."""
        keys = check_tensor("keys", keys)
        if keys.ndim != 4:
            raise ValueError(f"keys must have shape [B, H_kv, S_max, D], got shape {tuple(keys.shape)}")
        return cls(*keys.shape, block_size, dtype, keys.device, salience)

    @property
    def num_blocks(self) -> int:
        """``nb_max``: the blocks the buffers hold."""
        return self.lo.shape[-2]

    def update(self, keys: torch.Tensor, start: torch.Tensor, q_len: int) -> StaticBlockStats:
        """Recompute, in place, the blocks that positions ``start .. start + q_len - 1`` touched, from the keys at
        positions ``< start + q_len`` (later positions are never read into a statistic, whatever they hold).

        Fixed shapes: ``ceil((q_len - 1) / block_size) + 1`` blocks from ``start // block_size`` (clamped to the
        last block) whatever ``start`` is, so a prefill (``q_len`` large) and a decode step (``q_len = 1``) each
        trace to one graph. The kept salience (when there is one) takes the bars of the blocks that completed in
        this update (those touched whose last key is now written) and the shortening they make, in the same fixed
        shapes (:func:`~topo_attn.selection.kept_salience.update_kept_salience`; a step that completes no block
        writes the values back unchanged).

        Arguments:
            keys: the whole static cache ``[B, H_kv, S_max, D]``, floating, on the statistics' device.
            start: integer tensor of one element on that device, the position of the step's first key.
            q_len: the keys written this step, an int in ``1 .. S_max`` (the step's static shape).

        Returns:
            ``self``.

        Raises:
            TypeError, ValueError: an argument that does not fit (before anything is read or written).
        """
        q_len = self._check_update(keys, start, q_len)
        bs, dtype, device = self.block_size, self.lo.dtype, self.lo.device
        start = start.reshape(()).to(torch.int64)
        end = (start + q_len).clamp(max=self.max_len)  # positions < end are keys
        touched = -(-(q_len - 1) // bs) + 1  # the most blocks q_len consecutive positions touch
        blocks = (start // bs + torch.arange(touched, device=device)).clamp(max=self.num_blocks - 1)
        block_start = blocks * bs
        positions = block_start[:, None] + torch.arange(bs, device=device)  # [T, bs]
        valid = positions < end
        # -- every block's rows, a row past the end read as the block's first key: the minimum and maximum stay
        #    exact (a block holding any key holds its first), the sums leave those rows out
        rows = torch.where(valid, positions, block_start[:, None]).reshape(-1)
        block_keys = keys.detach().index_select(2, rows)  # [B, H_kv, T * bs, D]
        lo, hi = key_block_bounds(block_keys, bs, dtype)
        # block_means is block_centroids' torch path (no Triton launch inside a traced step): the sum of the
        # block's keys over bs, turned into the mean of its count
        count = (end - block_start).clamp(min=0, max=bs)
        means = block_means(torch.where(valid.reshape(-1, 1), block_keys, 0), bs, dtype)
        centroids = means * (bs / count.clamp(min=1).to(dtype))[:, None]
        empty = (count == 0)[:, None]  # a block past the end (the last of T when start is aligned): zeros
        for buffer, value in ((self.centroids, centroids), (self.lo, lo), (self.hi, hi)):
            buffer.index_copy_(2, blocks, value.masked_fill(empty, 0))
        if self.salience is not None:  # every touched block ends at or after start: complete means completed now
            update_kept_salience(self.salience, self.centroids, blocks, count == bs)
        self._forget_kept_tables()
        return self

    def rebuild_salience(self, length: torch.Tensor) -> StaticBlockStats:
        """(Re)compute the kept salience from the centroids: every block complete at ``length`` takes its bar as if
        the blocks had completed one after the other (exact under the rule, whatever updates came before: after a
        rewrite from a later position, or on statistics made without a salience, which get the buffer here).

        The centroids must be up to date for the keys before ``length`` (call it after :meth:`update`). Fixed
        shapes, no host sync: ``O(nb_max^2 D)`` once, in groups of :data:`REBUILD_GROUP` blocks. Allocating the
        buffer changes what a captured graph would have to hold: do that outside one.

        Arguments:
            length: integer tensor of one element on the statistics' device, the valid keys.

        Returns:
            ``self``.

        Raises:
            TypeError, ValueError: a ``length`` that is not such a tensor.
        """
        length = check_device_count("length", length, self.lo.device, "the statistics").reshape(()).to(torch.int64)
        if self.salience is None:
            self.salience = torch.zeros(self.lo.shape[:-1], dtype=self.lo.dtype, device=self.lo.device)
        bs, device = self.block_size, self.lo.device
        for first in range(0, self.num_blocks, REBUILD_GROUP):  # groups in order: as one block after the other
            blocks = torch.arange(first, min(first + REBUILD_GROUP, self.num_blocks), device=device)
            update_kept_salience(self.salience, self.centroids, blocks, (blocks + 1) * bs <= length)
        self._forget_kept_tables()
        return self

    def _check_update(self, keys: object, start: object, q_len: object) -> int:
        keys = check_tensor("keys", keys)
        batch, kv_heads, _, head_dim = self.lo.shape
        expected = (batch, kv_heads, self.max_len, head_dim)
        if tuple(keys.shape) != expected:
            raise ValueError(f"keys must be the whole static cache of shape {list(expected)}, got shape "
                             f"{tuple(keys.shape)}")
        if not keys.is_floating_point():
            raise TypeError(f"keys must be a floating-point tensor, got {keys.dtype}")
        if keys.device != self.lo.device:
            raise ValueError(f"keys are on {keys.device} but the statistics are on {self.lo.device}")
        check_device_count("start", start, self.lo.device, "the statistics")
        q_len = check_int("q_len", q_len, 1)
        if q_len > self.max_len:
            raise ValueError(f"q_len must be <= the cache's {self.max_len} positions, got {q_len}")
        return q_len


def step_block_table(selector: str, q: torch.Tensor, stats: StaticBlockStats, length: torch.Tensor,
                     sinks: int = 1, window: int = 1, budget: int = 4, fused: bool | None = None) -> torch.Tensor:
    """The key blocks of one decode step per key/value head, in fixed shape, without a host sync.

    The query sits at position ``length - 1``, in block ``qb = (length - 1) // block_size``. Each row holds the
    blocks of :func:`~topo_attn.selection.incremental.select_for_queries`'s row for the step: the sinks before the
    window (``kb < min(sinks, qb - window)``), the window ``max(0, qb - window) .. qb``, and the ``budget``
    best-scored candidates ``sinks <= kb < qb - window`` (all complete blocks; ranked as
    :func:`~topo_attn.selection.topk.ranked_candidates` ranks them: ties to the lower block), each at most
    once, ``-1`` in every other slot. The query heads of a group choose together. Scores come from the selector's
    step scores over all ``nb_max`` blocks in the statistics' dtype; the candidates are masked against the device
    ``length``. ``topology`` ranks the statistics' kept salience (:mod:`.kept_salience`), not the exact salience
    of the prefix that ``select_for_queries`` ranks: the step computes nothing but the ranking.

    Two paths give these rows. The torch path: the step scores, the masks, the order keys, ``topk`` and the row's
    assembly (several launches). The kernel (:func:`~topo_attn.selection.static_step_kernel.static_step_table`):
    all of it in one launch (``topology``: the kept salience as the scores), float32 statistics only,
    ``nb_max <= FUSED_MAX_BLOCKS``. Both write the base in
    the same slots (the sinks, then the window ``qb - window .. qb``); the chosen blocks follow in some order on
    the torch path, best first in the kernel. Their scores are float32 sums taken in different orders, so at a
    tie within rounding they may choose differently; where the scores are equal bit for bit (exact
    arithmetic, duplicate blocks), they choose the same blocks.

    Arguments:
        selector: one of :data:`STATIC_SELECTORS`.
        q: ``[B, H, 1, D]``, floating, one query per sequence, ``H`` a multiple of the statistics' ``H_kv``.
        stats: the cache's :class:`StaticBlockStats`, updated for this step (its keys up to ``length``); for
            ``topology``, made with ``salience=True``.
        length: integer tensor of one element on the statistics' device: the valid keys, this query's included
            (``1 <= length <= S_max``; not checked: that would read the device).
        sinks, window, budget: ints ``>= 0``, as in :func:`~topo_attn.selection.select`.
        fused: ``None`` (default): the kernel on a CUDA device where it applies (see above), else the torch
            path; ``True``: the kernel (also in Triton's interpreter on the CPU); ``False``: the torch path.

    Returns:
        int32 ``[B, H_kv, sinks + window + 1 + budget]`` on the statistics' device.

    Raises:
        ValueError: a selector without a static step, ``topology`` on statistics that keep no salience, shapes
            or devices that do not fit, a negative size;
            ``fused=True`` where the kernel does not apply (float64 statistics, ``nb_max > FUSED_MAX_BLOCKS``,
            a device that is neither CUDA nor the interpreter's CPU).
        TypeError: a non-str selector, statistics of another kind, a non-integer ``length``, a non-int size,
            a ``fused`` that is not a bool or None.
    """
    chooser = get(selector, "step", static_step=True)
    _check_step(q, stats, length)
    _check_salience(chooser, selector, stats)
    sinks, window, budget = check_int("sinks", sinks), check_int("window", window), check_int("budget", budget)
    if _takes_kernel(selector, stats, fused):
        from .static_step_kernel import score_operands, static_step_table_op  # triton is imported on first use

        score = FUSED_SCORES[selector]
        first, second = score_operands(score, stats.centroids, stats.lo, stats.hi, stats.salience)
        return static_step_table_op(q, first, second, length, stats.counters, score, stats.block_size, sinks,
                                    window, budget)
    bs, nb, device = stats.block_size, stats.num_blocks, stats.lo.device
    batch, kv_heads = stats.lo.shape[:2]
    length = length.reshape(()).to(torch.int64)
    qb = (length - 1) // bs  # the query's block
    # -- the base, by arithmetic: the sinks before the window, then the window up to the query's block
    sink_slots = torch.arange(sinks, device=device)
    sink_slots = torch.where(sink_slots < qb - window, sink_slots, -1)
    window_slots = qb - window + torch.arange(window + 1, device=device)
    window_slots = torch.where(window_slots >= 0, window_slots, -1)
    base = torch.cat([sink_slots, window_slots]).expand(batch, kv_heads, sinks + window + 1)
    # -- the budget: the best candidates by the selector's scores of every block; slots left over hold -1
    take = min(budget, nb) if chooser.adds_blocks else 0
    parts = [base]
    if take:
        rows = torch.zeros(1, dtype=torch.int64, device=device)  # one row: the query's block
        scores = chooser.step_scores(q, stats, qb, rows, 1, length, 0)[..., 0, :]  # [B, H_kv, nb]
        blocks = torch.arange(nb, device=device)
        best = ranked_candidates(scores, budget_candidates(blocks, qb, sinks, window), take)
        parts.append(torch.where(budget_candidates(best, qb, sinks, window), best, -1))
    parts.append(torch.full((batch, kv_heads, budget - take), -1, dtype=torch.int64, device=device))
    return torch.cat(parts, dim=-1).to(torch.int32)


def decode_step_table(selector: str, q: torch.Tensor, keys: torch.Tensor, stats: StaticBlockStats,
                      length: torch.Tensor, sinks: int = 1, window: int = 1, budget: int = 4,
                      fused: bool | None = None) -> torch.Tensor:
    """A one-token decoding step's selection: ``stats.update(keys, length - 1, 1)`` (the statistics of the block
    the step's key went into, and the kept salience when that key completes it), then
    :func:`step_block_table`'s table. On the kernel path both take one launch
    (:func:`~topo_attn.selection.static_step_kernel.static_step_table` with ``update``, the custom op
    ``topo_attn::static_step_update_table``); on the torch path, the two calls. The arguments, the choice of
    path (``fused``), the result and the errors are those of :func:`step_block_table`; ``keys`` is the whole
    static key cache ``[B, H_kv, S_max, D]`` holding the step's key at ``length - 1``, as
    :meth:`~StaticBlockStats.update` takes it. Statistics and tables equal the two calls' up to float32 rounding
    of the sums (the kernel sums a block's keys and distances in its own order). For ``topology``, when
    ``stats`` holds buffers for this rule (:meth:`StaticBlockStats.kept_table`), the kernel reuses each lane's
    row from the previous length until the query's block changes or a block completes: the same rows, no ranking
    on most steps."""
    chooser = get(selector, "step", static_step=True)
    _check_step(q, stats, length)
    stats._check_update(keys, length, 1)
    _check_salience(chooser, selector, stats)
    sinks, window, budget = check_int("sinks", sinks), check_int("window", window), check_int("budget", budget)
    kernel = _takes_kernel(selector, stats, fused)
    if kernel and stats.lo.dtype != torch.float32:  # (window scores nothing, but the kernel's update is float32)
        if fused:
            raise ValueError(f"fused=True: the kernel updates float32 statistics, got {stats.lo.dtype}")
        kernel = False
    if kernel:
        from .static_step_kernel import static_step_update_table_op  # triton is imported on first use

        score = FUSED_SCORES[selector]
        kept = stats.kept_tables.get((sinks, window, budget)) if score == "salience" else None
        kept, last = kept if kept is not None else (None, None)
        return static_step_update_table_op(q, keys.detach(), stats.centroids, stats.lo, stats.hi, stats.salience,
                                           kept, last, stats.counters, length, score, stats.block_size, sinks,
                                           window, budget)
    stats.update(keys, length.reshape(()) - 1, 1)
    return step_block_table(selector, q, stats, length, sinks, window, budget, fused)


def _takes_kernel(selector: str, stats: StaticBlockStats, fused: object) -> bool:
    """Whether :func:`step_block_table` launches the kernel (``fused``: None, True or False); raises
    ``ValueError`` for ``fused=True`` where the kernel does not apply."""
    if fused is not None and not isinstance(fused, bool):
        raise TypeError(f"fused must be None, True or False, got {type(fused).__name__} {fused!r}")
    if fused is False:
        return False
    device = stats.lo.device
    if selector not in FUSED_SCORES:
        refusal = f"the kernel computes {sorted(FUSED_SCORES)}, not {selector!r}"
    elif FUSED_SCORES[selector] != "none" and stats.lo.dtype != torch.float32:
        refusal = f"the kernel scores float32 statistics, got {stats.lo.dtype}"
    elif FUSED_SCORES[selector] != "none" and stats.num_blocks > FUSED_MAX_BLOCKS:
        refusal = f"the kernel holds nb_max <= {FUSED_MAX_BLOCKS} blocks, got {stats.num_blocks}"
    elif device.type == "cuda":
        refusal = None
    elif fused is None:
        return False  # (the interpreter only when asked for)
    else:
        from .static_step_kernel import INTERPRETED

        refusal = None if INTERPRETED and device.type == "cpu" else (
            f"the statistics are on {device}: the kernel needs a CUDA device (or the CPU with TRITON_INTERPRET=1 "
            f"set before triton is first imported)")
    if refusal is not None and fused:
        raise ValueError(f"fused=True: {refusal}")
    return refusal is None


def _check_salience(chooser, selector: str, stats: StaticBlockStats) -> None:
    if chooser.topology_aware and stats.salience is None:
        raise ValueError(f"selector {selector!r} ranks the kept salience: make the statistics with salience=True "
                         f"(StaticBlockStats(..., salience=True) or StaticBlockStats.for_cache(keys, block_size, "
                         f"salience=True)), got statistics without one")


def _check_step(q: object, stats: object, length: object) -> None:
    if not isinstance(stats, StaticBlockStats):
        raise TypeError(f"stats must be a StaticBlockStats, got {type(stats).__name__}")
    q = check_tensor("q", q)
    batch, kv_heads, _, head_dim = stats.lo.shape
    if q.ndim != 4 or q.shape[2] != 1:
        raise ValueError(f"q must have shape [B, H, 1, D] (one query per sequence), got shape {tuple(q.shape)}")
    if not q.is_floating_point():
        raise TypeError(f"q must be a floating-point tensor, got {q.dtype}")
    if q.shape[0] != batch or q.shape[3] != head_dim or q.shape[1] == 0 or q.shape[1] % kv_heads:
        raise ValueError(f"q must have shape [{batch}, a multiple of {kv_heads}, 1, {head_dim}] to fit the "
                         f"statistics' [B, H_kv, nb_max, D] = {list(stats.lo.shape)}, got shape {tuple(q.shape)}")
    if q.device != stats.lo.device:
        raise ValueError(f"q is on {q.device} but the statistics are on {stats.lo.device}")
    check_device_count("length", length, stats.lo.device, "the statistics")
