"""``topology``: #22's elder-rule salience of the key-block centroids (0-dimensional persistence of their Rips
filtration), ranked per row at an equal budget. Query-blind: every row of a lane ranks the same way.

Over a whole sequence the salience is that of all key blocks (later ones included); at the end of a cache and
per token it is the salience among the blocks before the step's (the token's) own block, the *prefix* salience,
so no choice reads a later key. A decode step over a static cache ranks the salience its statistics keep instead
(:mod:`.kept_salience`: a bar per block, updated when a block completes), so the step itself scores nothing.
"""

from __future__ import annotations

import torch

from ..topology import block_centroids, block_salience, key_block_salience
from .selector import Scorer, Selector, to_groups


def key_salience(k: torch.Tensor, block_size: int, dtype: torch.dtype) -> torch.Tensor:
    """The elder-rule salience of each key block among all of them, per key/value head: ``[B, H_kv, n]`` from
    ``k [B, H_kv, S, D]``; float64 on the CPU (the exact path), ``dtype`` centroids on a GPU (its kernels, all
    lanes at once, replayed from a CUDA graph, no host sync: the centroids of finite keys need no check;
    :func:`~topo_attn.topology.key_block_salience`)."""
    return key_block_salience(k.detach(), block_size, dtype)


def block_scores(q, k, block_size, groups, dtype, **_) -> torch.Tensor:
    """The salience of each key block, the same in every row: ``[B, groups, n, n]`` (an expanded view)."""
    salience = to_groups(key_salience(k, block_size, dtype), groups).to(dtype)
    n = salience.shape[-1]
    return salience[..., None, :].expand(*salience.shape[:-1], n, n)


def step_scores(q, stats, first, rows, num_rows, seq_len, seed) -> torch.Tensor:
    """From :class:`~topo_attn.selection.incremental.KeyBlockStats`: the salience of blocks ``0 .. first - 1``
    among themselves (computed when ``first`` changes), ``[B, H_kv, R, first]`` float64. From
    :class:`~topo_attn.selection.static_step.StaticBlockStats`: the salience they keep (its tensor ``salience``,
    :mod:`.kept_salience`'s bars), every one of the ``nb_max`` blocks, ``[B, H_kv, R, nb_max]`` in their dtype."""
    salience = stats.salience if isinstance(stats.salience, torch.Tensor) else stats.salience(first)
    return salience[:, :, None, :].expand(q.shape[0], salience.shape[1], num_rows, salience.shape[-1])


def prefix_saliences(k: torch.Tensor, block_size: int) -> torch.Tensor:
    """Per key/value head and block ``b``, the elder-rule salience of each key block among the key blocks
    ``0 .. b - 1`` (:func:`~topo_attn.block_salience` of each prefix of the float64 key-block centroids; the
    Triton kernels on a GPU, numpy on the CPU, ``n`` calls).

    Arguments:
        k: floating ``[B, H_kv, L, D]``; block_size: int ``>= 1``.

    Returns:
        float64 ``[B, H_kv, n, n]`` on k's device, ``[..., b, kb]`` for ``kb < b``, 0 elsewhere (row 0: all 0).
    """
    centroids = block_centroids(k.detach(), block_size)  # float64 [B, Hkv, n, D]
    n = centroids.shape[-2]
    out = torch.zeros(*centroids.shape[:-1], n, dtype=torch.float64, device=k.device)
    for b in range(1, n):
        out[..., b, :b] = block_salience(centroids[..., :b, :])
    return out


def token_scores(q, k, block_size, scale, seed) -> Scorer:
    """The salience of each key block among the blocks before the token's own (:func:`prefix_saliences`)."""
    salience = to_groups(prefix_saliences(k, block_size), q.shape[1])
    block_of = torch.arange(q.shape[-2], device=q.device) // block_size
    return lambda rows: salience[..., block_of[rows], :]


SELECTOR = Selector("topology", "the elder-rule salience, top-budget per row among the causal blocks outside "
                    "sinks/window", block_scores, step_scores, token_scores, topology_aware=True,
                    static_step=True)
