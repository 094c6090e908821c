"""A causal LM's prefill timed with each attention implementation: the rows of the benchmark's ``model`` suite
(:mod:`topo_attn.bench.model`, a 1B-shaped Llama) and of the language-model study's ``speed`` section
(:mod:`topo_attn.lm.study`, the kit's model). Both import it from here; it imports neither of them.

:func:`prefill_speed_rows` times one prefill forward of ``seq_len`` random tokens
(``model(ids, logits_to_keep=1, use_cache=False)`` under ``torch.no_grad()``) with each attention
implementation of the same transformers model, switched with ``model.set_attn_implementation``, in this order:

- the **no-attention floor** (:data:`FLOOR`): an attention that returns its values, so its time is everything
  but attention (what sparsity cannot save);
- ``sdpa``; the kit's backend (:mod:`topo_attn.integrations.transformers`) with ``dense``; then every selector
  of the registry at a budget of ``n / 8`` blocks and at :data:`FIXED_BUDGET` blocks (2048 tokens with 64-token
  blocks), or at ``topk`` blocks when given, with the given sinks and window, each key/value head's query heads
  choosing together. Selectors whose scores need host syncs (``oracle``, the cluster selectors) run only up to
  :data:`SLOW_SELECTORS_UP_TO` tokens; longer prefills give them a row with NaN and the reason;
- ``flex_attention`` (transformers' own) last, when asked for.

Each row gives the time, its ratio to SDPA and to FlexAttention, the **attention share**
``(ms - floor) / (sdpa_ms - floor)`` (the row's attention over SDPA's, the rest of the model taken out), the
visited fraction of the causal blocks (mean over layers), the largest difference of the last position's
logits from SDPA's, the host syncs of one forward (counted with ``torch.cuda.set_sync_debug_mode``), and for the
kit's rows, from one more forward with CUDA events around each layer's schedule and kernels
(:func:`~topo_attn.integrations.transformers.record_timings`): the schedule's share of the attention time of the
sparse layers and the host time per layer. Needs transformers (the ``lm`` extra), imported on use.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from functools import partial

import torch

from .schedule import num_blocks

FLOOR = "no attention"
"""The label of the floor's row: the same model with an attention that returns its values."""

FIXED_BUDGET = 32
"""The fixed budget of extra blocks per query block (2048 tokens with 64-token blocks)."""

SDPA_MASKED = "sdpa, mask materialised"
"""The label of a compiled run's row of transformers' own ``sdpa``: while ``torch.compile`` traces, its mask
function cannot skip the causal mask, so SDPA gets an ``[S, S]`` mask and leaves its causal kernel (the ``sdpa``
row of a compiled run passes no mask)."""

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
"""The ``torch.compile`` modes the prefill can be timed under (``--compile`` of the model suite and of
``python -m topo_attn.lm evaluate``; ``reduce-overhead`` replays CUDA graphs)."""

SLOW_SELECTORS_UP_TO = 8192
"""Selectors whose scores wait for the host (``Selector.host_scores``: the oracle's full attention, the cluster
selectors' numpy cuts) run up to this many tokens."""


def calls_median_ms(fn: Callable[[], object], warmup: int = 1, repeats: int = 5) -> float:
    """Median time of ``fn()`` in milliseconds over ``repeats`` calls after ``warmup`` calls (compilation and
    autotuning happen there), each timed alone with CUDA events. For calls of tens of milliseconds and more,
    where ``triton.testing.do_bench``'s five-call estimate would cost more than the measurement."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


@torch.library.custom_op("topo_attn::no_attention", mutates_args=())
def no_attention_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """The custom op ``torch.ops.topo_attn.no_attention``: for ``query [B, H, L, D]`` and ``key, value
    [B, H_kv, S, D]`` (``L <= S``), each query head's output is the first ``L`` values of its key/value head,
    ``[B, L, H, D]`` contiguous. Opaque to ``torch.compile``, and it takes the query and the key, so a compiled
    floor still computes them: with an attention function that ignored them, the compiler drops the query and
    key projections and the rotary embedding as dead code, and the floor then misses work that every attention
    row does."""
    group = query.shape[1] // value.shape[1]
    return value[:, :, :query.shape[2]].repeat_interleave(group, dim=1).transpose(1, 2).contiguous()


@no_attention_op.register_fake
def _no_attention_fake(query, key, value):
    batch, heads, length, _ = query.shape
    return value.new_empty(batch, length, heads, value.shape[-1])


def no_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The floor's attention function (:func:`no_attention_op`): each query head's output is its key/value head's
    values (``[B, L, H, D]``), as cheap as an attention can be while the rest of the model runs unchanged,
    compiled or not."""
    return no_attention_op(query, key, value), None


def idle_call_us(fn: Callable[[], object], calls: int = 5) -> float:
    """Median host time of ``calls`` calls of ``fn()`` in microseconds, from the call to its return, the device
    drained before each (so no call waits for a full launch queue); on a CPU simply the call's time."""
    times = []
    for _ in range(calls):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return statistics.median(times)


