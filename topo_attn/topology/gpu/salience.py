"""#22's elder-rule salience on the GPU, for many lanes at once (a lane: a (batch, head) pair or a shared
schedule's single lane), with no host round trip and no Python loop over lanes or blocks.

Three stages, each in its own module:

1. the distances between block centroids (:mod:`.distances`), which also flag whether the centroids are finite;
2. the minimum spanning tree under the strict order ``(distance, min(i, j), max(i, j))`` (the same unique tree
   as ``persistence.prim_tree``) and its *Prim order*, one of two ways picked by :func:`choose_mst`: Prim over
   all pairs (:func:`.prim.prim_all_pairs`), or Boruvka rounds (:mod:`.boruvka`), the ranks of the tree edges
   and Prim's order over the tree alone, in parallel (:mod:`.prim_order`) or step by step
   (:func:`.prim.tree_prim_order`);
3. the elder rule over the Prim order (:mod:`.elder`), at the end of the Prim program for small trees or in two
   grids.

Prim keeps its per-block state in registers, ``next_power_of_2(n)`` wide, so ``n`` is limited to
:data:`~topo_attn.topology.gpu.MAX_BLOCKS`.
"""

from __future__ import annotations

import torch

from .boruvka import boruvka
from .distances import distances, finite_flags
from .elder import elder_in_grids
from .prim import edge_ranks, prim_all_pairs, tree_prim_order
from .prim_order import prim_order_parallel

ELDER_IN_PROGRAM = 64
"""Most blocks for which the elder rule's passes run at the end of the Prim program by default; larger trees get
a grid of programs for each pass (faster from 128 blocks on the H200; topology/NOTES.md, "Numbers that were in
the code")."""

PARALLEL_ORDER_MAX_BLOCKS = 2048
"""Most blocks for which Boruvka builds find Prim's order with :mod:`.prim_order` by default (faster than the
step-by-step walk on the H200 up to this size; not timed above)."""

PRIM_MAX_BLOCKS = 32
"""Most blocks for which Prim over all pairs is used; above, Boruvka and Prim over the tree (Boruvka was as fast
from 64 blocks and faster from 128 on the H200)."""

BORUVKA_MAX_BYTES = 256 * 2**20
"""Most bytes of stored distances (the upper triangle, all lanes) for Boruvka; above, Prim over all pairs is
used: each Boruvka round rereads all of them from HBM once they outgrow the L2. Boruvka was still the faster
at 32 lanes of 2048 float32 blocks (256 MiB: 2.16 ms, against 2.7-4.1 ms for Prim's one program per lane over
2048 blocks) and the slower at 32 lanes of 2048 float64 blocks (1 GiB: 10.2 against 7.37 ms); see
topology/NOTES.md, "Numbers that were in the code"."""

MSTS = ("prim", "boruvka")
"""The tree searches that :func:`salience_kernels` takes: Prim over all pairs, Boruvka rounds."""


def choose_mst(lanes: int, n: int, dtype: torch.dtype) -> str:
    """The tree search that :func:`salience_kernels` uses by default.

    Arguments:
        lanes, n: lanes and blocks per lane.
        dtype: the centroids' dtype, float32 or float64.

    Returns:
        ``"prim"`` up to :data:`PRIM_MAX_BLOCKS` blocks or above :data:`BORUVKA_MAX_BYTES` bytes of distances,
        else ``"boruvka"``.
    """
    big = lanes * n * n // 2 * torch.finfo(dtype).bits // 8 > BORUVKA_MAX_BYTES
    return "prim" if n <= PRIM_MAX_BLOCKS or big else "boruvka"


