"""An attention backend for Hugging Face transformers (>= 5): switch a model's attention to the kit's
block-sparse kernels by name.

.. code-block:: python

    from topo_attn.integrations import transformers as tat
    name = tat.register(selector="centroid", block_size=64, sinks=1, window=1, budget=8, dense_layers=(0, 1))
    model = LlamaForCausalLM.from_pretrained(path, attn_implementation=name)  # or model.set_attn_implementation(name)
    logits = model(input_ids).logits
    tat.last_stats(name)  # {layer_idx: LayerStats(visited_fraction=..., ...)} of the last forward

:func:`register` puts two functions into transformers' registries under ``name``: the attention function
(``transformers.AttentionInterface``) and a mask function (``transformers.masking_utils.AttentionMaskInterface``)
that hands the model no mask at all (nothing ``[q_len, kv_len]`` is materialised, also at long context) and
raises for every mask that is more than plain causal attention over the whole cache.

What the attention function does, per layer and call (query ``[B, Hq, q_len, D]``, key/value
``[B, Hkv, kv_len, D]``, not repeated for grouped-query attention):

- ``q_len == kv_len`` (a forward over a whole sequence: training, prefill): the schedule is built from the
  layer's own queries and keys (detached; one row-set per (batch, key/value head), the group's query heads
  choosing together, or per (batch, query head) with ``options={"per_query_head": True}``; for ``selector="dense"``
  and for the layers in ``dense_layers`` every causal block, in blocks of at least :data:`DENSE_BLOCK_SIZE`
  tokens, the faster tiles), then :func:`topo_attn.scheduled_attention` runs the Triton kernels forward and, with
  gradients, backward.
- ``q_len < kv_len`` (generation with a KV cache, chunked prefill): the queries sit at absolute positions
  ``kv_len - q_len + i`` (bottom-right causal alignment). The step's schedule covers the query blocks the new
  queries touch: every causal block for a dense layer, else
  :func:`topo_attn.selection.incremental.select_for_queries` (one row-set per key/value head, scored from the
  step's queries against per-block statistics of the cache), and :func:`topo_attn.scheduled_attention` runs it
  (its split-K decode kernel for ``q_len <= 16``). The block statistics are read from a
  :class:`topo_attn.integrations.cache.TopoCache` (``model.generate(..., cache=TopoCache())``), which
  computes them once per completed block; with another cache they are computed from every cached key at each
  step (the same schedule, slower). A step's choice reads only its own queries (the ``strict`` option concerns
  whole-sequence forwards). The selectors without an incremental form (``oracle``, ``cluster``,
  ``cluster_centroid``) compute such steps densely over the whole cache (torch's SDPA with a bottom-right
  causal mask: the exact causal result, not the sparse one), and a :class:`DenseDecodeWarning` says so, once
  per registration.

Raises ``ValueError`` (rather than answering wrongly) for: a padding mask with any zero (left or right padding,
batched generation of prompts of different lengths), packed sequences (``position_ids`` that restart), a 4-D
mask handed in by the caller, sliding-window or chunked attention (a config with ``sliding_window``, a
``sliding_window`` keyword), non-causal attention, sliding-window caches, transformers' plain ``StaticCache``
(its buffers hold slots not yet written, and the backend needs their length), attention dropout in training,
logit soft-capping and attention sinks (``s_aux``).

Static caches: with a :class:`topo_attn.integrations.static_cache.TopoStaticCache` the mask function hands
the attention function :func:`static_cache_marker`, and a one-token step runs over the preallocated buffers
with the layer's length read on the device (:func:`~topo_attn.attention.static_decode.static_decode`, the
block list from :func:`~topo_attn.selection.static_step.step_block_table`), so transformers' "static cache +
compiled forward" recipe captures the whole step; the prefill reads the length on the host once per layer.

Compiled prefill: while ``torch.compile`` traces a whole-sequence call without gradients (a dense layer, or a
selector whose schedule needs no host sync), the call is one custom op, ``torch.ops.topo_attn.backend_prefill``
(:func:`backend_prefill`), so the model's forward compiles without a graph break and ``mode="reduce-overhead"``
replays it from CUDA graphs; such calls record no statistics.

Statistics: :func:`last_stats` gives, per layer, the visited fraction of the causal blocks in the layer's last
eager call (recorded on every call at no extra cost: the schedule's sizes are known on the host).

transformers is imported inside this module only; ``import topo_attn`` does not import it.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial

import torch

from .._checks import check_int, check_kernel_block_size
from ..attention import scheduled_attention
from ..attention.scheduled import autocast_inputs
from ..schedule import BlockSchedule, dense_causal_schedule
from ..selection import SELECTORS, select
from ..selection.incremental import INCREMENTAL_SELECTORS, KeyBlockStats, select_for_queries

__all__ = ["BLOCK_STATS_ATTRIBUTE", "DENSE_BLOCK_SIZE", "SELECTOR_NAMES", "STATIC_STATE_ATTRIBUTE",
           "DenseDecodeWarning", "LayerStats", "LayerTiming", "Settings", "backend_prefill", "check_attention_call",
           "check_backend_name", "compiled_prefill", "dense_block_size", "is_static_cache_marker", "last_stats",
           "plain_causal_mask", "record_timings", "register", "registered", "schedule_for", "static_cache_marker",
           "step_schedule", "timings", "visited_totals"]

SELECTOR_NAMES: tuple[str, ...] = ("dense", *SELECTORS)
"""The selectors :func:`register` accepts: ``"dense"`` (every causal block) and every selector of
:data:`topo_attn.selection.SELECTORS`."""

RESERVED_PARTS = ("flash", "sdpa", "flex_attention", "/", "|")
"""Substrings a backend name may not contain: transformers gives names containing them special treatment
(flash-attention and SDPA checks, FlexAttention masks, kernels from the Hub for ``org/name``, ``paged|``)."""


class DenseDecodeWarning(UserWarning):
    """A step with fewer queries than keys (decode, chunked prefill) was computed densely over the cache,
    without the registered sparse schedule (a selector with no incremental form)."""


BLOCK_STATS_ATTRIBUTE = "topo_block_stats"
"""The attribute of a key tensor handed to the attention function under which a cache
(:class:`topo_attn.integrations.cache.TopoCache`) puts a function ``block_size -> KeyBlockStats`` for that layer."""

STATIC_STATE_ATTRIBUTE = "topo_static_state"
"""The attribute of a layer's key buffer under which a
:class:`topo_attn.integrations.static_cache.TopoStaticCache` puts that layer's
:class:`~topo_attn.integrations.static_cache.StaticLayerState` (its device-side length and block statistics)."""


def static_cache_marker(device) -> torch.Tensor:
    """What the mask function hands the attention function for a static (preallocated) cache: an empty
    ``[0, 0, 0, 0]`` bool tensor (transformers passes 4-D masks through unchanged; no mask a model builds has
    this shape), telling it that the keys are a buffer of ``max_cache_len`` slots of which only the layer's
    length is valid."""
    return torch.empty((0, 0, 0, 0), dtype=torch.bool, device=device)


def is_static_cache_marker(mask) -> bool:
    """Whether ``mask`` is :func:`static_cache_marker`'s tensor (shapes only: no device read)."""
    return isinstance(mask, torch.Tensor) and mask.shape == (0, 0, 0, 0)


