"""KV-cache eviction: a fixed memory budget of key/value blocks per (batch, key/value head), chosen once at the end
of the prefill (:func:`evict`) and again as blocks complete (:func:`update`), query-blind where the policy is
(future queries are unknown).

One module per policy, each describing itself with an :class:`EvictionPolicy` (its exact definition in its
docstring): ``salience`` (the elder-rule salience of the block centroids among the blocks in the cache),
``streaming`` (StreamingLLM: sinks and the most recent blocks), ``h2o`` (the attention accumulated from every
query so far), ``snapkv`` (the attention of the last window of queries) and ``random`` (seeded). ``policy``
holds the interface, the budget rule and the update; ``cache`` applies a choice to a key/value cache.

Example::

    choice = evict("salience", keys, block_size=64, keep=32, sinks=1, window=2)   # keys [B, H_kv, S, D]
    k_cache, v_cache = compact(keys, choice), compact(values, choice)          # choice.kept [B, H_kv, 32]
    ...                                                                        # decode a block: append k, v
    choice = update(choice, k_cache)             # h2o, snapkv: update(choice, k_cache, queries=q_new)
    k_cache, v_cache = compact(k_cache, choice), compact(v_cache, choice)
"""

from __future__ import annotations

import torch

from . import h2o, random, salience, snapkv, streaming
from .cache import compact, positions, token_mask
from .policy import BlockScores, CacheView, Eviction, EvictionConfig, EvictionPolicy, budget_rows, update

POLICIES: dict[str, EvictionPolicy] = {module.POLICY.name: module.POLICY for module in (
    salience, streaming, h2o, snapkv, random)}
"""Every eviction policy by name, in the order tables list them."""


def get(name: object) -> EvictionPolicy:
    """The policy called ``name`` (or ``name`` itself, an :class:`EvictionPolicy`). Raises ``TypeError`` for
    another type and ``ValueError`` naming the policies there are."""
    if isinstance(name, EvictionPolicy):
        return name
    if not isinstance(name, str):
        raise TypeError(f"policy must be a str or an EvictionPolicy, got {type(name).__name__}")
    if name not in POLICIES:
        raise ValueError(f"policy must be one of {list(POLICIES)}, got {name!r}")
    return POLICIES[name]


def evict(policy: str | EvictionPolicy, keys: torch.Tensor, block_size: int, keep: int, **options) -> Eviction:
    """The first choice of ``policy`` (a name of :data:`POLICIES` or a policy) at the end of the prefill:
    :meth:`EvictionPolicy.evict` (``sinks``, ``window``, ``queries``, ``scale``, ``observation``, ``pool``,
    ``seed`` as keywords)."""
    return get(policy).evict(keys, block_size, keep, **options)


__all__ = ["POLICIES", "BlockScores", "CacheView", "Eviction", "EvictionConfig", "EvictionPolicy", "budget_rows",
           "compact", "evict", "get", "positions", "token_mask", "update"]
