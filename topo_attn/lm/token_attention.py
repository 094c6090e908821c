"""Token-granularity block selection as a transformers attention function, for evaluation (not a kernel).

The kit's backend (:mod:`topo_attn.integrations.transformers`) chooses key blocks per query *block*: the
``block_size`` queries of a block share one choice, scored from all of them (the mean query, Quest's bound over
the block's queries, the block's true mass). For perplexity that is a look-ahead: the blocks position ``t``
sees depend on the queries at ``t + 1 ..`` of its block, which depend on the bytes being predicted. Here each
query *token* chooses from its own query, what a decode step with a KV cache does (Quest's setting).

For token ``t`` of a lane, in block ``b_t = t // block_size``:

- always visible: key blocks ``kb < sinks`` and ``b_t - window <= kb <= b_t`` (keys ``<= t`` only);
- plus the ``budget`` best-scored **candidates**, the complete causal blocks ``kb < b_t`` outside the sinks and
  the window (all of them when fewer; ties to the lower block index, as
  :func:`~topo_attn.selection.schedule_from_scores`), scored from ``q_t`` alone (:data:`TOKEN_SELECTORS`):

  - ``centroid``: ``q_t . mean(keys of kb)``;
  - ``quest``: ``sum_i max(q_ti M_i, q_ti m_i)`` with ``m``, ``M`` the element-wise min and max of kb's keys;
  - ``oracle``: the true causal softmax mass of token ``t`` on kb (the model's scale);
  - ``random``: uniform, from a generator on the query's device seeded with ``seed`` once per call;
  - ``topology``: the elder-rule salience of kb among the key blocks ``0 .. b_t - 1``
    (:func:`topo_attn.selection.topology.prefix_saliences`).

Key statistics are those of complete past blocks, so no position's output depends on a later token. Grouped-
query attention: q ``[B, Hq, L, D]``, k/v ``[B, Hkv, L, D]``; each query head scores with its kv head's keys.

Compute, per chunk of ``chunk`` query rows: float64 scores ``[B, Hq, chunk, n]`` (products with the block
statistics; the oracle from float64 logits ``[B, Hq, chunk, L]``), the boolean block choice, the token mask
``[B, Hq, chunk, L]`` and torch's ``scaled_dot_product_attention`` with it (kv heads repeated). Memory grows
with ``B Hq chunk L``, not ``L^2``.

As a transformers backend (``q_len == kv_len`` only: a forward over whole documents):

.. code-block:: python

    from topo_attn.lm import token_attention as tok
    name = tok.register_token_selection("centroid", block_size=64, sinks=1, window=1, budget=8)
    model.set_attn_implementation(name)
    logits = model(input_ids).logits
    tok.last_stats(name)  # {layer_idx: TokenLayerStats(visited_fraction=..., ...)} of the last forward

Like the block backend, the registration puts a mask function into transformers' ``AttentionMaskInterface``
that hands the model no mask (nothing ``[L, L]`` is materialised) and raises for anything beyond plain causal
attention without padding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import torch

from .._checks import check_int, check_qkv, check_scale
from ..integrations.transformers import check_attention_call, check_backend_name, plain_causal_mask
from ..rule import base_block_mask
from ..schedule import num_blocks
from ..selection.registry import get, names
from ..selection.selector import Scorer
from ..selection.topk import choose_blocks

__all__ = ["DEFAULT_CHUNK", "TOKEN_SELECTORS", "TokenLayerStats", "TokenSettings", "block_candidates",
           "last_stats", "register_token_selection", "token_block_choice", "token_mask", "token_scorer",
           "token_selection_attention"]

TOKEN_SELECTORS = names("token")
"""The selectors with a token-granularity choice, those with token scores (see the module docstring)."""

DEFAULT_CHUNK = 512
"""Query rows per step (scores, mask and SDPA call)."""


# ------------------------------------------------------------------------------------------------ scores
def token_scorer(selector: str, q: torch.Tensor, k: torch.Tensor, block_size: int, scale: float | None = None,
                 seed: int = 0) -> Scorer:
    """The per-token score function of ``selector`` (:data:`TOKEN_SELECTORS`; its module's ``token_scores``) for
    one call: ``rows -> float64 [B, Hq, len(rows), n]``, ``[..., i, kb]`` the score of key block ``kb`` for the
    query at ``rows.start + i`` (higher is better). The key statistics are computed here, once.

    Arguments:
        q: floating ``[B, Hq, L, D]``; k: ``[B, Hkv, L, D]``, ``Hq % Hkv == 0``; block_size: int ``>= 1``.
        scale: the oracle's softmax scale (``1 / sqrt(D)`` when None); seed: the random selector's seed.

    Raises:
        ValueError: an unknown selector.
    """
    scores = get(selector, "token").token_scores
    return scores(q, k, block_size, check_scale(scale, q.shape[-1]), seed)


# --------------------------------------------------------------------------------------------- selection
def block_candidates(rows: slice, n: int, block_size: int, sinks: int, window: int,
                     device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """For the tokens at positions ``rows``: the always-visible key blocks (sinks and window, causal) and the
    candidates (complete causal blocks ``kb < b_t`` outside them), bool ``[len(rows), n]`` each."""
    block = torch.arange(rows.start, rows.stop, device=device) // block_size
    always = base_block_mask(n, sinks, window, device)[block]  # the rule's sinks and window of each token's row
    kb = torch.arange(n, device=device)
    return always, (kb[None, :] < block[:, None]) & ~always


def token_mask(visible: torch.Tensor, rows: slice, seq_len: int, block_size: int) -> torch.Tensor:
    """The key mask of the tokens at ``rows``: key ``j`` when its block is visible and ``j <= t``.

    Arguments:
        visible: bool ``[..., c, n]``; rows: positions, ``c`` of them; seq_len: ``L``; block_size: int.

    Returns:
        bool ``[..., c, L]``.
    """
    keys = torch.arange(seq_len, device=visible.device)
    causal = keys <= torch.arange(rows.start, rows.stop, device=visible.device)[:, None]
    return visible.index_select(-1, keys // block_size) & causal


# ------------------------------------------------------------------------------------------ attention
@dataclass(frozen=True)
class TokenSettings:
    """One token-granularity selection: the selector of :data:`TOKEN_SELECTORS` and its sizes (see
    :func:`register_token_selection`)."""

    selector: str
    block_size: int
    sinks: int
    window: int
    budget: int
    seed: int = 0
    chunk: int = DEFAULT_CHUNK

    def __post_init__(self):
        if not isinstance(self.selector, str):
            raise TypeError(f"selector must be a str, got {type(self.selector).__name__}")
        if self.selector not in TOKEN_SELECTORS:
            raise ValueError(f"selector must be one of {list(TOKEN_SELECTORS)}, got {self.selector!r}")
        check_int("block_size", self.block_size, 1)
        check_int("chunk", self.chunk, 1)
        for name in ("sinks", "window", "budget", "seed"):
            check_int(name, getattr(self, name))


def _visible_blocks(scorer: Scorer, rows: slice, n: int, settings: TokenSettings,
                    device: torch.device) -> torch.Tensor:
    """The key blocks the tokens at ``rows`` see: bool ``[B, Hq, len(rows), n]``."""
    always, candidates = block_candidates(rows, n, settings.block_size, settings.sinks, settings.window, device)
    return always | choose_blocks(scorer(rows), candidates, settings.budget)


def _chunks(seq_len: int, chunk: int) -> list[slice]:
    return [slice(s, min(s + chunk, seq_len)) for s in range(0, seq_len, chunk)]


def _check_inputs(q, k, v) -> None:
    shape = check_qkv(q, k, v)
    if shape.rank != 4:
        raise ValueError(f"q, k, v must have shape [B, H, L, D], got q of shape {tuple(q.shape)}")


def token_block_choice(q: torch.Tensor, k: torch.Tensor, settings: TokenSettings,
                       scale: float | None = None) -> torch.Tensor:
    """The key blocks every token sees (always visible and chosen): bool ``[B, Hq, L, n]``.

    Arguments:
        q: floating ``[B, Hq, L, D]``; k: ``[B, Hkv, L, D]``; settings: the selection; scale: the oracle's
            softmax scale (``1 / sqrt(D)`` when None).

    Raises:
        ValueError, TypeError: bad shapes or dtypes.
    """
    _check_inputs(q, k, k)
    n = num_blocks(q.shape[-2], settings.block_size)
    with torch.no_grad():
        scorer = token_scorer(settings.selector, q, k, settings.block_size, scale, settings.seed)
        return torch.cat([_visible_blocks(scorer, rows, n, settings, q.device)
                          for rows in _chunks(q.shape[-2], settings.chunk)], dim=-2)


def token_selection_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, settings: TokenSettings,
                              scale: float | None = None) -> tuple[torch.Tensor, int, int]:
    """Causal attention in which every token sees its own choice of key blocks (the module docstring).

    Arguments:
        q: floating ``[B, Hq, L, D]``; k, v: ``[B, Hkv, L, D]``, ``Hq % Hkv == 0``, q's dtype and device.
        settings: the selection; scale: the softmax scale (``1 / sqrt(D)`` when None).

    Returns:
        ``(out, visited, causal)``: ``out [B, Hq, L, D]`` in q's dtype; ``visited``, the visible key blocks
        summed over tokens and lanes; ``causal``, the causal key blocks ``b_t + 1`` summed likewise.

    Raises:
        ValueError, TypeError: bad shapes, dtypes or scale.
    """
    _check_inputs(q, k, v)
    batch, heads, seq, dim = q.shape
    scale = check_scale(scale, dim)
    n = num_blocks(seq, settings.block_size)
    group = heads // k.shape[1]
    keys, values = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    with torch.no_grad():
        scorer = token_scorer(settings.selector, q, k, settings.block_size, scale, settings.seed)
    outs, visited = [], torch.zeros((), dtype=torch.int64, device=q.device)
    for rows in _chunks(seq, settings.chunk):
        with torch.no_grad():
            visible = _visible_blocks(scorer, rows, n, settings, q.device)
            mask = token_mask(visible, rows, seq, settings.block_size)
        visited += visible.sum()
        outs.append(torch.nn.functional.scaled_dot_product_attention(q[..., rows, :], keys, values,
                                                                     attn_mask=mask, scale=scale))
    block = torch.arange(seq) // settings.block_size
    causal = batch * heads * int((block + 1).sum())
    return torch.cat(outs, dim=-2), int(visited), causal


# ------------------------------------------------------------------------------- transformers backend
@dataclass(frozen=True)
class TokenLayerStats:
    """One layer's last call, counted over its tokens and lanes (``lanes`` = batch x query heads):
    ``visited_blocks`` (visible key blocks) and ``causal_blocks`` (``b_t + 1`` per token);
    ``visited_fraction = visited_blocks / causal_blocks``, which equals the block backend's fraction at the
    same sizes (each token sees as many blocks as its query block's row there)."""

    visited_fraction: float
    visited_blocks: int
    causal_blocks: int
    lanes: int
    seq_len: int


@dataclass
class _Backend:
    settings: TokenSettings
    stats: dict = field(default_factory=dict)


_REGISTRY: dict[str, _Backend] = {}
"""Registered token-selection backends by name."""


def register_token_selection(selector: str, block_size: int = 64, sinks: int = 1, window: int = 1,
                             budget: int = 8, name: str = "topo_attn_token", seed: int = 0,
                             chunk: int = DEFAULT_CHUNK) -> str:
    """Register (or re-register, clearing its statistics) token-granularity selection under ``name`` with
    transformers (``AttentionInterface`` and ``AttentionMaskInterface``) and return ``name``, to be passed as
    ``attn_implementation``.

    Arguments:
        selector: one of :data:`TOKEN_SELECTORS`.
        block_size: tokens per block, ``>= 1``; sinks, window, budget: ints ``>= 0`` (see the module docstring).
        name: the ``attn_implementation`` name (the rules of :func:`topo_attn.integrations.transformers.register`).
        seed: the random selector's seed (the same for every layer and call); chunk: query rows per step.

    Raises:
        ValueError: an unknown selector, a number out of range or a reserved name (each naming the argument).
        TypeError: a non-int number, a non-str selector or name.
    """
    settings = TokenSettings(selector, block_size, sinks, window, budget, seed, chunk)
    name = check_backend_name(name)
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    _REGISTRY[name] = _Backend(settings)
    AttentionInterface.register(name, partial(_attention, name))
    AttentionMaskInterface.register(name, partial(plain_causal_mask, name))
    return name


def last_stats(name: str = "topo_attn_token") -> dict[int | None, TokenLayerStats]:
    """Per layer index, the :class:`TokenLayerStats` of that layer's last call under ``name`` (a copy; empty
    before the first forward). Raises ``KeyError`` for a name never registered."""
    if name not in _REGISTRY:
        raise KeyError(f"no token-selection backend is registered under {name!r}; call "
                       f"register_token_selection(..., name={name!r}) first")
    return dict(_REGISTRY[name].stats)


def _attention(name: str, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
               **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention function for ``name``: query ``[B, Hq, L, D]``, key/value ``[B, Hkv, L, D]``;
    returns ``(out [B, L, Hq, D] contiguous, None)``. Raises ``ValueError`` when ``q_len != kv_len`` (a decode
    step or chunked prefill) and for what the block backend rejects (a mask, dropout, sliding windows, ...)."""
    backend = _REGISTRY[name]
    check_attention_call(name, module, attention_mask, dropout, kwargs)
    if query.shape[-2] != key.shape[-2]:
        raise ValueError(f"attn_implementation {name!r} computes forwards over whole sequences only "
                         f"(q_len == kv_len), got q_len={query.shape[-2]} and kv_len={key.shape[-2]}")
    out, visited, causal = token_selection_attention(query, key, value, backend.settings, scaling)
    lanes = query.shape[0] * query.shape[1]
    backend.stats[getattr(module, "layer_idx", None)] = TokenLayerStats(visited / causal, visited, causal, lanes,
                                                                        query.shape[-2])
    return out.transpose(1, 2).contiguous(), None
