"""Applying a choice to a key/value cache: :func:`compact` gathers the kept blocks of the cache a choice read
(keys or values), the compact layout :func:`~topo_attn.eviction.update` reads next; :func:`positions` gives the
absolute position of each token of that compact cache and :func:`token_mask` the kept tokens among all those
written (to simulate eviction with a mask over an uncompacted cache)."""

from __future__ import annotations

import torch

from .._checks import check_tensor
from .policy import Eviction


def check_eviction(eviction: object) -> Eviction:
    if not isinstance(eviction, Eviction):
        raise TypeError(f"eviction must be an Eviction, got {type(eviction).__name__}")
    return eviction


def token_rows(eviction: Eviction) -> torch.Tensor:
    """The positions in the cache the choice read of the tokens it keeps: int64 ``[B, H_kv, cached_tokens]``,
    increasing (the kept blocks' tokens; a partial last block, always the last kept, its real tokens only)."""
    bs = eviction.config.block_size
    offsets = torch.arange(bs, device=eviction.rows.device)
    return (eviction.rows[..., None] * bs + offsets).flatten(-2)[..., :eviction.cached_tokens]


def compact(cache: torch.Tensor, eviction: Eviction) -> torch.Tensor:
    """The kept blocks of ``cache``: ``[B, H_kv, T, E]`` (keys or values; ``T = eviction.cache_tokens``, the cache
    the choice read: the prefill's keys at the first choice, the ``cache_keys`` of an update) ->
    ``[B, H_kv, eviction.cached_tokens, E]``, per lane the tokens of the blocks ``eviction.rows`` in increasing
    position. Reads only those tokens. Raises ``TypeError`` for a non-tensor or non-Eviction and ``ValueError``
    for a cache of another shape or device."""
    cache, eviction = check_tensor("cache", cache), check_eviction(eviction)
    lanes = tuple(eviction.rows.shape[:2])
    if (cache.ndim != 4 or tuple(cache.shape[:2]) != lanes or cache.shape[2] != eviction.cache_tokens
            or cache.device != eviction.rows.device):
        raise ValueError(f"cache must have shape [{lanes[0]}, {lanes[1]}, {eviction.cache_tokens}, E] on "
                         f"{eviction.rows.device} (the cache the choice read), got shape {tuple(cache.shape)} on "
                         f"{cache.device}")
    index = token_rows(eviction)
    return cache.gather(2, index[..., None].expand(*index.shape, cache.shape[-1]))


def positions(eviction: Eviction) -> torch.Tensor:
    """The absolute position of each token of the compact cache: int64 ``[B, H_kv, cached_tokens]``,
    increasing."""
    eviction = check_eviction(eviction)
    bs = eviction.config.block_size
    offsets = torch.arange(bs, device=eviction.kept.device)
    return (eviction.kept[..., None] * bs + offsets).flatten(-2)[..., :eviction.cached_tokens]


def token_mask(eviction: Eviction) -> torch.Tensor:
    """Which of the ``length`` tokens written the cache holds: bool ``[B, H_kv, length]``."""
    eviction = check_eviction(eviction)
    found = positions(eviction)
    mask = torch.zeros(*found.shape[:2], eviction.length, dtype=torch.bool, device=found.device)
    return mask.scatter_(-1, found, True)
