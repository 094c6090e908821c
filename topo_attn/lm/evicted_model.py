"""A causal LM scored teacher-forced with its key/value cache evicted by a policy of :mod:`topo_attn.eviction`.

:class:`EvictedModel` wraps a transformers causal LM (the kit's byte model, or any model whose attention layers
call transformers' attention interface with ``module.layer_idx`` and take ``position_ids``) so that one call on
whole sequences ``ids [B, L]`` computes, per layer:

1. the **prefill**, positions ``0 .. prefix - 1``, with dense causal attention (the whole prompt is in the cache,
   as in H2O's and SnapKV's setting);
2. the **first choice** at its end: :func:`topo_attn.eviction.evict` over the layer's keys ``[B, H_kv, prefix,
   D]``, with the layer's prefill queries for the query-aware policies (``h2o`` all of them, ``snapkv`` the last
   ``observation``), and the cache compacted to the kept blocks (:func:`~topo_attn.eviction.compact`);
3. the **continuation**, ``prefix .. L - 1``, in chunks that end on block boundaries: every query of a chunk
   attends exactly to the layer's cache (the kept blocks' tokens) and to the chunk's tokens up to itself
   (:func:`kept_attention`); after each chunk that completes a block (every chunk but the last), the choice again
   (:func:`~topo_attn.eviction.update` over the compact cache followed by the chunk, with the chunk's queries for
   the query-aware policies) and the cache compacted. So after a choice a layer holds ``keep`` blocks, and at most
   ``keep + 1`` blocks (``(keep + 1) * block_size`` tokens) at any time of the continuation.

No look-ahead: a choice reads only the keys (and queries) of tokens already written, so the logits at position
``t`` depend on ``ids[:, :t + 1]`` only; the query-blind policies (``salience``, ``streaming``, ``random``) read
no query at all. Cached keys keep the rotary embedding of their own position (positions are not renumbered after
an eviction, unlike StreamingLLM's in-cache positions). ``policy=None`` evicts nothing: the plain model computed
the same way, the reference.

The attention runs as a transformers attention function registered under :data:`NAME` for the duration of a call
(with a mask function that hands the model no mask), the model's own implementation restored after::

    evicted = EvictedModel(model, prefix=4096, policy="salience", keep=32, block_size=64)
    logits = evicted(ids).logits              # [B, L, vocab]: the prefix dense, the continuation evicted
    evicted.peak_tokens                       # the most tokens a layer's cache held in a continuation

:func:`topo_attn.lm.evaluate.token_losses` and :func:`~topo_attn.lm.evaluate.passkey_scores` take an
:class:`EvictedModel` as they take a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

import torch

from .. import eviction
from .._checks import check_int
from ..eviction import Eviction, EvictionConfig, EvictionPolicy
from ..eviction.policy import check_budget
from ..integrations.transformers import check_attention_call, plain_causal_mask

NAME = "topo_attn_eviction"
"""The ``attn_implementation`` name the attention is registered under during a call."""


def kept_attention(query: torch.Tensor, cache_keys: torch.Tensor, cache_values: torch.Tensor, keys: torch.Tensor,
                   values: torch.Tensor, scale: float) -> torch.Tensor:
    """Exact attention of a chunk of ``c`` queries over a cache and the chunk itself: every query sees every
    cached token and the chunk's tokens up to its own position (the chunk follows the cache).

    Arguments:
        query: floating ``[B, Hq, c, D]``.
        cache_keys, cache_values: ``[B, Hkv, T, D]``, ``T >= 0`` (``T = 0``: plain causal attention), ``Hq`` a
            multiple of ``Hkv``.
        keys, values: ``[B, Hkv, c, D]``, the chunk's.
        scale: the softmax scale.

    Returns:
        ``[B, Hq, c, D]`` in the query's dtype (torch's ``scaled_dot_product_attention`` with a boolean mask, the
        key/value heads repeated for grouped-query attention).
    """
    count, cached = query.shape[-2], cache_keys.shape[-2]
    group = query.shape[1] // keys.shape[1]
    k = torch.cat([cache_keys, keys], dim=-2).repeat_interleave(group, dim=1)
    v = torch.cat([cache_values, values], dim=-2).repeat_interleave(group, dim=1)
    visible = torch.ones(count, cached + count, dtype=torch.bool, device=query.device).tril(diagonal=cached)
    return torch.nn.functional.scaled_dot_product_attention(query, k, v, attn_mask=visible, scale=scale)


def check_budget_fits(prefix: int, keep: int, block_size: int, sinks: int, window: int) -> None:
    """The budget rule of :mod:`topo_attn.eviction.policy` at the first choice, before any work: ``sinks + window
    <= keep <= ceil(prefix / block_size)``, and ``window >= 1`` unless ``prefix`` is a multiple of ``block_size``.
    Raises ``ValueError`` naming the argument (``TypeError`` for a non-int)."""
    config = EvictionConfig(check_int("block_size", block_size, 1), check_int("keep", keep, 1),
                            check_int("sinks", sinks), check_int("window", window), scale=1.0, observation=1, pool=0,
                            seed=0)  # only the sizes are read
    check_budget(config, check_int("prefix", prefix, 1))


class EvictedOutput(NamedTuple):
    """What a call returns: ``logits``, ``[B, L, vocab]`` in the model's dtype."""

    logits: torch.Tensor


