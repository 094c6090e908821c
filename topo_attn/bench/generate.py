"""The ``generate`` suite of the benchmark runner: time per new token of greedy ``generate()`` with a static
cache and the compiled step, the kit's attention next to transformers' own fast-decoding recipe
(``python -m topo_attn.bench --suite generate``).

Per case: the ``model`` suite's 1B-shaped Llama (:func:`topo_attn.bench.model.build_model`) with a static
cache of ``seq_len + new tokens`` slots per sequence, holding ``seq_len`` context tokens already: random keys
and values written into every layer (the same seeded values for every row; a real prefill of B8 x 128k would
take longer than the decoding it sets up). Then ``model.generate(ids, max_new_tokens=...)``, greedy, which
compiles the decode step (transformers does so for a static cache on a GPU; the ``compile_config`` is the
default ``torch.compile`` with CUDA graphs, the same for every row). The rows:

- ``no attention (floor)``: transformers' ``StaticCache`` with an attention that returns its values
  (:func:`no_attention_step`), what the step costs without attention; every row's ``attention_ms`` is its time
  less this one's;
- ``sdpa static cache compiled (recipe)``: transformers' ``StaticCache`` with SDPA, the dense recipe;
- ``kit dense static cache compiled``: :class:`~topo_attn.integrations.static_cache.TopoStaticCache` with the
  kit's backend, every block; ``tokens_match`` says whether its greedy tokens equal the recipe's;
- one row per selector of :data:`~topo_attn.selection.static_step.STATIC_SELECTORS` at a budget of
  ``budget_tokens`` (in blocks of the case's size), one sink and one window block;
- the kit's rows again with the decode's one-launch merge (:data:`ONE_LAUNCH`).

``ms_per_token`` is ``(T(1 + n) - T(1)) / n`` for ``n`` new tokens, each ``T`` the median wall time of a
``generate`` call after warm-up calls (which compile and capture), with the cache reset to the context
length before each call; ``matching_tokens``: how many new tokens, from the first, equal the recipe's in every
sequence, and ``first_logit_diff`` the largest difference of the first new token's logits from the recipe's
(with random weights the logits are close to one another, so a rounding difference can flip a greedy token);
``floor_ms`` is the step's bytes floor at the GPU's datasheet bandwidth: the weights,
the key/value blocks the step reads and, for a selector, what its step reads of the kept block statistics
(:data:`KEPT_VALUES`), read once. Needs
transformers and a CUDA GPU.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from functools import partial

import torch

from ..prefill_speed import no_attention_op
from .decode import peak_tbps_for
from .model import build_model
from .table import markdown_header, shown

RECIPE = "sdpa static cache compiled (recipe)"
KIT_DENSE = "kit dense static cache compiled"
NO_ATTENTION = "no attention (floor)"
ONE_LAUNCH = ", one-launch merge"
"""The suffix of a kit row whose decode merges its splits in the split kernel (``decode_merge="kernel"``)."""
NEW_TOKENS = 32
BUDGET_TOKENS = 2048
GENERATE_COLUMNS = ["case", "attention", "budget tokens", "ms / token", "attention ms", "/ recipe",
                    "bytes floor ms", "/ floor", "tokens match", "same tokens", "first-step max |logit diff|"]


def fill_static_cache(cache, model, batch: int, context: int, seed: int = 0) -> None:
    """Write ``context`` seeded random keys and values (the model's dtype, unit variance) into every layer of
    the static ``cache`` through its ``update``, as a prefill would (the cache's length becomes ``context``)."""
    config = model.config
    generator = torch.Generator(device=model.device).manual_seed(seed)
    shape = (batch, config.num_key_value_heads, context, config.head_dim)
    for layer in range(config.num_hidden_layers):
        keys = torch.randn(shape, generator=generator, device=model.device, dtype=model.dtype)
        values = torch.randn(shape, generator=generator, device=model.device, dtype=model.dtype)
        cache.update(keys, values, layer)


def rewind(cache, context: int, block_sizes: tuple[int, ...] = (), salience: bool = False) -> None:
    """Set every layer's length back to ``context`` (in place, on the device), as after the fill, and bring the
    kept block statistics of ``block_sizes`` (with the kept salience when ``salience``) up to date over the whole
    context (what the prefill's attention calls would have done)."""
    from ..integrations.transformers import STATIC_STATE_ATTRIBUTE

    for layer in cache.layers:
        layer.cumulative_length.fill_(context)
        state = getattr(layer.keys, STATIC_STATE_ATTRIBUTE, None)
        for block_size in block_sizes if state is not None else ():
            start = torch.zeros((), dtype=layer.cumulative_length.dtype, device=layer.keys.device)
            state.block_stats(layer.keys, block_size, salience).update(layer.keys, start, context)


def no_attention_step(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The floor's attention function over a static cache (:data:`NO_ATTENTION`): each query head's output is
    the first ``L`` slots of its key/value head's values (``[B, L, H, D]``,
    :func:`topo_attn.prefill_speed.no_attention_op`, which the compiled step cannot drop the query for), so the
    step costs what the model costs without attention."""
    return no_attention_op(query, key, value), None


def _wait(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def generate_ms(model, cache, ids: torch.Tensor, context: int, new_tokens: int, block_sizes: tuple[int, ...],
                repeats: int = 3, warmup: int = 2, salience: bool = False) -> tuple[float, torch.Tensor]:
    """The median wall time (ms) of a greedy ``generate`` of ``new_tokens`` after ``ids`` (whose first
    ``context`` tokens the cache holds), each call from the cache rewound to ``context``; and the tokens of the
    last call. ``block_sizes``, ``salience``: as in :func:`rewind`."""
    from ..integrations.cache import cache_argument

    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                  **cache_argument(cache))
    times, out = [], None
    for done in range(warmup + repeats):
        rewind(cache, context, block_sizes, salience)
        _wait(ids.device)
        start = time.perf_counter()
        out = model.generate(ids, **kwargs)
        _wait(ids.device)
        if done >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), out


def first_step_logits(model, cache, ids: torch.Tensor, context: int, block_sizes: tuple[int, ...],
                      salience: bool = False) -> torch.Tensor:
    """The logits (float32 ``[B, vocab]``) of the first new token after ``ids``, from the cache rewound to
    ``context`` (``block_sizes``, ``salience``: as in :func:`rewind`)."""
    from ..integrations.cache import cache_argument

    rewind(cache, context, block_sizes, salience)
    out = model.generate(ids, max_new_tokens=1, do_sample=False, pad_token_id=0, return_dict_in_generate=True,
                         output_logits=True, **cache_argument(cache))
    return out.logits[0].float()


KEPT_VALUES = {"topology": lambda dim: 1, "centroid": lambda dim: dim, "quest": lambda dim: 2 * dim}
"""Float32 values a selector's step reads per key block and key/value head: the kept salience, the centroid, the
minimum and maximum."""


def bytes_floor_ms(model, case, context: int, budget_blocks: int | None, selector: str | None,
                   peak_tbps: float) -> float:
    """The step's bytes floor (module docstring): weights + key/value blocks read (+ what ``selector``'s step
    reads of every complete block, :data:`KEPT_VALUES`), over ``peak_tbps``."""
    config = model.config
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    itemsize = torch.empty((), dtype=model.dtype).element_size()
    per_token = 2 * config.num_key_value_heads * config.head_dim * itemsize * config.num_hidden_layers
    tokens = context if budget_blocks is None else min(context, (budget_blocks + 3) * case.block_size)
    kv = case.batch * tokens * per_token
    kept = 0
    if selector in KEPT_VALUES:
        kept = (case.batch * (context // case.block_size) * KEPT_VALUES[selector](config.head_dim)
                * config.num_key_value_heads * 4 * config.num_hidden_layers)
    return (weights + kv + kept) / (peak_tbps * 1e12) * 1e3


def run_generate_case(case, new_tokens: int = NEW_TOKENS, budget_tokens: int = BUDGET_TOKENS,
                      peak_tbps: float | None = None, selectors: tuple[str, ...] | None = None,
                      device: str = "cuda", shape: dict | None = None, repeats: int = 3,
                      warmup: int = 2, merges: tuple[str, ...] = ("separate", "kernel"), dense: bool = True,
                      after_row: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """The rows of one case (module docstring): ``context = case.seq_len`` tokens in the cache, batch
    ``case.batch``, ``new_tokens`` timed, the selectors at ``budget_tokens`` (default
    :data:`~topo_attn.selection.static_step.STATIC_SELECTORS` without ``window``), on ``device`` with the model
    of :func:`~topo_attn.bench.model.build_model` (``shape`` as there), ``repeats`` timed ``generate`` calls
    after ``warmup`` ones. ``peak_tbps``: the bandwidth of the bytes floor (default: the GPU's datasheet
    figure). ``merges``: the kit's rows are run with each of these ``decode_merge`` modes
    (:func:`~topo_attn.integrations.transformers.register`), the ``"kernel"`` ones labelled :data:`ONE_LAUNCH`;
    ``dense=False`` leaves the kit's dense rows out (the floor and the recipe always run, first: every other row
    is measured against them). Each row's ``attention_ms`` is its time less the :data:`NO_ATTENTION` row's.
    ``after_row(rows)`` is called with the finished rows so far after each row from the recipe on, so that a
    run stopped by a time limit keeps them."""
    from transformers import AttentionInterface, StaticCache
    from transformers.masking_utils import AttentionMaskInterface

    from ..integrations import transformers as tat
    from ..integrations.static_cache import TopoStaticCache
    from ..integrations.transformers import STATIC_STATE_ATTRIBUTE
    from ..selection import SELECTORS
    from ..selection.static_step import STATIC_SELECTORS

    if peak_tbps is None:
        peak_tbps = peak_tbps_for(torch.cuda.get_device_name()) if device == "cuda" else 1.0
    context, batch, bs = case.seq_len, case.batch, case.block_size
    started = time.perf_counter()
    model = build_model(case, device, shape)
    model.config.max_position_embeddings = max(model.config.max_position_embeddings, context + 2 * new_tokens)
    ids = torch.randint(1, model.config.vocab_size, (batch, context + 1),
                        generator=torch.Generator().manual_seed(7)).to(device)
    max_len = context + new_tokens + 8
    selectors = tuple(s for s in STATIC_SELECTORS if s != "window") if selectors is None else selectors
    budget = budget_tokens // bs

    def timed(attention: str, cache_type, implementation: str, block_sizes=(), budget_blocks=None,
              selector=None) -> dict:
        torch._dynamo.reset()  # each row compiles its own step (the rows' frames would reach the recompile limit)
        model.set_attn_implementation(implementation)
        cache = cache_type(model.config, max_cache_len=max_len)
        fill_static_cache(cache, model, batch, context)
        salience = selector is not None and SELECTORS[selector].topology_aware
        if salience:  # the buffers of kept rows the prefill's attention would have made (each call rewinds)
            for layer in cache.layers:
                state = getattr(layer.keys, STATIC_STATE_ATTRIBUTE)
                state.keep_rows(state.block_stats(layer.keys, bs, salience), case.sinks, case.window, budget_blocks)
        one, _ = generate_ms(model, cache, ids, context, 1, block_sizes, repeats, warmup, salience)
        many, tokens = generate_ms(model, cache, ids, context, 1 + new_tokens, block_sizes, repeats, warmup, salience)
        logits = first_step_logits(model, cache, ids, context, block_sizes, salience)
        floor = bytes_floor_ms(model, case, context, budget_blocks, selector, peak_tbps)
        ms = (many - one) / new_tokens
        print(f"  {case.name} {attention}: {ms:.2f} ms per token ({time.perf_counter() - started:.0f} s)",
              file=sys.stderr, flush=True)
        del cache
        if device == "cuda":
            torch.cuda.empty_cache()
        return dict(case=case.name, context=context, batch=batch, attention=attention, selector=selector,
                    budget_tokens=None if budget_blocks is None else budget_blocks * bs, ms_per_token=ms,
                    floor_ms=floor, new_tokens=new_tokens, tokens=tokens, logits=logits)

    def finish(row: dict, floor_row: dict, recipe: dict) -> None:  # the fields measured against the two
        row["attention_ms"] = row["ms_per_token"] - floor_row["ms_per_token"]
        row["vs_recipe"] = row["ms_per_token"] / recipe["ms_per_token"]
        row["vs_floor"] = row["ms_per_token"] / row["floor_ms"]
        new = row["tokens"][:, context + 1:]
        same = (new == recipe["tokens"][:, context + 1:]).all(0)
        row["matching_tokens"] = int(same.int().cumprod(0).sum())  # new tokens equal to the recipe's, from the first
        row["first_logit_diff"] = float((row["logits"] - recipe["logits"]).abs().max())
        if row["attention"].startswith(KIT_DENSE):
            row["tokens_match"] = bool(torch.equal(row["tokens"], recipe["tokens"]))

    rows: list[dict] = []

    def add(row: dict) -> None:
        rows.append(row)
        if len(rows) >= 2:
            for done in rows if len(rows) == 2 else [row]:
                finish(done, rows[0], rows[1])
            if after_row is not None:
                after_row([{k: v for k, v in r.items() if k not in ("tokens", "logits")} for r in rows])

    AttentionInterface.register("topo_generate_floor", no_attention_step)
    AttentionMaskInterface.register("topo_generate_floor", partial(tat.plain_causal_mask, "topo_generate_floor"))
    add(timed(NO_ATTENTION, StaticCache, "topo_generate_floor"))
    add(timed(RECIPE, StaticCache, "sdpa"))
    for merge in merges:
        suffix = ONE_LAUNCH if merge == "kernel" else ""
        if dense:
            name = tat.register(selector="dense", block_size=bs, name="topo_generate_dense", decode_merge=merge)
            add(timed(KIT_DENSE + suffix, TopoStaticCache, name))
        for selector in selectors:
            name = tat.register(selector=selector, block_size=bs, sinks=case.sinks, window=case.window,
                                budget=budget, name=f"topo_generate_{selector}", decode_merge=merge)
            add(timed(f"kit {selector} static cache compiled{suffix}", TopoStaticCache, name, (bs,), budget,
                      selector))
    for row in rows:
        row.pop("tokens")
        row.pop("logits")
    return rows


def generate_markdown(rows: list[dict]) -> str:
    """The markdown table of ``rows`` (from :func:`run_generate_case`, or read back from a result file); a missing
    value (a row read from a run's log has its time only) shows as an empty cell."""
    lines = markdown_header(GENERATE_COLUMNS, left=2)
    for r in rows:
        match = r.get("tokens_match")
        match = "" if match is None else ("yes" if match else "NO")
        same = r.get("matching_tokens")
        same = "" if same is None else f"{same:.0f} / {r['new_tokens'] + 1:.0f}"
        lines.append(f"| {r['case']} | {r['attention']} | {shown(r.get('budget_tokens'), '.0f')} | "
                     f"{shown(r['ms_per_token'], '.2f')} | {shown(r['attention_ms'], '.2f')} | "
                     f"{shown(r['vs_recipe'], '.2f', 'x')} | {shown(r.get('floor_ms'), '.2f')} | "
                     f"{shown(r.get('vs_floor'), '.1f', 'x')} | {match} | {same} | "
                     f"{shown(r.get('first_logit_diff'), '.2e')} |")
    return "\n".join(lines)

