"""``BlockSchedule``: a causal block schedule in CSR form.

Row ``r`` of a schedule lists, in increasing order, the key blocks that query block ``r`` attends to. A
schedule is either *shared* by every (batch, head) lane (``lanes is None``, ``num_blocks`` rows) or holds one
row-set per lane (``lanes == (B, H)`` per query head, or ``(B, H_kv)`` per key/value head shared by that head's
query heads; lane-major rows: row ``(b * H + h) * rows_per_lane + r``). The last block may be partial when
``seq_len`` is not a multiple of ``block_size``.

Queries at the end of a longer key sequence (decode, chunked prefill): ``seq_len`` is the key length and
``q_len <= seq_len`` the number of queries; query ``i`` sits at absolute position ``seq_len - q_len + i``
(bottom-right causal alignment, as FlashAttention and transformers align it). Blocks stay aligned at position 0:
the rows are the absolute query blocks ``first_query_block .. num_blocks - 1`` that the queries touch (the
first one may be partial too), ``num_query_blocks`` rows per lane. With ``q_len == seq_len`` (the default) this
is the square causal schedule.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ._checks import AttentionShape, check_int, check_tensor


CHECK_ENV = "TOPO_ATTN_CHECK_SCHEDULES"
"""Set to ``1``, every schedule the kit builds for itself (:meth:`BlockSchedule.unchecked`) is validated too: a
debugging switch, on in the tests, off by default (validation waits for the device)."""


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
    int32. ``lanes``: ``None`` for a schedule shared by all lanes, else ``(B, H)`` (per query head) or
    ``(B, H_kv)`` (per key/value head). ``transposed``: rows are key blocks and indices the absolute query
    blocks that read them (see :meth:`transpose`). ``seq_len``: the key length. ``q_len``: the query length,
    ``1 <= q_len <= seq_len`` (``None``: ``seq_len``); the queries are the last ``q_len`` positions.

    The constructor validates the structure (see :meth:`validate`), so a ``BlockSchedule`` that exists is
    well formed: rows sorted, without duplicates, causal, in range, and (for row schedules) non-empty.

    A *padded* schedule (:attr:`padded`; only the kit's own builders make one, with
    :meth:`unchecked` ``(..., padded=True)``) keeps its entries in a buffer that may be longer than
    ``offsets[-1]``, so that a GPU builder whose entry count depends on the data need not read that count back:
    the kernels read :attr:`index_buffer` between the offsets and never look past ``offsets[-1]``. Its
    :attr:`indices` (and :attr:`nnz`, :meth:`counts`, the conversions) are the exact entries, sliced from the
    buffer on first use with the one host sync of reading ``offsets[-1]``.
    """

    offsets: torch.Tensor
    indices: torch.Tensor
    block_size: int
    seq_len: int
    lanes: tuple[int, int] | None = None
    transposed: bool = False
    q_len: int | None = None

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
        if self.q_len is None:
            object.__setattr__(self, "q_len", self.seq_len)
        self.validate()

    @classmethod
    def unchecked(cls, offsets, indices, block_size, seq_len, lanes=None, transposed=False,
                  q_len=None, padded=False) -> "BlockSchedule":
        """Build without validation, for CSR tensors already known to be valid (derived from a valid schedule, or
        built by a rule that guarantees sorted, unique, causal, non-empty rows): the kit's own builders, which
        are trusted, so their schedules cost no check and no host sync. ``padded``: ``indices`` is a buffer whose
        first ``offsets[-1]`` entries are the schedule's and whose rest is unused (see the class docstring). With
        the environment variable :data:`CHECK_ENV` set to ``1`` (the tests set it) every such schedule is
        validated all the same, except while a CUDA graph is being captured (which cannot read a tensor back)."""
        schedule = object.__new__(cls)
        for name, value in (("offsets", offsets), ("indices" if not padded else "_buffer", indices),
                            ("block_size", block_size), ("seq_len", seq_len), ("lanes", lanes),
                            ("transposed", transposed), ("q_len", seq_len if q_len is None else q_len)):
            object.__setattr__(schedule, name, value)
        if os.environ.get(CHECK_ENV) == "1" and not (offsets.is_cuda and torch.cuda.is_current_stream_capturing()):
            schedule.validate()
        return schedule

    def __getattr__(self, name: str):
        # reached only for a padded schedule's indices before their first use: the exact entries, sliced once
        if name == "indices" and "_buffer" in self.__dict__:
            indices = self.__dict__["_buffer"][:int(self.offsets[-1])]  # the one host sync of a padded schedule
            object.__setattr__(self, "indices", indices)
            return indices
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def padded(self) -> bool:
        """Whether the entries sit in a buffer that may run past ``offsets[-1]`` (:attr:`index_buffer`)."""
        return "_buffer" in self.__dict__

    @property
    def index_buffer(self) -> torch.Tensor:
        """The entries as the kernels read them, with no host sync: :attr:`indices`, or for a padded schedule the
        buffer whose first ``offsets[-1]`` entries they are (row ``r``'s at ``offsets[r]:offsets[r + 1]``)."""
        return self.__dict__["_buffer"] if self.padded else self.indices

    def entry_count(self) -> torch.Tensor:
        """``nnz`` as a 0-d int32 tensor on the schedule's device (``offsets[-1]``), read without a host sync."""
        return self.offsets[-1]

    # ------------------------------------------------------------------ sizes
    @property
    def num_blocks(self) -> int:
        """Blocks per sequence, ``ceil(seq_len / block_size)``."""
        return num_blocks(self.seq_len, self.block_size)

    @property
    def q_offset(self) -> int:
        """Absolute position of the first query, ``seq_len - q_len``."""
        return self.seq_len - self.q_len

    @property
    def first_query_block(self) -> int:
        """Absolute block of the first query, ``(seq_len - q_len) // block_size``."""
        return self.q_offset // self.block_size

    @property
    def num_query_blocks(self) -> int:
        """Query blocks the queries touch: the rows per lane of a row schedule."""
        return self.num_blocks - self.first_query_block

    @property
    def rows_per_lane(self) -> int:
        """``num_query_blocks`` for a row schedule, ``num_blocks`` (key blocks) when transposed."""
        return self.num_blocks if self.transposed else self.num_query_blocks

    @property
    def num_lanes(self) -> int:
        """Row-sets held: 1 for a shared schedule, ``B * H`` otherwise."""
        return 1 if self.lanes is None else self.lanes[0] * self.lanes[1]

    @property
    def num_rows(self) -> int:
        return self.num_lanes * self.rows_per_lane

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

    def row_blocks(self, row_ids: torch.Tensor) -> torch.Tensor:
        """The absolute block (query block, or key block when transposed) of each row id."""
        return row_ids % self.rows_per_lane + (0 if self.transposed else self.first_query_block)

    def _describe_row(self, row: int) -> str:
        lane, block = divmod(row, self.rows_per_lane)
        block += 0 if self.transposed else self.first_query_block
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
        check_int("q_len", self.q_len, 1)
        if self.q_len > self.seq_len:
            raise ValueError(f"q_len must be <= seq_len (the key length) = {self.seq_len}, got {self.q_len}")
        if not isinstance(self.transposed, bool):
            raise TypeError(f"transposed must be a bool, got {self.transposed!r}")
        offsets, indices = self.offsets, self.indices
        if indices.device != offsets.device:
            raise ValueError(f"offsets is on {offsets.device} but indices is on {indices.device}")
        rows, nb = self.num_rows, self.num_blocks
        if offsets.numel() != rows + 1:
            lanes = "" if self.lanes is None else f" x {self.num_lanes} lanes"
            queries = "" if self.q_len == self.seq_len else f" and q_len={self.q_len}"
            raise ValueError(
                f"offsets has length {offsets.numel()}, expected rows + 1 = {rows + 1} "
                f"({self.rows_per_lane} rows of blocks of {self.block_size} for seq_len={self.seq_len}{queries}"
                f"{lanes}); was the schedule built for another seq_len, q_len, block size or lane count?"
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
        if self.transposed and low < self.first_query_block:
            raise ValueError(f"indices must be query blocks >= first_query_block = {self.first_query_block} "
                             f"(q_len={self.q_len}), got {low}")
        row_ids = self.row_ids()
        row_block = self.row_blocks(row_ids)
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
    def from_block_mask(cls, mask: torch.Tensor, block_size: int, seq_len: int | None = None,
                        q_len: int | None = None) -> "BlockSchedule":
        """From a bool block mask ``[nq, nk]`` (shared) or ``[B, Hl, nq, nk]`` (one row-set per lane).

        ``mask[..., r, j]`` says that query block row ``r`` (absolute query block ``first_query_block + r``)
        attends to key block ``j``; it must be causal (``j <= first_query_block + r``) with at least one block
        per row. ``seq_len`` (the key length) defaults to ``nk * block_size``; ``q_len`` to ``seq_len``, and
        then ``nq == nk``; otherwise ``nq`` must be the number of query blocks that ``q_len`` queries at the end
        touch."""
        mask = check_tensor("mask", mask)
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be a bool tensor, got {mask.dtype}")
        if mask.ndim not in (2, 4) or (q_len is None and mask.shape[-1] != mask.shape[-2]):
            raise ValueError(f"mask must have shape [nq, nk] or [B, H, nq, nk] with nq == nk (or pass q_len), "
                             f"got shape {tuple(mask.shape)}")
        block_size = check_int("block_size", block_size, 1)
        nb = mask.shape[-1]
        seq_len = nb * block_size if seq_len is None else check_int("seq_len", seq_len, 1)
        if num_blocks(seq_len, block_size) != nb:
            raise ValueError(f"mask has {nb} key blocks, but seq_len={seq_len} with block_size={block_size} "
                             f"needs {num_blocks(seq_len, block_size)}")
        q_len = seq_len if q_len is None else check_int("q_len", q_len, 1)
        if q_len > seq_len:
            raise ValueError(f"q_len must be <= seq_len = {seq_len}, got {q_len}")
        first = (seq_len - q_len) // block_size
        if mask.shape[-2] != nb - first:
            raise ValueError(f"mask has {mask.shape[-2]} query block rows, but q_len={q_len} queries at the end "
                             f"of seq_len={seq_len} touch {nb - first} blocks of {block_size}")
        if bool(torch.triu(mask, diagonal=1 + first).any()):
            raise ValueError("mask is not causal: it has key blocks after the query block (j > i); "
                             "apply mask.tril() first if that is intended")
        lanes = None if mask.ndim == 2 else (mask.shape[0], mask.shape[1])
        flat = mask.reshape(-1, nb)
        counts = flat.sum(dim=1, dtype=torch.int32)
        offsets = torch.zeros(flat.shape[0] + 1, dtype=torch.int32, device=mask.device)
        torch.cumsum(counts, dim=0, out=offsets[1:])
        indices = torch.nonzero(flat)[:, 1].to(torch.int32)
        return cls(offsets, indices, block_size, seq_len, lanes, q_len=q_len)

    def to_block_mask(self) -> torch.Tensor:
        """Bool ``[nq, nk]`` (shared) or ``[B, Hl, nq, nk]`` with ``nq = num_query_blocks`` rows (absolute
        query block ``first_query_block + r``) and ``nk = num_blocks``: True where row ``r`` lists key block
        ``j``. A transposed schedule gives ``[nk, nq]`` (``[key block, query block row]``)."""
        nq, nk = self.num_query_blocks, self.num_blocks
        cols = self.indices.long() - (self.first_query_block if self.transposed else 0)
        width = nq if self.transposed else nk
        mask = torch.zeros(self.num_rows, width, dtype=torch.bool, device=self.device)
        mask[self.row_ids(), cols] = True
        shape = (self.rows_per_lane, width)
        return mask.view(*shape) if self.lanes is None else mask.view(*self.lanes, *shape)

    def to_token_mask(self, rows: slice | None = None) -> torch.Tensor:
        """Bool ``[q_len, seq_len]`` (shared) or ``[B, Hl, q_len, seq_len]``: query ``i`` (absolute position
        ``q_offset + i``) sees key ``j`` when ``j``'s block is scheduled for ``i``'s block and
        ``j <= q_offset + i`` (causal applied inside the diagonal block). ``rows`` restricts the queries
        (``[..., len(rows), seq_len]``), for long sequences."""
        blocks = self.to_block_mask()
        if self.transposed:
            blocks = blocks.transpose(-1, -2)
        seq = self.seq_len
        q_pos = self.q_offset + torch.arange(self.q_len, device=self.device)[rows if rows is not None else slice(None)]
        k_pos = torch.arange(seq, device=self.device)
        row = q_pos // self.block_size - self.first_query_block
        tokens = blocks[..., row, :].repeat_interleave(self.block_size, dim=-1)[..., :seq]
        return tokens & (k_pos[None, :] <= q_pos[:, None])

    @property
    def causal_blocks(self) -> int:
        """The causal (query block, key block) pairs of the schedule's rows over all lanes: ``first + 1 .. n``
        per lane for query blocks ``first .. n - 1`` (``n (n + 1) / 2`` for a square schedule)."""
        nb, first = self.num_blocks, self.first_query_block
        return self.num_lanes * (nb * (nb + 1) - first * (first + 1)) // 2

    def counts(self) -> ScheduleCounts:
        """Scheduled blocks, :attr:`causal_blocks` and the reduction, over all lanes."""
        return ScheduleCounts(self.nnz, self.causal_blocks)

    def to(self, device: torch.device | str) -> "BlockSchedule":
        """The same schedule with its tensors on ``device``."""
        return BlockSchedule.unchecked(self.offsets.to(device), self.index_buffer.to(device), self.block_size,
                                      self.seq_len, self.lanes, self.transposed, self.q_len, self.padded)

    def transpose(self) -> "BlockSchedule":
        """Column form: row ``c`` of each lane lists, sorted, the absolute query blocks whose rows contain key
        block ``c`` (what a backward pass walks for dK/dV). Rows may be empty. Transposing twice gives back the
        row schedule. No host sync: a padded schedule gives a padded transpose (its unused entries sorted last)."""
        nb, first = self.num_blocks, self.first_query_block
        target_rows, target_first = (self.num_query_blocks, first) if self.transposed else (nb, 0)
        rows = self.num_lanes * target_rows
        entries = self.index_buffer.long()
        if self.padded:  # each buffer entry's row; the entries past offsets[-1] get the row count
            at = torch.arange(entries.numel(), dtype=self.offsets.dtype, device=self.device)
            row_ids = torch.searchsorted(self.offsets, at, right=True) - 1
            used = row_ids < self.num_rows
            row_ids = torch.where(used, row_ids, 0)
        else:
            row_ids = self.row_ids()
        lane = row_ids // self.rows_per_lane
        block = self.row_blocks(row_ids)  # the absolute block of each entry's row
        new_rows = lane * target_rows + entries - target_first
        if self.padded:  # the unused entries go to an extra last row, which is dropped
            new_rows = torch.where(used, new_rows, rows)
        order = torch.argsort(new_rows * nb + block)
        # index_add_, not bincount: no host sync on CUDA (the backward pass transposes on every call)
        counts = torch.zeros(rows + 1, dtype=torch.int32, device=self.device).index_add_(
            0, new_rows, torch.ones_like(new_rows, dtype=torch.int32))
        offsets = torch.zeros(rows + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(counts[:rows], dim=0, out=offsets[1:])
        indices = block[order].to(torch.int32)
        return BlockSchedule.unchecked(offsets, indices, self.block_size, self.seq_len, self.lanes,
                                      not self.transposed, self.q_len, self.padded)

    def to_flex_block_mask(self):
        """A ``torch.nn.attention.flex_attention.BlockMask`` with the same blocks: off-diagonal blocks as
        full blocks, the diagonal block as a partial block. Its ``mask_mod`` is the schedule's token mask
        (scheduled block and causal), so eager FlexAttention, which reads only ``mask_mod``, agrees too. A
        shared schedule gives batch and head dimensions of 1 (broadcast by FlexAttention)."""
        from torch.nn.attention.flex_attention import BlockMask

        if self.transposed:
            raise ValueError("to_flex_block_mask needs a row schedule; call it on schedule.transpose()")
        if self.q_len != self.seq_len:
            raise ValueError(f"to_flex_block_mask needs q_len == seq_len (FlexAttention aligns the query blocks "
                             f"at the first query), got q_len={self.q_len}, seq_len={self.seq_len}")
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

    def for_queries(self, q_len: int) -> "BlockSchedule":
        """The rows of the last ``q_len`` queries: the same blocks for each query block, the rows before
        ``seq_len - q_len``'s block dropped (a builder's full schedule restricted to a suffix of queries).
        ``q_len`` must be ``<= self.q_len``; a row schedule only."""
        q_len = check_int("q_len", q_len, 1)
        if q_len > self.q_len:
            raise ValueError(f"q_len must be <= the schedule's q_len = {self.q_len}, got {q_len}")
        if self.transposed:
            raise ValueError("for_queries needs a row schedule, not a transposed one")
        drop = (self.seq_len - q_len) // self.block_size - self.first_query_block
        rows, keep = self.rows_per_lane, self.rows_per_lane - drop
        lane_rows = torch.arange(self.num_lanes, device=self.device)[:, None] * rows
        kept = (lane_rows + drop + torch.arange(keep, device=self.device)[None, :]).reshape(-1)
        starts, ends = self.offsets[kept].long(), self.offsets[kept + 1].long()
        counts = (ends - starts).to(torch.int32)
        offsets = torch.zeros(kept.numel() + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(counts, dim=0, out=offsets[1:])
        nnz = int(offsets[-1])
        within = torch.arange(nnz, device=self.device) - torch.repeat_interleave(offsets[:-1].long(), counts.long(),
                                                                                 output_size=nnz)
        indices = self.indices[torch.repeat_interleave(starts, counts.long(), output_size=nnz) + within]
        return BlockSchedule.unchecked(offsets, indices, self.block_size, self.seq_len, self.lanes, False, q_len)

    def __repr__(self) -> str:
        kind = "shared" if self.lanes is None else f"lanes={self.lanes}"
        t = ", transposed" if self.transposed else ""
        t += "" if self.q_len == self.seq_len else f", q_len={self.q_len}"
        return (f"BlockSchedule(seq_len={self.seq_len}, block_size={self.block_size}, {kind}{t}, "
                f"nnz={self.nnz}, device={self.device})")


def dense_causal_schedule(seq_len: int, block_size: int, device: torch.device | str = "cpu",
                          q_len: int | None = None) -> BlockSchedule:
    """Every causal block: the row of query block ``i`` holds ``0..i``. Shared by all lanes. ``seq_len`` is the
    key length; ``q_len`` (default ``seq_len``) queries at the end give the rows of the blocks they touch."""
    seq_len = check_int("seq_len", seq_len, 1)
    block_size = check_int("block_size", block_size, 1)
    q_len = seq_len if q_len is None else check_int("q_len", q_len, 1)
    if q_len > seq_len:
        raise ValueError(f"q_len must be <= seq_len = {seq_len}, got {q_len}")
    nb = num_blocks(seq_len, block_size)
    first = (seq_len - q_len) // block_size
    rows = torch.arange(first, nb + 1, dtype=torch.int64, device=device)
    start = first * (first + 1) // 2
    offsets = (rows * (rows + 1) // 2 - start).to(torch.int32)
    indices = torch.tril_indices(nb, nb, device=device)[1][start:].to(torch.int32)
    # valid by construction: no check (and no host sync: a compiled forward builds it inside its CUDA graph)
    return BlockSchedule.unchecked(offsets, indices, block_size, seq_len, q_len=q_len)


def check_schedule_for(schedule: object, shape: AttentionShape, device: torch.device) -> BlockSchedule:
    """The schedule must be a row (not transposed) ``BlockSchedule`` built for these key and query lengths and
    these lanes (``(B, H)`` or ``(B, H_kv)``), on the same device as ``q``."""
    if not isinstance(schedule, BlockSchedule):
        raise TypeError(f"schedule must be a topo_attn.BlockSchedule, got {type(schedule).__name__}")
    if schedule.transposed:
        raise ValueError("schedule is transposed (rows are key blocks); pass the row schedule, not schedule.transpose()")
    if schedule.seq_len != shape.kv_len:
        raise ValueError(
            f"schedule was built for seq_len={schedule.seq_len} (block_size={schedule.block_size}), "
            f"but k has sequence length {shape.kv_len}"
        )
    if schedule.q_len != shape.seq_len:
        raise ValueError(
            f"schedule was built for q_len={schedule.q_len} queries, but q has sequence length {shape.seq_len} "
            f"(build it with q_len={shape.seq_len}, e.g. schedule.for_queries({shape.seq_len}))"
        )
    kv_lanes = (shape.batch, shape.kv_heads)
    if schedule.lanes is not None and schedule.lanes not in (shape.lanes, kv_lanes):
        raise ValueError(
            f"schedule holds one row-set per lane for lanes {schedule.lanes}, but q has (B, H) = {shape.lanes} "
            f"and k has (B, H_kv) = {kv_lanes}"
        )
    if schedule.device != device:
        raise ValueError(
            f"schedule is on {schedule.device} but q is on {device}; they must be on the same device "
            f"(use schedule.to(q.device))"
        )
    return schedule


def lane_group(schedule: BlockSchedule, heads: int) -> int:
    """Query heads per row-set of a lane schedule: 1 for ``(B, H)`` lanes, ``H // H_kv`` for ``(B, H_kv)``
    lanes (``heads`` query heads); 1 for a shared schedule."""
    return 1 if schedule.lanes is None else heads // schedule.lanes[1]