@dataclass(frozen=True)
class Settings:
    """The settings of one registered backend (see :func:`register`)."""

    name: str
    selector: str
    block_size: int
    sinks: int
    window: int
    budget: int
    dense_layers: frozenset[int]
    options: Mapping[str, object] = field(default_factory=dict)
    decode_merge: str = "separate"

    def is_dense(self, layer_idx: int | None) -> bool:
        """Whether layer ``layer_idx`` runs every causal block (``selector="dense"`` or a dense layer)."""
        return self.selector == "dense" or layer_idx in self.dense_layers


@dataclass(frozen=True)
class LayerStats:
    """One layer's last call. ``scheduled_blocks`` and ``causal_blocks`` count (query block, key block) pairs
    over all lanes (``lanes`` = batch x query heads) of the query blocks the call computed;
    ``visited_fraction = scheduled_blocks / causal_blocks`` (1.0 for a dense layer and for a dense decode
    step). ``path``: ``"kernel"`` (the Triton kernels), ``"decode kernel"`` (``q_len <= 16 < kv_len``: the
    split-K decode kernel) or ``"dense decode"`` (``q_len < kv_len`` with a selector without an incremental
    form). ``blocks_read``: key blocks whose statistics were computed in this call (0 when a cache kept them)."""

    visited_fraction: float
    scheduled_blocks: int
    causal_blocks: int
    lanes: int
    q_len: int
    kv_len: int
    path: str
    blocks_read: int = 0


@dataclass(frozen=True)
class LayerTiming:
    """One whole-sequence call of a layer, timed (:func:`record_timings`): ``host_ms``, the host's time in the
    attention function from its entry until the kernels are launched, with the GPU idle when it starts (a timed
    call waits for the GPU first, so the time is the Python and launch path alone, not a wait on a full launch
    queue); ``select_ms`` and
    ``kernel_ms``, the GPU's time for the schedule (selection, or the dense schedule's lookup) and for the
    attention kernels, from CUDA events around each."""

    layer: int | None
    host_ms: float
    select_ms: float
    kernel_ms: float


