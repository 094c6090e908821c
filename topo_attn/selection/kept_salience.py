"""The salience a static decode step keeps for ``topology``: bars of the key-block centroids updated in place when
a block completes, in fixed shapes, so that a step spends nothing on scoring.

#22's salience of a prefix of blocks (:func:`~topo_attn.block_salience`) needs the prefix's whole minimum
spanning tree and a union-find over its edges in order (``O(n^2 D)`` and a sequential loop per completed block);
:class:`~topo_attn.selection.static_step.StaticBlockStats` keeps one *bar* per block instead, changed only when a
block completes, at ``O(n D)`` per completed block (one row of distances), under the **elder rule by age**: when
two components meet, the younger one (that of the younger oldest block) dies, so a block's bar is the distance at
which its component first meets an older block, the bottleneck (minimax) distance from the block to the blocks
older than it over paths through any blocks.

- **The block that completes** is the youngest: its bar is its distance to the nearest older block,
  ``bar[n] = min_{o < n} |c_n - c_o|``, exactly (that edge is ``n``'s shortest, an edge of the minimum spanning
  tree of blocks ``0 .. n``). Block 0, the oldest, never dies: ``bar[0] = inf`` (the barcode's infinite bar).
- **Older bars** can only shorten as blocks come. The kept bars take the paths of two edges through the new block,
  ``m -> n -> o`` with ``o < m``: ``bar[m] = min(bar[m], max(|c_n - c_m|, min_{o < m} |c_n - c_o|))`` for every
  ``m < n``, a prefix minimum of ``n``'s distance row. Paths through several later blocks are missed, so a kept
  bar is an upper bound of the rule's bar, exact for the youngest block.

This is not #22's rule: there the *smaller* component dies and every block of it takes the merge distance (a
small far cluster gets its distance to the rest on every block, here only its oldest block does), and later
merges overwrite earlier values. What the difference costs in chosen blocks and attention mass is measured by
:mod:`topo_attn.selection.static_quality` (``topo_attn/selection/NOTES.md``). The rule of the nearest older block
alone, without the shortening, kept less of the exact choice's attention mass and recall on the captured real keys
(on synthetic clustered keys both keep about all of its mass).
"""

from __future__ import annotations

import torch


def update_kept_salience(salience: torch.Tensor, centroids: torch.Tensor, blocks: torch.Tensor,
                         completed: torch.Tensor) -> None:
    """Apply the rule (module docstring) for the blocks that completed, in place, in fixed shapes.

    Arguments:
        salience: the kept bars ``[B, H_kv, nb]``, updated in place; entries of blocks that are not complete are
            never read here.
        centroids: ``[B, H_kv, nb, D]`` of the same dtype, already holding the completed blocks' centroids (and
            every earlier block's).
        blocks: int64 ``[T]``, the blocks the update touched, in increasing order; a block given twice has the
            same ``completed`` each time.
        completed: bool ``[T]``, whether that block completed in this update (all its keys are in, its last one
            written now).
    """
    nb = centroids.shape[-2]
    # -- each completed block's distances to the blocks older than it; inf elsewhere (and for other blocks)
    dist = torch.cdist(centroids.index_select(2, blocks), centroids,
                       compute_mode="donot_use_mm_for_euclid_dist")  # [B, H_kv, T, nb]
    older = torch.arange(nb, device=blocks.device)[None, :] < blocks[:, None]  # [T, nb]
    dist = dist.masked_fill(~(older & completed[:, None]), float("inf"))
    # -- the completed block's bar: its nearest older block (inf for block 0)
    nearest = dist.amin(-1)  # [B, H_kv, T]
    salience.index_copy_(2, blocks, torch.where(completed, nearest, salience.index_select(2, blocks)))
    # -- older bars cut by the paths m -> n -> o < m through each completed block n (a later completed block of
    #    the same update cuts the bars just written, as one after the other would)
    through = torch.maximum(dist[..., 1:], dist[..., :-1].cummin(-1).values)  # [B, H_kv, T, nb - 1]: m = 1 ..
    salience[..., 1:].copy_(torch.minimum(salience[..., 1:], through.amin(-2)))