def salience_kernels(centroids: torch.Tensor, *, mst: str | None = None, elder_in_program: bool | None = None,
                     parallel_order: bool | None = None) -> torch.Tensor:
    """Elder-rule salience of each lane's blocks, computed in Triton kernels.

    Distances are ``sqrt(sum((c_i - c_j)^2))`` in the centroids' dtype (no Gram-matrix shortcut), so they are
    exactly symmetric; they differ from the CPU path's only in the rounding of the sum. Centroids that are not
    finite give meaningless saliences (but no access out of bounds): callers check them.

    Arguments:
        centroids: ``[L, n, D]``, float32 or float64, contiguous, ``1 <= n <=``
            :data:`~topo_attn.topology.gpu.MAX_BLOCKS`, on a CUDA device or (Triton's interpreter) the CPU.
        mst: the tree search, ``"prim"`` (Prim over the whole distance matrix) or ``"boruvka"`` (parallel rounds,
            then Prim's order over the tree's edges alone); None: :func:`choose_mst`.
        elder_in_program: run the elder rule's passes at the end of the Prim program (True) or in two grids
            (False); None: in the program up to :data:`ELDER_IN_PROGRAM` blocks.
        parallel_order: with Boruvka, find Prim's order with :mod:`.prim_order` (Euler tours and binary lifting)
            instead of one step per block (its elder passes then run in grids); None: up to
            :data:`PARALLEL_ORDER_MAX_BLOCKS` blocks unless the passes run in the program.

    Returns:
        ``[L, n]`` in the centroids' dtype and device (``1`` for a single block).

    Raises:
        ValueError: ``mst`` is not one of :data:`MSTS` (checked for ``n > 1``).
    """
    return salience_and_finite(centroids, mst=mst, elder_in_program=elder_in_program,
                               parallel_order=parallel_order)[0]


def salience_and_finite(centroids: torch.Tensor, *, mst: str | None = None, elder_in_program: bool | None = None,
                        parallel_order: bool | None = None, out: torch.Tensor | None = None,
                        finite: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`salience_kernels` and, found on the way by the distance kernel, whether the centroids are finite.

    Arguments:
        centroids, mst, elder_in_program, parallel_order: as :func:`salience_kernels`.
        out: a contiguous ``[L, n]`` tensor of the centroids' dtype and device for the saliences, or None.
        finite: a :func:`.distances.finite_flags` buffer for the flags (``n > 1``), or None.

    Returns:
        ``(salience, flags)``: the saliences (``out`` if given) and device flags (int32 or bool, some shape)
        that are all nonzero if and only if every centroid is finite. No host sync.

    Raises:
        ValueError: ``mst`` is not one of :data:`MSTS` (checked for ``n > 1``).
    """
    lanes, n, _ = centroids.shape
    if n == 1:  # a single block: #22's convention
        salience = torch.ones(lanes, 1, dtype=centroids.dtype, device=centroids.device)
        return (salience if out is None else out.copy_(salience)), torch.isfinite(centroids).all(-1)
    if mst is None:
        mst = choose_mst(lanes, n, centroids.dtype)
    if mst not in MSTS:
        raise ValueError(f"mst must be 'prim' or 'boruvka', got {mst!r}")
    device = centroids.device
    order, pair, side_lo, side_hi = torch.empty(4, lanes, n, dtype=torch.int32, device=device).unbind(0)
    length = torch.empty(lanes, n, dtype=centroids.dtype, device=device)
    salience = torch.empty_like(length) if out is None else out
    if finite is None:
        finite = finite_flags(lanes, n, device)
    in_program = n <= ELDER_IN_PROGRAM if elder_in_program is None else elder_in_program
    if parallel_order is None:  # (the walk keeps the elder passes in its program for small trees)
        parallel_order = n <= PARALLEL_ORDER_MAX_BLOCKS and not in_program
    if mst == "boruvka":
        # -- the tree by Boruvka rounds, its edges' ranks, then Prim's order over it
        edge_lo, edge_hi, edge_len, by_rank = boruvka(centroids, finite)
        edge_ranks(edge_lo, edge_hi, edge_len, by_rank)
        if parallel_order:
            prim_order_parallel(edge_lo, edge_hi, edge_len, by_rank, order, pair, length)
            in_program = False  # the elder passes in their grids
        else:
            tree_prim_order(edge_lo, edge_hi, edge_len, by_rank, order, pair, length, side_lo, side_hi, salience,
                            elder=in_program)
    else:
        # -- every distance, then Prim over all pairs
        dist = distances(centroids, finite=finite)
        prim_all_pairs(dist, order, pair, length, side_lo, side_hi, salience, elder=in_program)
    if not in_program:
        elder_in_grids(order, pair, length, side_lo, side_hi, salience)
    return salience, finite