@dataclass
class _Backend:
    """A registration: its settings and what it records (the last stats per layer, whether the dense-decode
    warning was given, a few dense schedules kept for reuse, the timings while they are recorded). A padded
    schedule's block count is kept as a device tensor (``stats`` as the field tuples of :class:`LayerStats`,
    ``totals`` as sums), read back only when :func:`last_stats` or :func:`visited_totals` is called."""

    settings: Settings
    stats: dict = field(default_factory=dict)
    totals: dict = field(default_factory=dict)
    warned: bool = False
    dense_schedules: dict = field(default_factory=dict)
    timings: list | None = None


_REGISTRY: dict[str, _Backend] = {}
"""Registered backends by name (what :func:`register` manages)."""

_DENSE_CACHE_SIZE = 8  # dense schedules kept per backend, by (seq_len, device)

DENSE_BLOCK_SIZE = 128
"""The smallest block of the dense schedule that a whole-sequence call of a dense layer runs (``selector="dense"``
and ``dense_layers``): every causal block is the same exact attention at any block size, and the forward
kernels are faster on 128-token tiles (the ``llm`` suite: 0.83-1.04 of SDPA's TFLOP/s with 128-token blocks
against 0.73-0.84 with 64 on an H100). Its statistics still count blocks of the backend's ``block_size``."""


