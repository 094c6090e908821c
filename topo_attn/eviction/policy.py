"""The common interface of the eviction policies: what a policy is (:class:`EvictionPolicy`), the budget rule
they share, the first choice at the end of the prefill (:meth:`EvictionPolicy.evict`) and the choice again when
blocks complete (:func:`update`).

**Blocks.** A layer's key/value cache is cut into blocks of ``block_size`` tokens at absolute positions
``0, block_size, ...``; after ``length`` tokens there are ``n = ceil(length / block_size)`` blocks, the last one
partial when ``length`` is not a multiple of ``block_size`` (the block being written).

**The budget rule.** A choice keeps exactly ``keep`` blocks per (batch, key/value head) among the blocks still in
the cache: the ``sinks`` first blocks (absolute ``0 .. sinks - 1``), the ``window`` most recent blocks (absolute
``n - window .. n - 1``), and the ``keep - sinks - window`` best-scored others (the *candidates*), where the
policy's score is higher-is-better and ties go to the lower block index. ``sinks + window <= keep <= n`` is
required, so the sinks, the window and the candidates never overlap. With ``window = 0`` every choice must fall
on a block boundary (the block being written cannot be evicted).

**The cache layout.** After a choice the cache holds the kept blocks' tokens in increasing position, then the
tokens written since (:func:`~topo_attn.eviction.cache.compact` builds it from the cache the choice read). Every
lane holds the same number of tokens and the same block structure (complete kept blocks, then the blocks written
since, the last one possibly partial), so the kept blocks of a lane are read as blocks ``0, 1, ...`` of the
compact cache and the most recent blocks are its last ones. :func:`update` reads that compact cache only: an
evicted block is gone and never read again.

**The result.** An :class:`Eviction`: ``kept``, int64 ``[B, H_kv, keep]``, the absolute indices of the kept blocks
in increasing order (the representation chosen: indices, not a mask), and what the next :func:`update` needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .._checks import check_finite, check_int, check_scale, check_tensor
from ..schedule import num_blocks
from ..selection.oracle import token_block_mass
from ..selection.topk import ranked_candidates

MASS_CHUNK = 256
"""Query rows per softmax in :func:`received_attention` (memory ``O(chunk * T)`` per lane)."""


@dataclass(frozen=True)
class EvictionConfig:
    """The settings of a choice, validated by :meth:`EvictionPolicy.evict`: ``block_size`` (tokens per block),
    ``keep`` (the memory budget in blocks), ``sinks`` and ``window`` (blocks always kept), ``scale`` (the softmax
    scale of the policies that read attention), ``observation`` (SnapKV's observation window, in queries),
    ``pool`` (SnapKV's pooling radius, in blocks) and ``seed`` (the random policy's seed)."""

    block_size: int
    keep: int
    sinks: int
    window: int
    scale: float
    observation: int
    pool: int
    seed: int


@dataclass(frozen=True)
class CacheView:
    """What a policy's score function reads: the cache as it stands at a choice.

    ``keys``: ``[B, H_kv, T, D]``, the cached tokens' keys in the compact layout (module docstring), float64 for
    a ``query_aware`` policy, else in their own dtype;
    ``blocks``: int64 ``[B, H_kv, m]``, the absolute index of each of its ``m = ceil(T / block_size)`` blocks
    (increasing); ``length``: the absolute number of tokens written so far (``blocks[..., -1]`` is the block
    holding token ``length - 1``); ``queries``: float64 ``[B, H, L, D]``, the queries of the last ``L`` tokens
    (positions ``T - L .. T - 1`` of ``keys``), or None when the policy reads none; ``carry``: float64
    ``[B, H_kv, c]``, what the policy carried from its previous choice for the cache's first ``c`` blocks (the
    blocks it kept), or None at the first choice and for policies that carry nothing."""

    keys: torch.Tensor
    blocks: torch.Tensor
    length: int
    queries: torch.Tensor | None
    carry: torch.Tensor | None


class BlockScores(NamedTuple):
    """A policy's answer: ``scores``, float64 ``[B, H_kv, m]`` (higher is kept first; the sinks' and the window's
    are computed but not used), and ``carry``, float64 ``[B, H_kv, m]`` to carry to the next choice (for the
    blocks that stay), or None."""

    scores: torch.Tensor
    carry: torch.Tensor | None


ScoreFunction = Callable[[CacheView, EvictionConfig], BlockScores]


@dataclass(frozen=True)
class Eviction:
    """One choice of a policy, and the state the next :func:`update` needs.

    ``kept``: int64 ``[B, H_kv, keep]``, the absolute indices of the kept blocks, increasing.
    ``rows``: int64 ``[B, H_kv, keep]``, their positions among the blocks of the cache this choice read (equal
    to ``kept`` at the first choice), what :func:`~topo_attn.eviction.cache.compact` gathers.
    ``scores``: float64 ``[B, H_kv, m]``, the policy's score of every block of that cache.
    ``carry``: float64 ``[B, H_kv, keep]``, what the policy carries for the kept blocks (H2O's accumulated
    attention), or None.
    ``length``: the absolute number of tokens written at this choice; ``cache_tokens``: the tokens of the
    cache this choice read (``T``); ``head_dim``, ``query_heads``: the keys' ``D`` and the queries' ``H`` seen
    (``query_heads`` is None until queries are given)."""

    policy: "EvictionPolicy"
    config: EvictionConfig
    kept: torch.Tensor
    rows: torch.Tensor
    scores: torch.Tensor
    carry: torch.Tensor | None
    length: int
    cache_tokens: int
    head_dim: int
    query_heads: int | None

    @property
    def num_blocks(self) -> int:
        """``n = ceil(length / block_size)``, the blocks written so far (kept or evicted)."""
        return num_blocks(self.length, self.config.block_size)

    @property
    def cached_tokens(self) -> int:
        """Tokens in the cache after compacting: ``keep`` blocks, the last one partial when ``length`` is not a
        multiple of ``block_size`` (then it is the block being written, always kept)."""
        bs = self.config.block_size
        return self.config.keep * bs - (self.num_blocks * bs - self.length)

    @property
    def cache_fraction(self) -> float:
        """``cached_tokens / length``, the share of the written tokens the cache holds."""
        return self.cached_tokens / self.length


@dataclass(frozen=True)
class EvictionPolicy:
    """An eviction policy: ``name``, ``description``, ``scores`` (its :data:`ScoreFunction`) and what it reads.

    ``query_aware``: it reads queries (``evict`` and ``update`` then require them); ``all_queries``: it needs the
    query of every token written since the previous choice (H2O accumulates them; SnapKV reads the last
    ``observation`` ones only); ``topology_aware``: it reads the elder-rule salience; ``carries``: its scores
    depend on the history of the cache (H2O), so :func:`update` is not a choice from scratch over the cache."""

    name: str
    description: str
    scores: ScoreFunction
    query_aware: bool = False
    all_queries: bool = False
    topology_aware: bool = False
    carries: bool = False

    def evict(self, keys: torch.Tensor, block_size: int, keep: int, *, sinks: int = 1, window: int = 1,
              queries: torch.Tensor | None = None, scale: float | None = None, observation: int = 32,
              pool: int = 0, seed: int = 0) -> Eviction:
        """The first choice, at the end of the prefill: ``keep`` blocks of ``keys`` (module docstring).

        Arguments:
            keys: floating ``[B, H_kv, S, D]``, the layer's keys (positions ``0 .. S - 1``), finite.
            block_size: tokens per block, ``>= 1``.
            keep: blocks to keep per (batch, key/value head), ``sinks + window <= keep <= ceil(S / block_size)``.
            sinks, window: blocks always kept at the start and at the end, ``>= 0`` (``window >= 1`` unless ``S``
                is a multiple of ``block_size``).
            queries: floating ``[B, H, L, D]`` (``H`` a multiple of ``H_kv``), the queries of the last ``L`` tokens
                (positions ``S - L .. S - 1``), finite; required when ``query_aware`` (``L = S`` when
                ``all_queries``), else ignored (checked when given).
            scale: the softmax scale of the attention read (``1 / sqrt(D)`` when None).
            observation: SnapKV's observation window, queries ``>= 1``; pool: SnapKV's pooling radius in blocks,
                ``>= 0``; seed: the random policy's seed, ``>= 0``.

        Raises:
            TypeError: a non-tensor or non-floating tensor, a non-int size.
            ValueError: a bad shape, a negative size, a budget that does not fit, NaN or Inf in keys or queries.
        """
        keys = check_cache_keys("keys", keys)
        batch, kv_heads, seq, dim = keys.shape
        block_size = check_int("block_size", block_size, 1)
        config = EvictionConfig(block_size, check_int("keep", keep, 1), check_int("sinks", sinks),
                                check_int("window", window), check_scale(scale, dim),
                                check_int("observation", observation, 1), check_int("pool", pool),
                                check_int("seed", seed))
        check_budget(config, seq)
        queries = self.check_queries(queries, keys, seq, "keys")
        n = num_blocks(seq, block_size)
        blocks = torch.arange(n, device=keys.device).expand(batch, kv_heads, n)
        view = CacheView(self.view_keys(keys), blocks, seq, queries, None)
        return self.choose(view, config, dim, None if queries is None else queries.shape[1])

    def check_queries(self, queries: object, keys: torch.Tensor, new: int, keys_name: str) -> torch.Tensor | None:
        """Queries for a choice over ``keys`` whose last ``new`` tokens are the ones written since the previous
        choice (all of them at the first): float64 ``[B, H, L, D]``, or None when the policy reads none."""
        if queries is None:
            if self.query_aware:
                raise ValueError(f"queries are required by the {self.name!r} policy, got None")
            return None
        queries = check_tensor("queries", queries)
        if queries.ndim != 4:
            raise ValueError(f"queries must have shape [B, H, L, D], got shape {tuple(queries.shape)}")
        if not queries.is_floating_point():
            raise TypeError(f"queries must be a floating-point tensor, got {queries.dtype}")
        batch, kv_heads, _, dim = keys.shape
        if queries.device != keys.device:
            raise ValueError(f"queries are on {queries.device} but {keys_name} on {keys.device}")
        if queries.shape[0] != batch or queries.shape[-1] != dim:
            raise ValueError(f"queries must have batch {batch} and head dimension {dim} (those of {keys_name}), "
                             f"got shape {tuple(queries.shape)}")
        if queries.shape[1] == 0 or queries.shape[1] % kv_heads:
            raise ValueError(f"queries must have a multiple of {kv_heads} heads (the key/value heads of "
                             f"{keys_name}), got shape {tuple(queries.shape)}")
        length = queries.shape[2]
        if self.query_aware and self.all_queries and length != new:
            raise ValueError(f"queries must hold the {new} queries written since the previous choice (the "
                             f"{self.name!r} policy accumulates every query), got {length}")
        if not 1 <= length <= new:
            raise ValueError(f"queries must hold 1 .. {new} queries (those written since the previous choice), "
                             f"got {length}")
        check_finite("queries", queries)
        return queries.detach().to(torch.float64) if self.query_aware else None

    def view_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """The keys a score function reads: detached, float64 when the policy reads attention (one conversion for
        every chunk of queries), else in their own dtype (the centroids are summed in float64 anyway)."""
        return keys.detach().to(torch.float64) if self.query_aware else keys.detach()

    def choose(self, view: CacheView, config: EvictionConfig, head_dim: int, query_heads: int | None) -> Eviction:
        """The budget rule over checked inputs: score the view's blocks, keep the sinks, the window and the best
        candidates."""
        found = self.scores(view, config)
        rows = budget_rows(found.scores, config.keep, config.sinks, config.window)
        carry = None if found.carry is None else found.carry.gather(-1, rows)
        return Eviction(self, config, view.blocks.gather(-1, rows), rows, found.scores, carry, view.length,
                        view.keys.shape[-2], head_dim, query_heads)


def check_cache_keys(name: str, keys: object) -> torch.Tensor:
    """A floating ``[B, H_kv, T, D]`` tensor of at least one token, one feature and one lane, finite."""
    keys = check_tensor(name, keys)
    if keys.ndim != 4:
        raise ValueError(f"{name} must have shape [B, H_kv, S, D], got shape {tuple(keys.shape)}")
    if not keys.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {keys.dtype}")
    if 0 in keys.shape:
        raise ValueError(f"{name} must have at least one batch, head, token and feature, got shape "
                         f"{tuple(keys.shape)}")
    check_finite(name, keys)
    return keys


def check_budget(config: EvictionConfig, length: int) -> None:
    """``sinks + window <= keep <= n`` for ``length`` tokens, and a block boundary when ``window = 0``."""
    n = num_blocks(length, config.block_size)
    if config.keep < config.sinks + config.window:
        raise ValueError(f"keep must be >= sinks + window = {config.sinks + config.window} (the blocks always "
                         f"kept), got {config.keep}")
    if config.keep > n:
        raise ValueError(f"keep must be <= the number of blocks, ceil({length} / {config.block_size}) = {n}, "
                         f"got {config.keep}")
    if config.window == 0 and length % config.block_size:
        raise ValueError(f"window must be >= 1 when the last block is partial (length {length} is not a "
                         f"multiple of block_size {config.block_size}): the block being written is always kept")


def budget_rows(scores: torch.Tensor, keep: int, sinks: int, window: int) -> torch.Tensor:
    """The budget rule on the scores ``[B, H_kv, m]`` of the blocks of a cache (in increasing position): the
    positions (int64 ``[B, H_kv, keep]``, increasing) of the first ``sinks`` blocks, the last ``window`` ones and
    the ``keep - sinks - window`` best-scored others, ties to the lower position (the selectors' ranking,
    :func:`~topo_attn.selection.topk.ranked_candidates`)."""
    *lanes, m = scores.shape
    device = scores.device
    every = torch.ones((), dtype=torch.bool, device=device)  # every block between the sinks and the window
    order = ranked_candidates(scores[..., sinks:m - window], every, keep - sinks - window)
    chosen = torch.cat([torch.arange(sinks, device=device).expand(*lanes, sinks), order + sinks,
                        torch.arange(m - window, m, device=device).expand(*lanes, window)], dim=-1)
    return torch.sort(chosen, dim=-1).values


def received_attention(keys: torch.Tensor, queries: torch.Tensor, block_size: int, scale: float,
                       chunk: int | None = None) -> torch.Tensor:
    """The causal softmax mass each block of ``keys`` receives from ``queries``, summed over the queries and over
    the query heads of each key/value head: float64 ``[B, H_kv, m]``.

    ``keys``: float64 ``[B, H_kv, T, D]``; ``queries``: float64 ``[B, H, L, D]``, at positions ``T - L .. T - 1``
    of ``keys`` (query ``i`` sees keys ``0 .. T - L + i``); each query's softmax
    (:func:`~topo_attn.selection.oracle.token_block_mass`) spreads mass 1 over the keys it sees. ``chunk``: query
    rows per softmax (:data:`MASS_CHUNK` when None)."""
    chunk = MASS_CHUNK if chunk is None else chunk
    batch, heads, count, _ = queries.shape
    kv_heads, total = keys.shape[1], keys.shape[-2]
    mass = torch.zeros(batch, heads, num_blocks(total, block_size), dtype=torch.float64, device=keys.device)
    for start in range(0, count, chunk):
        rows = queries[..., start:start + chunk, :]
        mass += token_block_mass(rows, keys, total - count + start, block_size, scale).sum(-2)
    return mass.view(batch, kv_heads, heads // kv_heads, -1).sum(2)


def update(eviction: Eviction, cache_keys: torch.Tensor, queries: torch.Tensor | None = None) -> Eviction:
    """The choice again, when blocks complete (decode): ``keep`` blocks among those of the cache, the kept
    blocks plus every token written since ``eviction``, read from the compact cache only.

    Arguments:
        eviction: the previous choice.
        cache_keys: floating ``[B, H_kv, T, D]``, finite: the compact cache of ``eviction``
            (:func:`~topo_attn.eviction.cache.compact` of the keys it read, ``eviction.cached_tokens`` tokens)
            followed by the keys of the ``T - eviction.cached_tokens >= 1`` tokens written since.
        queries: floating ``[B, H, L, D]``, the queries of the last ``L`` of the tokens written since (all of them
            for a policy with ``all_queries``), with the heads of the earlier queries; required when the policy
            is ``query_aware``, else ignored.

    Returns:
        The new :class:`Eviction` (``length`` grown by the new tokens; ``rows`` index the blocks of
        ``cache_keys``).

    Raises:
        TypeError: a non-Eviction or a non-tensor.
        ValueError: a cache of another batch, head count, head dimension or device, no new token, bad queries,
            a partial last block with ``window = 0``, NaN or Inf.
    """
    if not isinstance(eviction, Eviction):
        raise TypeError(f"eviction must be an Eviction, got {type(eviction).__name__}")
    keys = check_cache_keys("cache_keys", cache_keys)
    policy, config, kept = eviction.policy, eviction.config, eviction.kept
    lanes, cached = tuple(kept.shape[:2]), eviction.cached_tokens
    if tuple(keys.shape[:2]) != lanes or keys.shape[-1] != eviction.head_dim or keys.device != kept.device:
        raise ValueError(f"cache_keys must have shape [{lanes[0]}, {lanes[1]}, T, {eviction.head_dim}] on "
                         f"{kept.device} (the cache of the eviction), got shape {tuple(keys.shape)} on {keys.device}")
    new = keys.shape[-2] - cached
    if new < 1:
        raise ValueError(f"cache_keys must hold the {cached} cached tokens and at least one new one, got "
                         f"{keys.shape[-2]} tokens")
    length = eviction.length + new
    check_budget(config, length)
    queries = policy.check_queries(queries, keys, new, "cache_keys")
    if queries is not None and eviction.query_heads is not None and queries.shape[1] != eviction.query_heads:
        raise ValueError(f"queries must have the {eviction.query_heads} heads of the earlier queries, got shape "
                         f"{tuple(queries.shape)}")
    fresh = torch.arange(eviction.num_blocks, num_blocks(length, config.block_size), device=keys.device)
    blocks = torch.cat([kept, fresh.expand(*lanes, fresh.numel())], dim=-1)
    view = CacheView(policy.view_keys(keys), blocks, length, queries, eviction.carry)
    heads = eviction.query_heads if queries is None else queries.shape[1]
    return policy.choose(view, config, eviction.head_dim, heads)
