"""``BlockSchedule``: a causal block schedule in CSR form.

Row ``r`` of a schedule lists, in increasing order, the key blocks that query block ``r`` attends to. A
schedule is either *shared* by every (batch, head) lane (``lanes is None``, ``num_blocks`` rows) or holds one
row-set per lane (``lanes == (B, H)``, ``B * H * num_blocks`` rows, lane-major: row ``(b * H + h) * n + qb``).
The last block may be partial when ``seq_len`` is not a multiple of ``block_size``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._checks import AttentionShape, check_int, check_tensor


def num_blocks(seq_len: int, block_size: int) -> int:
    """Number of blocks covering ``seq_len`` tokens (the last one may be partial)."""
    return -(-seq_len // block_size)


@dataclass(frozen=True)
class ScheduleCounts:
    """Block counts of a schedule, summed over lanes."""

    scheduled_blocks: int
    causal_blocks: int

    @property
    def density(self) -> float:
        """Fraction of the causal blocks that the schedule visits."""
        return self.scheduled_blocks / self.causal_blocks

    @property
    def reduction(self) -> float:
        """Fraction of the causal blocks that the schedule skips."""
        return 1.0 - self.density

    def __str__(self) -> str:
        return (f"{self.scheduled_blocks} / {self.causal_blocks} causal blocks scheduled "
                f"({self.density:.1%} visited, {self.reduction:.1%} skipped)")


def _causal_mask_mod(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


@dataclass(frozen=True, eq=False)
class BlockSchedule:
    """A causal block schedule in CSR form.

    offsets: int32 ``[rows + 1]``; indices: int32 ``[nnz]``. Any integer dtype is accepted and stored as
    int32. ``lanes``: ``None`` for a schedule shared by all lanes, else ``(B, H)``. ``transposed``: rows
    are key blocks and indices the query blocks that read them (see :meth:`transpose`).

    The constructor validates the structure (see :meth:`validate`), so a ``BlockSchedule`` that exists is
    well formed: rows sorted, without duplicates, causal, in range, and (for row schedules) non-empty.
    """

    offsets: torch.Tensor
    indices: torch.Tensor
    block_size: int
    seq_len: int
    lanes: tuple[int, int] | None = None
    transposed: bool = False

    def __post_init__(self) -> None:
        for name in ("offsets", "indices"):
            t = check_tensor(name, getattr(self, name))
            if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
                raise TypeError(f"{name} must be an integer tensor (int32 or int64), got {t.dtype}")
            if t.ndim != 1:
                raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
            if t.dtype != torch.int32:
                if t.numel() and (int(t.min()) < -2**31 or int(t.max()) >= 2**31):
                    raise ValueError(f"{name} has values outside the int32 range")
                t = t.to(torch.int32)
            object.__setattr__(self, name, t.contiguous())
        if self.lanes is not None:
            if (not isinstance(self.lanes, (tuple, list)) or len(self.lanes) != 2):
                raise TypeError(f"lanes must be None or a pair (B, H), got {self.lanes!r}")
            object.__setattr__(self, "lanes", (check_int("lanes[0]", self.lanes[0], 1),
                                               check_int("lanes[1]", self.lanes[1], 1)))
        self.validate()

    @classmethod
    def unchecked(cls, offsets, indices, block_size, seq_len, lanes=None, transposed=False) -> "BlockSchedule":
        """Build without validation, for CSR tensors already known to be valid (derived from a valid schedule, or
        built by a rule that guarantees sorted, unique, causal, non-empty rows). Skips the checks' host syncs."""
        schedule = object.__new__(cls)
        for name, value in (("offsets", offsets), ("indices", indices), ("block_size", block_size),
                            ("seq_len", seq_len), ("lanes", lanes), ("transposed", transposed)):
            object.__setattr__(schedule, name, value)
        return schedule

    # ------------------------------------------------------------------ sizes
    @property
    def num_blocks(self) -> int:
        """Blocks per sequence, ``ceil(seq_len / block_size)``."""
        return num_blocks(self.seq_len, self.block_size)

    @property
    def num_lanes(self) -> int:
        """Row-sets held: 1 for a shared schedule, ``B * H`` otherwise."""
        return 1 if self.lanes is None else self.lanes[0] * self.lanes[1]

    @property
    def num_rows(self) -> int:
        return self.num_lanes * self.num_blocks

    @property
    def nnz(self) -> int:
        return self.indices.numel()

    @property
    def device(self) -> torch.device:
        return self.offsets.device

    @property
    def is_shared(self) -> bool:
        return self.lanes is None

    def row_ids(self) -> torch.Tensor:
        """Row id (int64) of every entry, ``[nnz]``."""
        rows = torch.arange(self.num_rows, device=self.device)
        return torch.repeat_interleave(rows, (self.offsets[1:] - self.offsets[:-1]).long(),
                                       output_size=self.nnz)

    def _describe_row(self, row: int) -> str:
        lane, block = divmod(row, self.num_blocks)
        side = "key block" if self.transposed else "query block"
        return f"{side} {block}" + ("" if self.lanes is None else f" of lane {divmod(lane, self.lanes[1])}")

    # ------------------------------------------------------------- validation
    def validate(self) -> "BlockSchedule":
        """Check the CSR structure; raise ``ValueError`` naming what is wrong. Returns ``self``.

        offsets: length ``rows + 1``, starts at 0, never decreases, ends at ``nnz``; every row of a row
        schedule is non-empty (an empty row would give NaN). indices: in ``[0, num_blocks)``, causal
        (``<=`` the row's query block; ``>=`` the row's key block when transposed), strictly increasing
        within each row (sorted, no duplicates)."""
        check_int("block_size", self.block_size, 1)
        check_int("seq_len", self.seq_len, 1)
        if not isinstance(self.transposed, bool):
            raise TypeError(f"transposed must be a bool, got {self.transposed!r}")
        offsets, indices = self.offsets, self.indices
        if indices.device != offsets.device:
            raise ValueError(f"offsets is on {offsets.device} but indices is on {indices.device}")
        rows, nb = self.num_rows, self.num_blocks
        if offsets.numel() != rows + 1:
            lanes = "" if self.lanes is None else f" x {self.num_lanes} lanes"
            raise ValueError(
                f"offsets has length {offsets.numel()}, expected rows + 1 = {rows + 1} "
                f"({nb} blocks of {self.block_size} for seq_len={self.seq_len}{lanes}); "
                f"was the schedule built for another seq_len, block size or lane count?"
            )
        first, last = int(offsets[0]), int(offsets[-1])
        if first != 0:
            raise ValueError(f"offsets must start at 0, got {first}")
        steps = offsets[1:] - offsets[:-1]
        if bool((steps < 0).any()):
            row = int(torch.nonzero(steps < 0)[0])
            raise ValueError(f"offsets must not decrease, but it does at row {row} ({self._describe_row(row)})")
        if last != indices.numel():
            raise ValueError(f"offsets must end at nnz = len(indices) = {indices.numel()}, got {last}")
        if not self.transposed and bool((steps == 0).any()):
            row = int(torch.nonzero(steps == 0)[0])
            raise ValueError(f"offsets has an empty row at row {row} ({self._describe_row(row)}); "
                             f"every query block must attend to at least one key block")
        if indices.numel() == 0:
            return self
        low, high = int(indices.min()), int(indices.max())
        if low < 0:
            raise ValueError(f"indices must be >= 0, got {low}")
        if high >= nb:
            raise ValueError(f"indices must be < num_blocks = {nb}, got {high}")
        row_ids = self.row_ids()
        row_block = row_ids % nb
        bad = indices < row_block if self.transposed else indices > row_block
        if bool(bad.any()):
            at = int(torch.nonzero(bad)[0])
            row = int(row_ids[at])
            what = "query blocks >= the key block" if self.transposed else "key blocks <= the query block"
            raise ValueError(f"indices are not causal: row {row} ({self._describe_row(row)}) lists block "
                             f"{int(indices[at])}; expected only {what}")
        same_row = row_ids[1:] == row_ids[:-1]
        step = indices[1:] - indices[:-1]
        for cond, word in ((step == 0, "duplicated"), (step < 0, "unsorted")):
            hit = same_row & cond
            if bool(hit.any()):
                row = int(row_ids[int(torch.nonzero(hit)[0])])
                raise ValueError(f"indices are {word} within row {row} ({self._describe_row(row)}); "
                                 f"each row must list strictly increasing block indices")
        return self

    # ------------------------------------------------------------ conversions
    @classmethod
    def from_block_mask(cls, mask: torch.Tensor, block_size: int, seq_len: int | None = None) -> "BlockSchedule":
        """From a bool block mask ``[nq, nk]`` (shared) or ``[B, H, nq, nk]`` (one row-set per lane).

        ``mask[..., i, j]`` says that query block ``i`` attends to key block ``j``; it must be causal
        (``j <= i``) with at least one block per row. ``seq_len`` defaults to ``nq * block_size``."""
        mask = check_tensor("mask", mask)
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be a bool tensor, got {mask.dtype}")
        if mask.ndim not in (2, 4) or mask.shape[-1] != mask.shape[-2]:
            raise ValueError(f"mask must have shape [nq, nk] or [B, H, nq, nk] with nq == nk, "
                             f"got shape {tuple(mask.shape)}")
        block_size = check_int("block_size", block_size, 1)
        nb = mask.shape[-1]
        seq_len = nb * block_size if seq_len is None else check_int("seq_len", seq_len, 1)
        if num_blocks(seq_len, block_size) != nb:
            raise ValueError(f"mask has {nb} blocks per side, but seq_len={seq_len} with block_size={block_size} "
                             f"needs {num_blocks(seq_len, block_size)}")
        if bool(torch.triu(mask, diagonal=1).any()):
            raise ValueError("mask is not causal: it has key blocks after the query block (j > i); "
                             "apply mask.tril() first if that is intended")
        lanes = None if mask.ndim == 2 else (mask.shape[0], mask.shape[1])
        flat = mask.reshape(-1, nb)
        counts = flat.sum(dim=1, dtype=torch.int32)
        offsets = torch.zeros(flat.shape[0] + 1, dtype=torch.int32, device=mask.device)
        torch.cumsum(counts, dim=0, out=offsets[1:])
        indices = torch.nonzero(flat)[:, 1].to(torch.int32)
        return cls(offsets, indices, block_size, seq_len, lanes)

    def to_block_mask(self) -> torch.Tensor:
        """Bool ``[n, n]`` (shared) or ``[B, H, n, n]``; ``mask[..., row, index]`` is True for every entry."""
        nb = self.num_blocks
        mask = torch.zeros(self.num_rows, nb, dtype=torch.bool, device=self.device)
        mask[self.row_ids(), self.indices.long()] = True
        return mask.view(nb, nb) if self.lanes is None else mask.view(*self.lanes, nb, nb)

    def to_token_mask(self, rows: slice | None = None) -> torch.Tensor:
        """Bool ``[S, S]`` (shared) or ``[B, H, S, S]``: query token ``i`` sees key token ``j`` when ``j``'s
        block is scheduled for ``i``'s block and ``j <= i`` (causal applied inside the diagonal block).
        ``rows`` restricts the query tokens (``[..., len(rows), S]``), for long sequences."""
        blocks = self.to_block_mask()
        if self.transposed:
            blocks = blocks.transpose(-1, -2)
        seq = self.seq_len
        q_pos = torch.arange(seq, device=self.device)[rows if rows is not None else slice(None)]
        k_pos = torch.arange(seq, device=self.device)
        tokens = blocks[..., q_pos // self.block_size, :].repeat_interleave(self.block_size, dim=-1)[..., :seq]
        return tokens & (k_pos[None, :] <= q_pos[:, None])

    def counts(self) -> ScheduleCounts:
        """Scheduled blocks, causal blocks (``n (n + 1) / 2`` per lane) and the reduction, over all lanes."""
        nb = self.num_blocks
        return ScheduleCounts(self.nnz, self.num_lanes * nb * (nb + 1) // 2)

    def to(self, device: torch.device | str) -> "BlockSchedule":
        """The same schedule with its tensors on ``device``."""
        return BlockSchedule.unchecked(self.offsets.to(device), self.indices.to(device), self.block_size,
                                      self.seq_len, self.lanes, self.transposed)

    def transpose(self) -> "BlockSchedule":
        """Column form: row ``c`` of each lane lists, sorted, the query blocks whose rows contain key block
        ``c`` (what a backward pass walks for dK/dV). Rows may be empty. Transposing twice gives back the
        row schedule."""
        nb, rows = self.num_blocks, self.num_rows
        row_ids = self.row_ids()
        lane_base = row_ids - row_ids % nb
        new_rows = lane_base + self.indices.long()
        order = torch.argsort(new_rows * nb + row_ids % nb)
        # index_add_, not bincount: no host sync on CUDA (the backward pass transposes on every call)
        counts = torch.zeros(rows, dtype=torch.int32, device=self.device).index_add_(
            0, new_rows, torch.ones_like(self.indices))
        offsets = torch.zeros(rows + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(counts, dim=0, out=offsets[1:])
        indices = (row_ids % nb)[order].to(torch.int32)
        return BlockSchedule.unchecked(offsets, indices, self.block_size, self.seq_len, self.lanes,
                                      not self.transposed)

    def to_flex_block_mask(self):
        """A ``torch.nn.attention.flex_attention.BlockMask`` with the same blocks: off-diagonal blocks as
        full blocks, the diagonal block as a partial block. Its ``mask_mod`` is the schedule's token mask
        (scheduled block and causal), so eager FlexAttention, which reads only ``mask_mod``, agrees too. A
        shared schedule gives batch and head dimensions of 1 (broadcast by FlexAttention)."""
        from torch.nn.attention.flex_attention import BlockMask

        if self.transposed:
            raise ValueError("to_flex_block_mask needs a row schedule; call it on schedule.transpose()")
        blocks = self.to_block_mask()
        if self.lanes is None:
            blocks = blocks[None, None]
        diagonal = torch.eye(self.num_blocks, dtype=torch.bool, device=self.device)
        partial, full = blocks & diagonal, blocks & ~diagonal

        def ordered(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            count = m.sum(dim=-1, dtype=torch.int32)
            index = torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32)
            return count, index

        kv_num, kv_idx = ordered(partial)
        full_num, full_idx = ordered(full)
        size, shared, shared_blocks = self.block_size, self.lanes is None, blocks[0, 0]

        def mask_mod(b, h, q_idx, kv_idx):  # eager FlexAttention reads only this, not the blocks
            scheduled = (shared_blocks[q_idx // size, kv_idx // size] if shared
                         else blocks[b, h, q_idx // size, kv_idx // size])
            return scheduled & _causal_mask_mod(b, h, q_idx, kv_idx)

        return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=self.block_size,
                                        mask_mod=mask_mod, seq_lengths=(self.seq_len, self.seq_len))

    @classmethod
    def from_flex_block_mask(cls, block_mask) -> "BlockSchedule":
        """From a FlexAttention ``BlockMask`` with square blocks and equal query and key lengths. Partial
        and full blocks are both kept; inside blocks the causal rule is assumed (the ``mask_mod`` is not
        read). Batch and head dimensions of 1 give a shared schedule."""
        q_size, kv_size = block_mask.BLOCK_SIZE
        if q_size != kv_size:
            raise ValueError(f"block_mask must have square blocks, got BLOCK_SIZE={block_mask.BLOCK_SIZE}")
        q_len, kv_len = block_mask.seq_lengths
        if q_len != kv_len:
            raise ValueError(f"block_mask must have equal query and key lengths, got {block_mask.seq_lengths}")
        nb = num_blocks(q_len, q_size)
        dense = block_mask.to_dense()[..., :nb, :nb].bool()
        if dense.shape[0] == 1 and dense.shape[1] == 1:
            dense = dense[0, 0]
        return cls.from_block_mask(dense, q_size, q_len)

    def __repr__(self) -> str:
        kind = "shared" if self.lanes is None else f"lanes={self.lanes}"
        t = ", transposed" if self.transposed else ""
        return (f"BlockSchedule(seq_len={self.seq_len}, block_size={self.block_size}, {kind}{t}, "
                f"nnz={self.nnz}, device={self.device})")


def dense_causal_schedule(seq_len: int, block_size: int, device: torch.device | str = "cpu") -> BlockSchedule:
    """Every causal block: row ``i`` holds ``0..i``. Shared by all lanes."""
    seq_len = check_int("seq_len", seq_len, 1)
    block_size = check_int("block_size", block_size, 1)
    nb = num_blocks(seq_len, block_size)
    rows = torch.arange(nb + 1, dtype=torch.int64, device=device)
    offsets = (rows * (rows + 1) // 2).to(torch.int32)
    indices = torch.tril_indices(nb, nb, device=device)[1].to(torch.int32)
    return BlockSchedule(offsets, indices, block_size, seq_len)


def check_schedule_for(schedule: object, shape: AttentionShape, device: torch.device) -> BlockSchedule:
    """The schedule must be a row (not transposed) ``BlockSchedule`` built for this sequence length and
    these lanes, on the same device as ``q``."""
    if not isinstance(schedule, BlockSchedule):
        raise TypeError(f"schedule must be a topo_attn.BlockSchedule, got {type(schedule).__name__}")
    if schedule.transposed:
        raise ValueError("schedule is transposed (rows are key blocks); pass the row schedule, not schedule.transpose()")
    if schedule.seq_len != shape.seq_len:
        raise ValueError(
            f"schedule was built for seq_len={schedule.seq_len} (block_size={schedule.block_size}), "
            f"but q has sequence length {shape.seq_len}"
        )
    if schedule.lanes is not None and schedule.lanes != shape.lanes:
        raise ValueError(
            f"schedule holds one row-set per lane for lanes (B, H) = {schedule.lanes}, "
            f"but q has (B, H) = {shape.lanes}"
        )
    if schedule.device != device:
        raise ValueError(
            f"schedule is on {schedule.device} but q is on {device}; they must be on the same device "
            f"(use schedule.to(q.device))"
        )
    return schedule