# ------------------------------------------------------------------------------------------- registration
def check_backend_name(name: object) -> str:
    """``name`` when it can be an ``attn_implementation`` name (also for other backends, such as
    :mod:`topo_attn.lm.token_attention`). Raises ``TypeError`` for a non-str and ``ValueError`` for a name that
    is empty, ``"eager"`` or contains one of :data:`RESERVED_PARTS`."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    lowered = name.lower()
    if not name or name.strip() != name or lowered == "eager" or any(p in lowered for p in RESERVED_PARTS):
        raise ValueError(
            f"name {name!r} cannot be used: transformers treats names that are empty, 'eager' or contain "
            f"{', '.join(repr(p) for p in RESERVED_PARTS)} specially; pick another, e.g. 'topo_attn'")
    return name


def _check_dense_layers(dense_layers: object) -> frozenset[int]:
    if isinstance(dense_layers, (str, bytes)) or not isinstance(dense_layers, Iterable):
        raise TypeError(f"dense_layers must be an iterable of layer indices, got {type(dense_layers).__name__}")
    return frozenset(check_int("dense_layers", layer, 0) for layer in dense_layers)


def register(selector: str = "centroid", block_size: int = 64, sinks: int = 1, window: int = 1, budget: int = 8,
             dense_layers: Iterable[int] = (), name: str = "topo_attn",
             options: Mapping[str, object] | None = None, decode_merge: str = "separate") -> str:
    """Register (or re-register) the kit's attention under ``name`` with transformers, and return ``name``,
    to be passed as ``attn_implementation`` (``Config(..., attn_implementation=name)``,
    ``from_pretrained(..., attn_implementation=name)`` or ``model.set_attn_implementation(name)``).

    Arguments:
        selector: one of :data:`SELECTOR_NAMES`: ``"dense"`` or a selector of :mod:`topo_attn.selection`
            (``window``, ``random``, ``topology_22``, ``topology``, ``centroid``, ``quest``, ``cluster``,
            ``cluster_centroid``, ``oracle``), each adding ``budget`` key blocks per query block beyond the
            sinks and the window (``topology_22``: #22's rule with ``topk=budget``).
        block_size: tokens per block, a power of two >= 16 (the kernel's tile).
        sinks, window, budget: ints >= 0, as in :func:`topo_attn.selection.select`.
        dense_layers: layer indices (``module.layer_idx``) that run every causal block through the same kernel.
        name: the ``attn_implementation`` name; not empty, not ``"eager"``, and containing none of
            :data:`RESERVED_PARTS`.
        options: extra keyword options of the selector (``seed`` for ``random``, ``clusters`` for the
            cluster selectors, ``chunk`` for ``oracle``, ``strict`` for a selection without look-ahead, see
            :func:`topo_attn.selection.select`); the oracle's ``scale`` is the model's.
        decode_merge: how a static cache's decoding step merges its split partials
            (:func:`topo_attn.attention.static_decode.static_decode`'s ``merge``): ``"separate"``, a second
            launch, or ``"kernel"``, one launch whose last split program merges.

    Registering a name again replaces its settings (models already using the name follow them from their
    next forward) and clears its statistics and its dense-decode warning flag.

    Raises:
        ValueError: an unknown selector, a block size that is not a power of two >= 16, a negative number
            (``sinks``, ``window``, ``budget``, a layer index), a reserved name, an unknown ``decode_merge``
            (each naming the argument).
        TypeError: a non-int number, a non-str name, selector or decode_merge, options that are not a mapping.
        ImportError: transformers is not installed (``pip install topo_attn[lm]``).
    """
    if not isinstance(selector, str):
        raise TypeError(f"selector must be a str, got {type(selector).__name__}")
    if selector not in SELECTOR_NAMES:
        raise ValueError(f"selector must be one of {list(SELECTOR_NAMES)}, got {selector!r}")
    block_size = check_int("block_size", block_size, 1)
    check_kernel_block_size(block_size)
    sinks, window, budget = check_int("sinks", sinks), check_int("window", window), check_int("budget", budget)
    layers = _check_dense_layers(dense_layers)
    name = check_backend_name(name)
    if options is not None and not isinstance(options, Mapping):
        raise TypeError(f"options must be a mapping of selector options or None, got {type(options).__name__}")
    if options and "scale" in options:
        raise ValueError("options must not hold 'scale': the oracle uses the model's softmax scale")
    from ..attention.static_decode import MERGE_MODES  # (triton is imported on first use, not by a CLI's parser)

    if not isinstance(decode_merge, str):
        raise TypeError(f"decode_merge must be a str, one of {list(MERGE_MODES)}, got {type(decode_merge).__name__}")
    if decode_merge not in MERGE_MODES:
        raise ValueError(f"decode_merge must be one of {list(MERGE_MODES)}, got {decode_merge!r}")
    settings = Settings(name, selector, block_size, sinks, window, budget, layers, dict(options or {}), decode_merge)

    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    _REGISTRY[name] = _Backend(settings)
    AttentionInterface.register(name, partial(_attention, name))
    AttentionMaskInterface.register(name, partial(plain_causal_mask, name))
    return name


def registered(name: str = "topo_attn") -> Settings:
    """The settings registered under ``name``. Raises ``KeyError`` for a name never registered."""
    if name not in _REGISTRY:
        raise KeyError(f"no topo_attn backend is registered under {name!r}; call register(name={name!r}) first")
    return _REGISTRY[name].settings


def visited_totals(name: str = "topo_attn") -> dict[str, tuple[int, int, int]]:
    """Per path (``"kernel"``, ``"decode kernel"``, ``"dense decode"``), ``(scheduled_blocks, causal_blocks,
    calls)`` summed over every layer call under ``name`` since it was (re-)registered: the visited fraction of
    a whole generation. Raises ``KeyError`` for a name never registered."""
    registered(name)
    totals = _REGISTRY[name].totals
    return {path: (int(scheduled), causal, calls) for path, (scheduled, causal, calls) in totals.items()}


def last_stats(name: str = "topo_attn") -> dict[int | None, LayerStats]:
    """Per layer index (``module.layer_idx``), the :class:`LayerStats` of that layer's last call under
    ``name`` (a copy; empty before the first forward). Raises ``KeyError`` for a name never registered."""
    registered(name)
    return {layer: LayerStats(int(scheduled) / causal, int(scheduled), causal, *rest)
            for layer, (scheduled, causal, *rest) in _REGISTRY[name].stats.items()}


def record_timings(name: str = "topo_attn", enabled: bool = True) -> None:
    """Start (or stop) timing the whole-sequence calls under ``name``: each call then waits for the GPU, and
    records CUDA events around its schedule and its kernels and its host time (a GPU only; :func:`timings` reads
    them). The wait makes a timed forward slower than an untimed one: time the forward itself without this.
    Starting again forgets what was recorded. Raises ``KeyError`` for a name never registered."""
    registered(name)
    _REGISTRY[name].timings = [] if enabled else None


def timings(name: str = "topo_attn") -> list[LayerTiming]:
    """The :class:`LayerTiming` of every whole-sequence call since :func:`record_timings` (waits for the GPU),
    and starts over. Raises ``KeyError`` for a name never registered and ``ValueError`` when not recording."""
    registered(name)
    backend = _REGISTRY[name]
    if backend.timings is None:
        raise ValueError(f"timings of {name!r} are not recorded; call record_timings({name!r}) first")
    torch.cuda.synchronize()
    found = [LayerTiming(layer, host * 1e3, start.elapsed_time(chosen), chosen.elapsed_time(done))
             for layer, host, start, chosen, done in backend.timings]
    backend.timings = []
    return found


# ------------------------------------------------------------------------------------------ the schedule
def schedule_for(settings: Settings, layer_idx: int | None, query: torch.Tensor, key: torch.Tensor,
                 scale: float | None = None) -> BlockSchedule:
    """The schedule a layer runs for ``query [B, Hq, S, D]`` and ``key [B, Hkv, S, D]``: every causal block
    (shared by all lanes, in blocks of :func:`dense_block_size`) when ``settings.is_dense(layer_idx)``, else
    ``selection.select(settings.selector, query, key, block_size, sinks, window, budget, **options)`` on the
    detached tensors (lanes ``(B, Hkv)``, or ``(B, Hq)`` with ``per_query_head`` in the options), on the query's
    device. ``scale``: the oracle's softmax scale (``1 / sqrt(D)`` when None)."""
    seq_len = query.shape[-2]
    if settings.is_dense(layer_idx):
        return dense_causal_schedule(seq_len, dense_block_size(settings), query.device)
    options = dict(settings.options)
    if settings.selector == "oracle":
        options["scale"] = scale
    with torch.no_grad():
        return select(settings.selector, query.detach(), key.detach(), settings.block_size, settings.sinks,
                      settings.window, settings.budget, **options)


def dense_block_size(settings: Settings) -> int:
    """The block size of a dense layer's schedule over a whole sequence: the backend's, at least
    :data:`DENSE_BLOCK_SIZE`."""
    return max(settings.block_size, DENSE_BLOCK_SIZE)


def _dense_schedule(backend: _Backend, seq_len: int, device: torch.device, q_len: int | None = None,
                    block_size: int | None = None, keep: bool = True) -> BlockSchedule:
    """The dense causal schedule for ``seq_len`` keys (and ``q_len`` queries at the end) on ``device``, in
    blocks of ``block_size`` (default the backend's), kept for reuse (a few per backend; ``keep=False``: a kept
    one or a new one that is not kept)."""
    block_size = block_size or backend.settings.block_size
    key = (seq_len, q_len, str(device), block_size)
    schedule = backend.dense_schedules.get(key)
    if schedule is None:
        schedule = dense_causal_schedule(seq_len, block_size, device, q_len)
        if keep:
            if len(backend.dense_schedules) >= _DENSE_CACHE_SIZE:
                backend.dense_schedules.pop(next(iter(backend.dense_schedules)))
            backend.dense_schedules[key] = schedule
    return schedule


def _whole_sequence_schedule(backend: _Backend, layer_idx: int | None, query: torch.Tensor, key: torch.Tensor,
                             scale: float | None, keep: bool = True) -> BlockSchedule:
    """The schedule of a whole-sequence call (``q_len == kv_len``): a dense layer's every causal block on the
    faster tiles (:func:`dense_block_size`, kept for reuse unless ``keep`` is False), else :func:`schedule_for`."""
    settings = backend.settings
    if settings.is_dense(layer_idx):
        return _dense_schedule(backend, query.shape[-2], query.device, block_size=dense_block_size(settings),
                               keep=keep)
    return schedule_for(settings, layer_idx, query, key, scale)


def step_schedule(settings: Settings, layer_idx: int | None, query: torch.Tensor, key: torch.Tensor,
                  stats: KeyBlockStats | None = None) -> BlockSchedule:
    """The schedule of a step with fewer queries than keys, ``query [B, Hq, L, D]`` at the end of
    ``key [B, Hkv, S, D]``: every causal block of the query blocks the step touches (shared) when
    ``settings.is_dense(layer_idx)``, else :func:`~topo_attn.selection.incremental.select_for_queries` with the
    settings (one row-set per key/value head), reading ``stats`` (computed from ``key`` when None). Raises
    ``ValueError`` for a selector without an incremental form (see the module docstring)."""
    if settings.is_dense(layer_idx):
        return dense_causal_schedule(key.shape[-2], settings.block_size, query.device, query.shape[-2])
    if settings.selector not in INCREMENTAL_SELECTORS:
        raise ValueError(f"selector {settings.selector!r} has no incremental form for steps with fewer queries "
                         f"than keys; expected one of {list(INCREMENTAL_SELECTORS)}")
    with torch.no_grad():
        return select_for_queries(settings.selector, query.detach(), key.detach(), settings.block_size,
                                  settings.sinks, settings.window, settings.budget, stats,
                                  int(settings.options.get("seed", 0)))


def _causal_block_pairs(first_row: int, last_row: int) -> int:
    """Causal (query block, key block) pairs of query blocks ``first_row..last_row``: row ``r`` has ``r + 1``."""
    return (last_row + 1) * (last_row + 2) // 2 - first_row * (first_row + 1) // 2


# ---------------------------------------------------------------------------------- the mask function
def plain_causal_mask(name: str, batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset: int = 0,
                      mask_function=None, attention_mask: torch.Tensor | None = None, **kwargs) -> None:
    """transformers' mask function for ``name`` (registered as ``partial(plain_causal_mask, name)``; also by
    other backends that apply the causal mask themselves): ``None`` (the kernels apply the causal mask and the
    schedule themselves), or :func:`static_cache_marker` for a static cache (``q_offset`` a device tensor),
    after checking that the mask asked for is plain causal attention over the whole cache. Raises
    ``ValueError`` for padding, packed sequences, sliding-window, chunked or bidirectional masks and dynamic
    caches whose length is not ``q_offset + q_length`` (sliding-window caches). A padded mask at a one-token
    step of a static cache fails a device-side assertion instead (no host wait on a compiled step)."""
    from transformers.masking_utils import causal_mask_function

    if mask_function is not causal_mask_function:
        described = getattr(mask_function, "__qualname__", None) or repr(mask_function)
        raise ValueError(
            f"attn_implementation {name!r} supports plain causal attention only, but the model asks for another "
            f"mask ({described}): sliding-window or chunked attention, packed sequences (position_ids that "
            f"restart), bidirectional attention or a custom mask function are not supported")
    padding = (f"attn_implementation {name!r} does not support padding: the attention_mask holds zeros (padded "
               f"tokens); pass sequences of equal length without padding, one at a time, or use another "
               f"attn_implementation for padded batches")
    static = isinstance(q_offset, torch.Tensor) or (kv_offset == 0 and kv_length > q_offset + q_length)
    if static:  # a preallocated cache: its length lives on the device (an int 0 before its first update)
        if kv_offset != 0 or kv_length < q_length:
            raise ValueError(f"attn_implementation {name!r} supports static caches of full attention only; this "
                             f"cache gives kv_length={kv_length}, kv_offset={kv_offset} for {q_length} new tokens")
        if attention_mask is not None:
            if q_length > 1:  # a prefill (eager): checked on the host
                if not bool(attention_mask.all()):
                    raise ValueError(padding)
            else:  # a decode step, perhaps compiled: checked on the device, no wait
                torch._assert_async(attention_mask.all(), padding)
        return static_cache_marker(kwargs.get("device", getattr(q_offset, "device", None)))
    if attention_mask is not None and not bool(attention_mask.all()):
        raise ValueError(padding)
    q_offset = int(q_offset)
    if kv_offset != 0 or kv_length != q_offset + q_length:
        raise ValueError(
            f"attn_implementation {name!r} needs a cache that holds exactly the tokens seen so far (a "
            f"DynamicCache); this cache gives kv_length={kv_length}, kv_offset={kv_offset} for "
            f"{q_offset} past and {q_length} new tokens (a static or sliding-window cache)")
    return None


# ----------------------------------------------------------------------------- the attention function
def check_attention_call(name: str, module, attention_mask, dropout: float, kwargs: dict) -> None:
    """What the kernels cannot do, raised instead of silently ignored: ``ValueError`` for a mask handed in,
    attention dropout, sliding windows, soft-capping, attention sinks and non-causal modules."""
    if attention_mask is not None and not is_static_cache_marker(attention_mask):
        raise ValueError(
            f"attn_implementation {name!r} got an attention mask of shape {tuple(attention_mask.shape)}; it "
            f"supports plain causal attention only (its mask function hands the model none): a 4-D or custom "
            f"mask is not supported")
    if dropout and float(dropout) > 0.0:
        raise ValueError(
            f"attn_implementation {name!r} does not support attention dropout (dropout={dropout} in training); "
            f"set config.attention_dropout = 0.0 or call model.eval()")
    if kwargs.get("sliding_window") is not None:
        raise ValueError(
            f"attn_implementation {name!r} does not support sliding-window attention "
            f"(sliding_window={kwargs['sliding_window']})")
    for unsupported in ("softcap", "s_aux"):
        if kwargs.get(unsupported) is not None:
            raise ValueError(f"attn_implementation {name!r} does not support {unsupported!r} (attention logit "
                             f"soft-capping / attention sinks)")
    if not getattr(module, "is_causal", True):
        raise ValueError(f"attn_implementation {name!r} supports causal attention only (module.is_causal is False)")


@torch.library.custom_op("topo_attn::backend_prefill", mutates_args=())
def backend_prefill(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, name: str, layer_idx: int,
                    scale: float | None) -> torch.Tensor:
    """The custom op ``torch.ops.topo_attn.backend_prefill``: one whole-sequence call (``q_len == kv_len``) of
    backend ``name`` for layer ``layer_idx`` (``-1``: none) with softmax ``scale`` (None: ``1 / sqrt(D)``), its
    schedule (:func:`schedule_for`, or the kept dense one) and kernel, as one opaque op, so ``torch.compile``
    traces a model's prefill without a graph break and its CUDA graphs replay the whole call (no host time per
    layer). Returns ``[B, Hq, S, D]`` laid out like ``torch.empty_like(query)``. Records no :func:`last_stats`
    entry (the statistics live on the host); no gradient. Trusts its inputs (checked by the attention function;
    only sync-free schedules reach it). Nothing allocated here is kept: the topology kernels launch one by one
    (:func:`~topo_attn.topology.gpu.graph.no_cached_graphs`) and a dense schedule not yet kept is built afresh and
    not kept. Under ``mode="reduce-overhead"`` the op runs in the compiled function's graph pool, where a kept
    buffer would outlive the call (cudagraph trees refuse that: "tensors in the cudagraph pool not tracked as
    outputs")."""
    from ..topology.gpu.graph import no_cached_graphs

    with no_cached_graphs():  # run inside torch.compile's CUDA graphs: no buffer of a graph cached here
        schedule = _whole_sequence_schedule(_REGISTRY[name], None if layer_idx < 0 else layer_idx, query, key,
                                            scale, keep=False)
    return scheduled_attention(query, key, value, schedule, scale=scale)


@backend_prefill.register_fake
def _backend_prefill_fake(query, key, value, name, layer_idx, scale):
    return torch.empty_like(query)


def compiled_prefill(settings: Settings, layer_idx: int | None, query: torch.Tensor, key: torch.Tensor,
                     value: torch.Tensor) -> bool:
    """Whether a whole-sequence call goes through :func:`backend_prefill`: while ``torch.compile`` traces, without
    gradients, on a dense layer or a selector whose schedule needs no host sync (``sync_free`` in
    :data:`topo_attn.selection.SELECTORS`; the others are traced as they run eagerly)."""
    grad = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    return (torch.compiler.is_compiling() and not grad
            and (settings.is_dense(layer_idx) or SELECTORS[settings.selector].sync_free))


def _attention(name: str, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
               **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention function for ``name``: query ``[B, Hq, q_len, D]``, key/value
    ``[B, Hkv, kv_len, D]``; returns ``(out [B, q_len, Hq, D] contiguous, None)`` (see the module docstring)."""
    backend = _REGISTRY[name]
    settings = backend.settings
    check_attention_call(name, module, attention_mask, dropout, kwargs)
    state = getattr(key, STATIC_STATE_ATTRIBUTE, None)
    if state is not None or is_static_cache_marker(attention_mask):
        return _static_cache_attention(name, module, state, query, key, value, scaling, dropout, kwargs)
    layer_idx = getattr(module, "layer_idx", None)
    # under autocast the selection reads q and k in the dtype the kernel runs them in (after the rotary
    # embedding of a float32 model they are float32: Quest's kernel would score them in IEEE float32)
    query, key, value = autocast_inputs(query, key, value)
    batch, heads, q_len, _ = query.shape
    kv_len = key.shape[-2]
    bs = settings.block_size
    blocks_read = 0
    if q_len == kv_len and compiled_prefill(settings, layer_idx, query, key, value):
        out = torch.ops.topo_attn.backend_prefill(query, key, value, name, -1 if layer_idx is None else layer_idx,
                                                  None if scaling is None else float(scaling))
        return out.transpose(1, 2).contiguous(), None
    if q_len == kv_len:
        timed = backend.timings is not None and query.is_cuda
        if timed:  # the GPU drains first, so a full launch queue never holds the host inside the timed span
            events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]  # created outside the host span
            torch.cuda.synchronize(query.device)
            host = time.perf_counter()
            events[0].record()
        # the kernels and the statistics read any strides: transformers' [B, S, H, D] views are not copied
        dense = settings.is_dense(layer_idx)
        schedule = _whole_sequence_schedule(backend, layer_idx, query, key, scaling)
        if timed:
            events[1].record()
        out = scheduled_attention(query, key, value, schedule, scale=scaling)
        if timed:
            events[2].record()
            backend.timings.append((layer_idx, time.perf_counter() - host, *events))
        if dense:  # counted in the backend's blocks, as the sparse layers are
            scheduled = causal = batch * heads * _causal_block_pairs(0, (q_len - 1) // bs)
        else:  # (a padded schedule's count stays on the device: no host sync)
            per_lane_set = batch * heads // schedule.num_lanes
            entries = schedule.entry_count().long() if schedule.padded else schedule.nnz
            scheduled, causal = entries * per_lane_set, schedule.causal_blocks * per_lane_set
        path = "kernel"
    elif q_len < kv_len and (settings.is_dense(layer_idx) or settings.selector in INCREMENTAL_SELECTORS):
        from ..attention.decode import MAX_DECODE_QUERIES  # triton is imported by now

        if settings.is_dense(layer_idx):
            schedule = _dense_schedule(backend, kv_len, query.device, q_len)
        else:
            stats = _block_stats(key, bs)
            before = stats.blocks_read
            schedule = step_schedule(settings, layer_idx, query, key, stats)
            blocks_read = stats.blocks_read - before
        out = scheduled_attention(query, key, value, schedule, scale=scaling)
        counts, per_lane_set = schedule.counts(), batch * heads // schedule.num_lanes
        scheduled, causal = counts.scheduled_blocks * per_lane_set, counts.causal_blocks * per_lane_set
        path = "decode kernel" if q_len <= MAX_DECODE_QUERIES else "kernel"
    elif q_len < kv_len:
        if not backend.warned:
            backend.warned = True
            warnings.warn(
                f"attn_implementation {name!r}: selector {settings.selector!r} has no incremental form, so steps "
                f"with fewer queries than keys (decode with a KV cache, chunked prefill) are computed densely over "
                f"the cache (exact causal attention, not the sparse schedule); the selectors "
                f"{list(INCREMENTAL_SELECTORS)} decode sparsely; warned once",
                DenseDecodeWarning, stacklevel=3)
        out = _dense_bottom_right(query, key, value, scaling)
        first, last = (kv_len - q_len) // bs, (kv_len - 1) // bs
        scheduled = causal = batch * heads * _causal_block_pairs(first, last)
        path = "dense decode"
    else:
        raise ValueError(f"attn_implementation {name!r}: more queries ({q_len}) than keys ({kv_len})")
    backend.stats[layer_idx] = (scheduled, causal, batch * heads, q_len, kv_len, path, blocks_read)
    done = backend.totals.get(path, (0, 0, 0))
    backend.totals[path] = (done[0] + scheduled, done[1] + causal, done[2] + 1)
    return out.transpose(1, 2).contiguous(), None


def _static_cache_attention(name: str, module: torch.nn.Module, state, query: torch.Tensor, key: torch.Tensor,
                            value: torch.Tensor, scaling: float | None, dropout: float,
                            kwargs: dict) -> tuple[torch.Tensor, None]:
    """The attention function over a static cache's buffers ``key, value [B, H_kv, max_cache_len, D]`` with the
    layer's :class:`~topo_attn.integrations.static_cache.StaticLayerState` ``state`` (whose ``length`` counts
    the valid keys, this call's included):

    - a one-token step of a dense layer or of a selector with a fixed-shape step
      (:data:`~topo_attn.selection.static_step.STATIC_SELECTORS`), and a step of up to 16 tokens of a dense
      layer: :func:`~topo_attn.attention.static_decode.static_decode` over the buffers, the statistics' update
      and the selection by :func:`~topo_attn.selection.static_step.decode_step_table` (one launch on a GPU);
      nothing is read back, so a compiled step
      captures it whole (no :func:`last_stats` entry is recorded for such a step: its visited blocks are known
      on the device only);
    - anything else (the prefill, a chunk, a selector without a fixed-shape step): the valid keys, whose count
      is read on the host once, through the dynamic-cache path.

    The block statistics of a sparse layer are updated for the blocks this call writes, in every case."""
    from ..attention.decode import MAX_DECODE_QUERIES
    from ..attention.static_decode import static_decode
    from ..selection.static_step import FUSED_SCORES, STATIC_SELECTORS, decode_step_table

    if state is None:
        raise ValueError(f"attn_implementation {name!r} needs a TopoStaticCache "
                         f"(topo_attn.integrations.static_cache) for a static cache, not a plain StaticCache")
    settings = _REGISTRY[name].settings
    layer_idx = getattr(module, "layer_idx", None)
    q_len = query.shape[-2]
    dense = settings.is_dense(layer_idx)
    stats = None
    if not dense and settings.selector in STATIC_SELECTORS:
        stats = state.block_stats(key, settings.block_size, salience=SELECTORS[settings.selector].topology_aware)
        if q_len > 1:  # an eager call (the prefill, a chunk)
            stats.update(key, state.length - q_len, q_len)
            if FUSED_SCORES.get(settings.selector) == "salience":  # a query-blind row: kept between steps
                state.keep_rows(stats, settings.sinks, settings.window, settings.budget)
    if (dense and q_len <= MAX_DECODE_QUERIES) or (stats is not None and q_len == 1):
        table = None if dense else decode_step_table(settings.selector, query, key, stats, state.length,
                                                     settings.sinks, settings.window, settings.budget)
        out = static_decode(query, key, value, state.length, table, settings.block_size, scaling,
                            merge=settings.decode_merge)
        return out.transpose(1, 2).contiguous(), None
    valid = int(state.length)  # one read on the host: an eager call (the prefill, a chunk)
    return _attention(name, module, query, key[..., :valid, :], value[..., :valid, :], None, scaling, dropout,
                      **kwargs)


def _block_stats(key: torch.Tensor, block_size: int) -> KeyBlockStats:
    """The layer's block statistics kept by the cache (:data:`BLOCK_STATS_ATTRIBUTE` on the key tensor), else
    fresh ones (computed from every cached key)."""
    getter = getattr(key, BLOCK_STATS_ATTRIBUTE, None)
    return getter(block_size) if getter is not None else KeyBlockStats(block_size)


def _dense_bottom_right(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        scaling: float | None) -> torch.Tensor:
    """Exact causal attention of ``q_len`` queries at positions ``kv_len - q_len + i`` over ``kv_len`` keys
    (torch's SDPA with a boolean ``[q_len, kv_len]`` mask; none for one query): ``[B, Hq, q_len, D]``."""
    q_len, kv_len = query.shape[-2], key.shape[-2]
    mask = None
    if q_len > 1:
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(diagonal=kv_len - q_len)
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale,
                                                            enable_gqa=query.shape[1] != key.shape[1])