@dataclass
class LayerCache:
    """One layer's cache during a call: ``keys``, ``values`` ``[B, H_kv, T, D]`` (the compact cache of the last
    choice, then the tokens written since), ``queries`` (those a query-aware policy reads next, else None),
    ``choice`` (the last :class:`~topo_attn.eviction.Eviction`, None before the first) and ``scale``."""

    keys: torch.Tensor
    values: torch.Tensor
    queries: torch.Tensor | None
    scale: float
    choice: Eviction | None = None


@dataclass
class CallState:
    """The layers' caches of the call in progress, ``queries`` (how many of the latest queries the policy reads:
    None for all of them, 0 for none), and what is recorded: ``held``, the most tokens a layer's
    cache held during the continuation; ``visible`` (when tracing), per layer, per continuation chunk
    ``(start, end, kept)`` with ``kept`` bool ``[B, H_kv, start]``, the tokens before the chunk its queries see."""

    trace: bool
    queries: int | None
    layers: dict[int, LayerCache] = field(default_factory=dict)
    continuing: bool = False
    held: int = 0
    visible: dict[int, list[tuple[int, int, torch.Tensor]]] = field(default_factory=dict)


class EvictedModel:
    """A causal LM whose key/value cache is evicted by ``policy`` after a dense prefill (module docstring).

    Arguments:
        model: a transformers causal LM in eval mode (``model(ids, position_ids=...).logits``).
        prefix: tokens prefilled with dense attention before the first choice, ``>= 1``.
        policy: a name of :data:`topo_attn.eviction.POLICIES`, an
            :class:`~topo_attn.eviction.EvictionPolicy`, or None (no eviction: the reference).
        keep: the budget in blocks per (batch, key/value head); required with a policy, ignored without.
        block_size: tokens per block, ``>= 1``; sinks, window: blocks always kept (``topo_attn.eviction``'s rule,
            checked against ``prefix`` here); observation: SnapKV's observation window (queries, ``>= 1``);
            seed: the random policy's seed.
        trace: record the tokens each continuation chunk sees (:attr:`visible`), for tests.

    Attributes:
        peak_tokens: the most tokens a layer's cache held during a continuation, over every call so far (the
            prefill holds ``prefix`` tokens before the first choice).
        visible: after a call with ``trace``, per layer index, per continuation chunk ``(start, end, kept)``:
            ``kept`` bool ``[B, H_kv, start]``, the positions before ``start`` in that layer's cache.

    Raises:
        TypeError: a non-int size or a policy of another type.
        ValueError: an unknown policy, a size out of range, or a budget that does not fit the prefix.
    """

    def __init__(self, model, prefix: int, policy: str | EvictionPolicy | None, keep: int | None = None,
                 block_size: int = 64, sinks: int = 1, window: int = 1, observation: int = 32, seed: int = 0,
                 trace: bool = False):
        self.policy = None if policy is None else eviction.get(policy)
        self.prefix, self.block_size = check_int("prefix", prefix, 1), check_int("block_size", block_size, 1)
        self.observation, self.seed = check_int("observation", observation, 1), check_int("seed", seed)
        if self.policy is not None:
            if keep is None:
                raise ValueError(f"keep is required with the policy {self.policy.name!r}, got None")
            check_budget_fits(prefix, keep, block_size, sinks, window)
        self.model, self.keep, self.sinks, self.window = model, keep, sinks, window
        self.trace = bool(trace)
        self.peak_tokens = 0
        self.visible: dict[int, list[tuple[int, int, torch.Tensor]]] = {}

    @property
    def config(self):
        """The wrapped model's config."""
        return self.model.config

    def parameters(self):
        """The wrapped model's parameters."""
        return self.model.parameters()

    def __call__(self, input_ids: torch.Tensor) -> EvictedOutput:
        """The logits of ``input_ids`` (integer ``[B, L]``, ``L > prefix``, on the model's device): the prefix's
        from the dense prefill, the continuation's with the evicted cache. Raises ``ValueError`` for another
        shape."""
        if input_ids.ndim != 2 or input_ids.shape[1] <= self.prefix:
            raise ValueError(f"input_ids must have shape [B, L] with L > prefix ({self.prefix}), got shape "
                             f"{tuple(input_ids.shape)}")
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        state = CallState(self.trace, self._queries_read())
        AttentionInterface.register(NAME, partial(cache_attention, state))
        AttentionMaskInterface.register(NAME, partial(plain_causal_mask, NAME))
        before = self.model.config._attn_implementation
        self.model.set_attn_implementation(NAME)
        try:
            with torch.no_grad():
                logits = self._forward(input_ids, state)
        finally:
            self.model.set_attn_implementation(before)
        self.peak_tokens = max(self.peak_tokens, state.held)
        self.visible = state.visible
        return EvictedOutput(logits)

    def _queries_read(self) -> int | None:
        """How many of the latest queries a choice reads: None (all: ``h2o``), ``observation`` (``snapkv``), 0."""
        if self.policy is None or not self.policy.query_aware:
            return 0
        return None if self.policy.all_queries else self.observation

    def _forward(self, ids: torch.Tensor, state: CallState) -> torch.Tensor:
        """The prefill, the first choice, then the continuation chunk by chunk, choosing again between chunks."""
        length, bs = ids.shape[1], self.block_size
        outs = [self._chunk(ids, 0, self.prefix)]
        self._choose(state, first=True)
        state.continuing = True
        ends = list(range((self.prefix // bs + 1) * bs, length, bs)) + [length]  # the block boundaries, the end
        start = self.prefix
        for end in ends:
            if state.trace:
                for layer, cache in state.layers.items():
                    kept = (torch.ones(*cache.keys.shape[:2], start, dtype=torch.bool, device=ids.device)
                            if cache.choice is None else eviction.token_mask(cache.choice))
                    state.visible.setdefault(layer, []).append((start, end, kept))
            outs.append(self._chunk(ids, start, end))
            if end < length:
                self._choose(state, first=False)
            start = end
        return torch.cat(outs, dim=1)

    def _chunk(self, ids: torch.Tensor, start: int, end: int) -> torch.Tensor:
        positions = torch.arange(start, end, device=ids.device)[None]
        return self.model(ids[:, start:end], position_ids=positions, use_cache=False).logits

    def _choose(self, state: CallState, first: bool) -> None:
        """Every layer's choice (the first, or again) and its cache compacted; nothing without a policy."""
        if self.policy is None:
            return
        for cache in state.layers.values():
            if first:
                cache.choice = eviction.evict(self.policy, cache.keys, self.block_size, self.keep, sinks=self.sinks,
                                              window=self.window, queries=cache.queries, scale=cache.scale,
                                              observation=self.observation, seed=self.seed)
            else:
                cache.choice = eviction.update(cache.choice, cache.keys, cache.queries)
            cache.keys = eviction.compact(cache.keys, cache.choice)
            cache.values = eviction.compact(cache.values, cache.choice)
            cache.queries = None


def cache_attention(state: CallState, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                    value: torch.Tensor, attention_mask: torch.Tensor | None, scaling: float | None = None,
                    dropout: float = 0.0, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention function during an :class:`EvictedModel` call (bound to its ``state``): query
    ``[B, Hq, c, D]``, key/value ``[B, Hkv, c, D]`` of the chunk; attends over the layer's cache and the chunk
    (:func:`kept_attention`), appends the chunk's keys and values to the cache and keeps its queries for the next
    choice of a query-aware policy. Returns ``(out [B, c, Hq, D] contiguous, None)``. Raises ``ValueError`` for
    what it cannot do (a mask handed in, dropout, sliding windows, ...)."""
    check_attention_call(NAME, module, attention_mask, dropout, kwargs)
    layer = module.layer_idx
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    cache = state.layers.get(layer)
    if cache is None:  # the prefill: an empty cache
        empty = key[..., :0, :]
        cache = state.layers[layer] = LayerCache(empty, value[..., :0, :], None, scale)
    out = kept_attention(query, cache.keys, cache.values, key, value, scale)
    cache.keys = torch.cat([cache.keys, key], dim=-2)
    cache.values = torch.cat([cache.values, value], dim=-2)
    if state.queries is None:
        cache.queries = query
    elif state.queries:
        cache.queries = query[..., -state.queries:, :]
    if state.continuing:
        state.held = max(state.held, int(cache.keys.shape[-2]))
    return out.transpose(1, 2).contiguous(), None