def host_syncs(fn: Callable[[], object]) -> int:
    """How many synchronising CUDA calls ``fn()`` makes (``torch.cuda.set_sync_debug_mode("warn")``)."""
    import warnings

    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return sum("synchroniz" in str(w.message) for w in caught)


def _backends(block_size: int, sinks: int, window: int, budgets: list[int],
              selectors: tuple[str, ...] | None = None,
              compiled: bool = False) -> list[tuple[str, str, str | None, int | None]]:
    """(label, attn_implementation, selector, budget) of every row but FlexAttention's; with ``selectors``, the
    floor, sdpa and the rows of those names only (``"dense"``: the kit's dense row). ``compiled``: the ``sdpa``
    row is SDPA with no mask (its causal kernel, as transformers runs it eagerly), and a :data:`SDPA_MASKED` row
    follows with transformers' own ``sdpa``, whose mask function materialises the causal mask while
    ``torch.compile`` traces."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface

    from . import selection
    from .integrations import transformers as tat

    for implementation, function in (("topo_attn_prefill_floor", no_attention),
                                     ("topo_attn_prefill_sdpa", sdpa_attention_forward)):
        AttentionInterface.register(implementation, function)
        AttentionMaskInterface.register(implementation, partial(tat.plain_causal_mask, implementation))
    rows = [(FLOOR, "topo_attn_prefill_floor", None, None)]
    rows += [("sdpa", "topo_attn_prefill_sdpa", None, None), (SDPA_MASKED, "sdpa", None, None)] if compiled \
        else [("sdpa", "sdpa", None, None)]
    common = dict(block_size=block_size, sinks=sinks, window=window)
    if selectors is None or "dense" in selectors:
        rows.append(("topo_attn dense", tat.register("dense", name="topo_attn_prefill_dense", **common), "dense",
                     None))
    for selector in (s for s in selection.names("block") if selectors is None or s in selectors):
        for budget in (budgets if selection.SELECTORS[selector].adds_blocks else budgets[:1]):
            name = f"topo_attn_prefill_{selector}_{budget}"
            rows.append((f"topo_attn {selector}", tat.register(selector, budget=budget, name=name, **common),
                         selector, budget))
    return rows


def prefill_speed_rows(model, name: str, seq_len: int, block_size: int, *, batch: int = 1, sinks: int = 1,
                       window: int = 1, topk: int | None = None, median_ms: Callable = calls_median_ms,
                       with_flex: bool = True, after_row: Callable[[list[dict]], None] | None = None,
                       selectors: tuple[str, ...] | None = None,
                       compile: Callable[[Callable], Callable] | None = None) -> list[dict]:
    """Rows (module docstring) of ``model`` (a transformers causal LM, in eval mode, on its device; left on
    ``sdpa``) prefilling ``batch`` sequences of ``seq_len`` random tokens (seeded by ``seq_len``), named ``name``
    in the rows' ``case``. The kit's backend uses blocks of ``block_size``, ``sinks`` and ``window``, and each
    selector's budget is ``topk`` blocks when given, else both ``n / 8`` (at least 1) and :data:`FIXED_BUDGET`.
    The heads, head dim and dtype recorded are the model's. ``median_ms(fn)`` times a call; FlexAttention (left
    out without ``with_flex``) that fails is reported on stderr and its row holds NaN. The syncs and the
    per-layer timings are measured on a GPU only (NaN elsewhere). ``after_row(rows)`` is called with the rows
    done so far (ratios included) after each attention, so a caller can keep them if the run is cut short.
    ``selectors``: only the rows of these selectors (``"dense"`` for the kit's dense row) next to the floor,
    sdpa and FlexAttention (None: every selector). ``compile``: a function that compiles ``model.forward``
    (e.g. ``partial(torch.compile, mode="reduce-overhead")``); then every row is timed on the compiled forward
    (dynamo reset before each row; called with a ``DynamicCache``, ``use_cache=True``, since without a cache
    transformers hands a traced forward a packed-sequence mask), its logits and visited fraction still come
    from one eager forward, FlexAttention is left out, the selectors whose schedules wait for the host get a
    skipped row (``compiled`` in the row names the compiled forward), the schedule's share is not measured, the
    syncs are those of one compiled call, and ``host_us_per_layer`` is the host time of a whole compiled call
    (:func:`idle_call_us`: the GPU idle before it) over the layers, for every row: the rest of the model's host
    work included, so an upper bound of the attention's."""
    import transformers

    from . import selection
    from .integrations import transformers as tat

    config = model.config
    device = model.device
    gen = torch.Generator().manual_seed(seq_len)
    ids = torch.randint(0, config.vocab_size, (batch, seq_len), generator=gen).to(device)
    nb = num_blocks(seq_len, block_size)
    budgets = [topk] if topk is not None else sorted({max(1, nb // 8), FIXED_BUDGET})
    backends = _backends(block_size, sinks, window, budgets, selectors, compiled=compile is not None)
    if with_flex and compile is None:  # last: its compilation is the slowest, and a stall leaves the rest done
        backends.append(("flex_attention", "flex_attention", None, None))
    on_gpu = torch.device(device).type == "cuda"
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    def prefill(call: Callable, use_cache: bool) -> Callable[[], torch.Tensor]:
        """One prefill through ``call`` (the model, or its compiled forward: called with a cache, or transformers
        hands the trace a packed-sequence mask), the last position's logits."""
        def run():
            with torch.no_grad():
                return call(ids, logits_to_keep=1, use_cache=use_cache).logits
        return run

    forward = prefill(model, use_cache=False)

    rows, reference = [], None
    for label, implementation, selector, budget in backends:
        row = dict(case=name, suite="model", attention=label, selector=selector, budget=budget,
                   seq_len=seq_len, batch=batch, heads=config.num_attention_heads,
                   kv_heads=config.num_key_value_heads, head_dim=head_dim, block_size=block_size,
                   dtype=str(model.dtype).removeprefix("torch."), layers=config.num_hidden_layers,
                   hidden=config.hidden_size, transformers=transformers.__version__, ms=float("nan"),
                   visited_fraction=float("nan"), max_logit_diff=float("nan"), syncs=float("nan"),
                   schedule_share=float("nan"), host_us_per_layer=float("nan"), skipped=None,
                   compiled=compile is not None)
        rows.append(row)
        if (selector in selection.SELECTORS and selection.SELECTORS[selector].host_scores
                and seq_len > SLOW_SELECTORS_UP_TO):
            row["skipped"] = f"its scores wait for the host; run up to {SLOW_SELECTORS_UP_TO} tokens"
            continue
        if compile is not None and selector in selection.SELECTORS and not selection.SELECTORS[selector].sync_free:
            row["skipped"] = "its schedule waits for the host, so a compiled forward breaks at each layer"
            continue
        started = time.perf_counter()
        try:
            model.set_attn_implementation(implementation)
            logits = forward().float()
            if label == "sdpa":
                reference = logits
            if reference is not None:
                row["max_logit_diff"] = (logits - reference).abs().max().item()
            if selector is not None:  # from the eager forward: compiled calls record no statistics
                stats = tat.last_stats(implementation).values()
                row["visited_fraction"] = sum(s.visited_fraction for s in stats) / len(stats)
            if compile is not None:
                torch._dynamo.reset()  # each row compiles its own forward
                compiled = prefill(compile(model.forward), use_cache=True)
                row["ms"] = median_ms(compiled)
                if on_gpu:  # after the timing's calls: each call replays what it recorded
                    row["syncs"] = host_syncs(compiled)
                    row["host_us_per_layer"] = idle_call_us(compiled) / config.num_hidden_layers
            else:
                row["ms"] = median_ms(forward)
            if on_gpu and compile is None:
                row["syncs"] = host_syncs(forward)
            if on_gpu and selector is not None and compile is None:
                tat.record_timings(implementation)
                forward()
                timed = tat.timings(implementation)
                tat.record_timings(implementation, enabled=False)
                row["schedule_share"] = (sum(t.select_ms for t in timed)
                                         / sum(t.select_ms + t.kernel_ms for t in timed))
                row["host_us_per_layer"] = 1e3 * sum(t.host_ms for t in timed) / len(timed)
        except Exception as exc:  # as in the benchmark's suites: report, do not hide (the row shows NaN)
            if implementation != "flex_attention":
                raise
            print(f"  {label} failed on {name}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
        # (on stderr as it goes: where the time went, compilation included, even if a later backend stalls)
        print(f"  {name}, {label} {budget or ''}: {row['ms']:.1f} ms per prefill, "
              f"{time.perf_counter() - started:.0f} s in all", file=sys.stderr, flush=True)
        if after_row is not None:
            after_row(_with_ratios(rows))
    model.set_attn_implementation("sdpa")
    return _with_ratios(rows)


def _with_ratios(rows: list[dict]) -> list[dict]:
    """``rows`` with ``vs_sdpa`` and ``vs_flex`` (each time over SDPA's and FlexAttention's) and
    ``attention_share`` (``(ms - floor) / (sdpa - floor)``); NaN where a time is absent."""
    times = {r["attention"]: r["ms"] for r in rows}
    sdpa, flex = times.get("sdpa", float("nan")), times.get("flex_attention", float("nan"))
    floor = times.get(FLOOR, float("nan"))
    return [{**r, "floor_ms": floor, "vs_sdpa": r["ms"] / sdpa, "vs_flex": r["ms"] / flex,
             "attention_share": (r["ms"] - floor) / (sdpa - floor)} for r in rows]
