"""What ``topology``'s kept salience (:mod:`.kept_salience`) costs at a decode step over a static cache, next to
the exact prefix salience: in chosen blocks and attention mass, step by step over a long decode, and in host time.
``python -m topo_attn.selection.static_quality`` writes ``data/benchmarks/static_topology_quality_cpu.json``;
:func:`static_topology_quality` returns the same from a notebook.

:func:`decode_quality` decodes given queries and keys one token at a time from the first, as the static-cache
integration does (:meth:`~topo_attn.selection.static_step.StaticBlockStats.update` of the step's key, then the
step's table; a prefill of any length leaves the same kept salience). At every step that has a candidate it
compares the ``budget`` blocks that three rules choose among the candidates:

- ``exact``: what :func:`~topo_attn.selection.incremental.select_for_queries` chooses, #22's salience of the blocks
  before the step's block (recomputed when a block completes);
- ``kept``: what :func:`~topo_attn.selection.static_step.step_block_table` chooses from the salience that
  :class:`~topo_attn.selection.static_step.StaticBlockStats` keeps (float32 by default, as deployed);
- ``nearest``: each block's distance to its nearest older block, never shortened (the natural candidate that the
  kept rule refines), ranked in float64 (:func:`nearest_older_distance`);

and, for scale, ``random`` (the expected mass of a uniform choice of as many candidates) and ``quest`` (its static
step, which reads the query). Per step and key/value head: the *attention mass* of the chosen blocks (the share of
the query's causal softmax on their keys, :func:`query_block_mass`, averaged over the group's query heads), the
*recall* of the exact choice (the share of its blocks also chosen) and the Spearman rank correlation of the kept
(or nearest) and exact saliences over the candidates.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from scipy.stats import rankdata

from .. import cli, samples
from .._checks import check_int
from ..provenance import ROOT, code_version, cpu_model
from ..schedule import num_blocks
from ..topology import block_centroids, block_salience
from .data import load_real_qkv, synthetic_qkv
from .incremental import KeyBlockStats, select_for_queries
from .metrics import DEFAULT_CHUNK
from .static_step import StaticBlockStats, step_block_table
from .topk import ranked_candidates

PROG = "python -m topo_attn.selection.static_quality"
OUT = ROOT / "data" / "benchmarks" / "static_topology_quality_cpu.json"
CHOICES = ("exact", "kept", "nearest", "quest")
"""The choices compared at every step (``random`` is an expectation, not a choice)."""


def query_block_mass(q: torch.Tensor, k: torch.Tensor, block_size: int, scale: float | None = None,
                     chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """Each query's causal attention mass on each key block, averaged over the query heads of each key/value head.

    Arguments:
        q: ``[B, H, S, D]``; k: ``[B, H_kv, S, D]`` with ``H % H_kv == 0``; floating (computed in float64).
        block_size: tokens per block, ``>= 1``; scale: the softmax scale, ``1 / sqrt(D)`` when None.
        chunk: query rows at a time, ``>= 1``.

    Returns:
        float64 ``[B, H_kv, S, n]``: ``[b, h, t, kb]`` the share of query ``t``'s softmax over keys ``0 .. t`` that
        falls on block ``kb`` (a row sums to 1). Summed over the queries of a block and the group's heads it is
        :func:`~topo_attn.selection.metrics.block_attention_mass`'s row.
    """
    block_size, chunk = check_int("block_size", block_size, 1), check_int("chunk", chunk, 1)
    batch, heads, seq, dim = q.shape
    kv_heads = k.shape[1]
    nb = num_blocks(seq, block_size)
    scale = dim ** -0.5 if scale is None else scale
    grouped = q.detach().to(torch.float64).reshape(batch, kv_heads, heads // kv_heads, seq, dim)
    keys = k.detach().to(torch.float64)[:, :, None]  # [B, H_kv, 1, S, D]
    out = torch.empty(batch, kv_heads, seq, nb, dtype=torch.float64, device=q.device)
    positions = torch.arange(seq, device=q.device)
    for start in range(0, seq, chunk):
        rows = slice(start, min(start + chunk, seq))
        logits = (grouped[..., rows, :] @ keys.transpose(-1, -2)) * scale  # [B, H_kv, G, r, S]
        causal = positions[None, :] <= positions[rows, None]
        probs = torch.softmax(logits.masked_fill(~causal, float("-inf")), -1)
        probs = torch.nn.functional.pad(probs, (0, nb * block_size - seq)).unflatten(-1, (nb, block_size)).sum(-1)
        out[..., rows, :] = probs.mean(2)
    return out


def nearest_older_distance(centroids: torch.Tensor) -> torch.Tensor:
    """The ``nearest`` rule: each block's distance to the nearest block before it (block 0: ``inf``), what the kept
    rule gives a block when it completes, without the later shortening. centroids ``[..., n, D]`` -> float64
    ``[..., n]``."""
    c = centroids.to(torch.float64)
    dist = torch.cdist(c, c, compute_mode="donot_use_mm_for_euclid_dist")
    n = c.shape[-2]
    later = torch.arange(n, device=c.device)[None, :] >= torch.arange(n, device=c.device)[:, None]
    return dist.masked_fill(later, float("inf")).amin(-1)


def _spearman(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman's rank correlation of each row of ``a`` and ``b`` ``[L, c]`` (average ranks for ties); NaN for a
    row whose ranks are constant."""
    ra, rb = (rankdata(x, axis=-1) for x in (a, b))
    ra, rb = ra - ra.mean(-1, keepdims=True), rb - rb.mean(-1, keepdims=True)
    den = np.sqrt((ra ** 2).sum(-1) * (rb ** 2).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (ra * rb).sum(-1) / np.where(den > 0, den, 1), np.nan)


def _mass_of(mass: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """The mass ``[L]`` of the blocks ``chosen [L, w]`` (``-1``: none) in each lane's row ``mass [L, n]``."""
    return (mass.gather(1, chosen.clamp(min=0)) * (chosen >= 0)).sum(-1)


def _overlap(chosen: torch.Tensor, wanted: torch.Tensor) -> torch.Tensor:
    """How many of each lane's ``wanted [L, w]`` blocks ``chosen [L, w']`` holds (``-1`` entries never count)."""
    return ((chosen[:, :, None] == wanted[:, None, :]) & (wanted[:, None, :] >= 0)).any(1).sum(-1)


def decode_quality(q: torch.Tensor, k: torch.Tensor, block_size: int, budgets: Sequence[int] = (2, 4, 8),
                   sinks: int = 1, window: int = 1, dtype: torch.dtype = torch.float32,
                   chunk: int = DEFAULT_CHUNK) -> list[dict]:
    """The comparison of the module docstring over one decode of ``q`` against ``k``.

    Arguments:
        q: ``[B, H, S, D]``, the query of each step; k: ``[B, H_kv, S, D]`` (the static cache, filled one key per
            step); floating, on the CPU; ``H % H_kv == 0``.
        block_size: tokens per block, ``>= 1``. budgets: ints ``>= 1``. sinks, window: ints ``>= 0``.
        dtype: the statistics' dtype (float32 as deployed, or float64).
        chunk: query rows at a time for the attention mass.

    Returns:
        One dict per budget: the sizes (``lanes`` ``= B * H_kv``, ``seq_len``, ``blocks``, ``steps``: the steps
        with a candidate, per lane), ``mass_base`` (the sinks, window and own block, the same for every choice)
        and ``mass_<choice>`` for :data:`CHOICES` and ``random`` (the mean over steps and lanes of the share of the
        query's attention on the budget's blocks), ``<kept|nearest>_over_exact`` (mass ratios),
        ``<kept|nearest>_share_of_gain`` (``(mass - random) / (exact - random)``: the share of the exact
        choice's gain over random blocks that is kept), ``recall_<kept|nearest>`` and
        ``spearman_<kept|nearest>`` (means over the steps and lanes where they are defined: at least 3
        candidates, ranks not constant).

    Raises:
        ValueError, TypeError: shapes or sizes that do not fit.
    """
    if q.ndim != 4 or k.ndim != 4 or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:] or \
            q.shape[1] % k.shape[1]:
        raise ValueError(f"q and k must be [B, H, S, D] and [B, H_kv, S, D] with H a multiple of H_kv, got "
                         f"{tuple(q.shape)} and {tuple(k.shape)}")
    block_size = check_int("block_size", block_size, 1)
    sinks, window = check_int("sinks", sinks), check_int("window", window)
    budgets = [check_int("budget", budget, 1) for budget in budgets]
    batch, kv_heads, seq, _ = k.shape
    lanes, nb, base = batch * kv_heads, num_blocks(seq, block_size), sinks + window + 1
    mass = query_block_mass(q, k, block_size, chunk=chunk).reshape(lanes, seq, nb)
    nearest = nearest_older_distance(block_centroids(k, block_size)).reshape(lanes, nb)
    stats = StaticBlockStats.for_cache(k, block_size, dtype, salience=True)
    exact_stats = KeyBlockStats(block_size)
    sums = {budget: dict.fromkeys([*(f"mass_{c}" for c in (*CHOICES, "random")), "mass_base", "recall_kept",
                                   "recall_nearest"], 0.0) for budget in budgets}
    ranks = {"spearman_kept": [], "spearman_nearest": []}
    steps, exact, exact_block = 0, {}, -1
    for t in range(seq):
        stats.update(k, torch.tensor(t), 1)
        qb, end = t // block_size, t // block_size - window  # candidates sinks .. end - 1
        if end <= sinks:
            continue
        steps += 1
        q_t, length = q[..., t:t + 1, :], torch.tensor(t + 1)
        if qb != exact_block:  # the exact choice changes only with the step's block
            exact_block = qb
            for budget in budgets:
                schedule = select_for_queries("topology", q_t, k[..., :t + 1, :], block_size, sinks, window,
                                              budget, exact_stats)
                rows = schedule.indices.reshape(lanes, -1)
                exact[budget] = rows[(rows >= sinks) & (rows < end)].reshape(lanes, -1)
            exact_salience = exact_stats.salience(qb).reshape(lanes, qb)[:, sinks:end].numpy()
        row_mass = mass[:, t]  # [L, n]
        candidates = row_mass[:, sinks:end]
        kept_salience = stats.salience.reshape(lanes, nb)[:, sinks:end].to(torch.float64)
        if end - sinks >= 3:
            for key, salience in (("spearman_kept", kept_salience), ("spearman_nearest", nearest[:, sinks:end])):
                rho = _spearman(salience.numpy(), exact_salience)
                ranks[key].extend(rho[np.isfinite(rho)].tolist())
        for budget in budgets:
            take = min(budget, end - sinks)
            kept = step_block_table("topology", q_t, stats, length, sinks, window, budget)
            quest = step_block_table("quest", q_t, stats, length, sinks, window, budget)
            order = torch.sort(nearest[:, sinks:end], dim=-1, descending=True, stable=True).indices[:, :take]
            chosen = {"exact": exact[budget], "kept": kept.reshape(lanes, -1)[:, base:],
                      "nearest": order + sinks, "quest": quest.reshape(lanes, -1)[:, base:]}
            row = sums[budget]
            row["mass_base"] += float(_mass_of(row_mass, kept.reshape(lanes, -1)[:, :base]).sum())
            for name, blocks in chosen.items():
                row[f"mass_{name}"] += float(_mass_of(row_mass, blocks).sum())
            row["mass_random"] += float(candidates.sum()) * take / (end - sinks)
            for name in ("kept", "nearest"):
                row[f"recall_{name}"] += float(_overlap(chosen[name], exact[budget]).sum()) / take
    rows = []
    for budget in budgets:
        row = {key: value / max(steps * lanes, 1) for key, value in sums[budget].items()}
        for name in ("kept", "nearest"):
            row[f"{name}_over_exact"] = row[f"mass_{name}"] / row["mass_exact"]
            gain = row["mass_exact"] - row["mass_random"]
            row[f"{name}_share_of_gain"] = (row[f"mass_{name}"] - row["mass_random"]) / gain if gain else None
        row.update({key: float(np.mean(values)) if values else None for key, values in ranks.items()})
        rows.append(dict(lanes=lanes, seq_len=seq, block_size=block_size, blocks=nb, sinks=sinks, window=window,
                         budget=budget, stats_dtype=str(dtype).removeprefix("torch."), steps=steps, **row))
    return rows


def time_step_selection(blocks: Sequence[int] = (256, 1024, 4096), block_size: int = 16, head_dim: int = 64,
                        budget: int = 8, repeats: int = 5, seed: int = 0) -> list[dict]:
    """Host times (ms, medians of ``repeats`` after one warm-up; indicative only: eager torch on this CPU) of a
    decode step's selection at a cache of ``blocks`` blocks, at the step that completes the last block
    (a fixed-shape step does the same work at every step):

    - ``update_ms`` / ``update_salience_ms``: :meth:`StaticBlockStats.update` of one key without and with the
      kept salience;
    - ``topology_table_ms``: ``step_block_table("topology")`` from the kept salience (the ranking only);
    - ``kept_step_ms``: both (update with the salience, then the table), the whole kept step;
    - ``quest_step_ms``: the same for ``quest`` (its statistics without a salience), for scale;
    - ``recompute_ms``: what the exact path does instead when a block completes, :func:`~topo_attn.block_salience`
      of the prefix's float64 centroids (numpy on the CPU) and the ranking; ``recompute_per_step_ms`` is that
      over ``block_size`` steps, its share of a step where it runs once per completed block, outside a
      fixed-shape step.

    One key/value head, float32 statistics, Gaussian keys; one sink, a window of one.
    """
    rows = []
    gen = torch.Generator().manual_seed(seed)
    for nb in blocks:
        nb = check_int("blocks", nb, 2)
        seq = nb * block_size
        keys = torch.randn(1, 1, seq, head_dim, generator=gen)
        q = torch.randn(1, 1, 1, head_dim, generator=gen)
        kept = StaticBlockStats.for_cache(keys, block_size, salience=True).update(keys, torch.tensor(0), seq - 1)
        plain = StaticBlockStats.for_cache(keys, block_size).update(keys, torch.tensor(0), seq - 1)
        start, length = torch.tensor(seq - 1), torch.tensor(seq)
        prefix = plain.centroids[:, :, :nb - 1].to(torch.float64)
        candidates = torch.zeros(nb - 1, dtype=torch.bool)
        candidates[1:nb - 2] = True

        def recompute():
            return ranked_candidates(block_salience(prefix, check=False), candidates, min(budget, nb - 1))

        calls = {
            "update_ms": lambda: plain.update(keys, start, 1),
            "update_salience_ms": lambda: kept.update(keys, start, 1),
            "topology_table_ms": lambda: step_block_table("topology", q, kept, length, 1, 1, budget),
            "kept_step_ms": lambda: step_block_table("topology", q, kept.update(keys, start, 1), length, 1, 1,
                                                     budget),
            "quest_step_ms": lambda: step_block_table("quest", q, plain.update(keys, start, 1), length, 1, 1,
                                                      budget),
            "recompute_ms": recompute,
        }
        row = dict(blocks=nb, block_size=block_size, seq_len=seq, head_dim=head_dim, budget=budget)
        for name, call in calls.items():
            call()
            times = []
            for _ in range(repeats):
                began = time.perf_counter()
                call()
                times.append(1e3 * (time.perf_counter() - began))
            row[name] = statistics.median(times)
        row["recompute_per_step_ms"] = row["recompute_ms"] / block_size
        rows.append(row)
    return rows


def synthetic_case(seq_len: int, dim: int, block_size: int, seed: int, clusters: int = 4,
                   outlier_blocks: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, k)`` ``[1, 1, S, D]``: :func:`~topo_attn.selection.data.synthetic_qkv` (sharpness 0.5) of
    :func:`topo_attn.samples.clustered_keys`."""
    keys = samples.clustered_keys(seq_len, dim, block_size=block_size, clusters=clusters,
                                  outlier_blocks=outlier_blocks, seed=seed)
    q, k, _ = synthetic_qkv(keys, block_size, seed=seed, sharpness=0.5)
    return q[None, None], k[None, None]


def summary(rows: Sequence[dict]) -> list[dict]:
    """Means over the seeds of each data set, per budget: ``data``, ``budget``, ``runs`` and the means of the
    rows' masses, ratios, recalls and correlations."""
    keys = [key for key in rows[0] if key.startswith(("mass_", "kept_", "nearest_", "recall_", "spearman_"))]
    groups: dict[tuple[str, int], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["data"], row["budget"]), []).append(row)
    return [dict(data=data, budget=budget, runs=len(group),
                 **{key: float(np.mean([r[key] for r in group])) for key in keys})
            for (data, budget), group in groups.items()]


def markdown(summary_rows: Sequence[dict]) -> str:
    """The summary as a markdown table: per data set and budget, the budget blocks' attention mass under each
    choice, the kept choice's mass over the exact one's and its share of the exact gain over random, its recall
    and rank correlation (the nearest rule's beside them)."""
    lines = ["| data | budget | exact | kept | nearest | random | quest | kept / exact | kept share of gain | "
             "nearest / exact | recall kept | recall nearest | Spearman kept | Spearman nearest |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in summary_rows:
        lines.append(f"| {r['data']} | {r['budget']} | {r['mass_exact']:.4f} | {r['mass_kept']:.4f} | "
                     f"{r['mass_nearest']:.4f} | {r['mass_random']:.4f} | {r['mass_quest']:.4f} | "
                     f"{r['kept_over_exact']:.3f} | {r['kept_share_of_gain']:.2f} | {r['nearest_over_exact']:.3f} | "
                     f"{r['recall_kept']:.2f} | {r['recall_nearest']:.2f} | {r['spearman_kept']:.2f} | "
                     f"{r['spearman_nearest']:.2f} |")
    return "\n".join(lines)


def static_topology_quality(budgets: Sequence[int] = (2, 4, 8), seeds: Sequence[int] = (0, 1, 2, 3),
                            seq_len: int = 8192, dim: int = 32, block_size: int = 16, sinks: int = 1,
                            window: int = 1, timing_blocks: Sequence[int] = (256, 1024, 4096), repeats: int = 20,
                            progress: bool = False) -> dict:
    """The whole study: :func:`decode_quality` on the captured real q, k (:func:`~topo_attn.selection.data.
    load_real_qkv`, layers as the batch) and on :func:`synthetic_case` for each seed, then
    :func:`time_step_selection` (none when ``timing_blocks`` is empty). Returns ``{"settings", "quality",
    "summary", "table", "timing"}`` (``quality``: the rows of :func:`decode_quality`, with ``data`` and ``seed``;
    not ``rows``, the benchmark runner's key, so that ``topo_attn.bench.results`` leaves the file to this
    module)."""
    rows = []

    def note(text: str) -> None:
        if progress:
            print(f"  {text}", file=sys.stderr, flush=True)

    q, k, _, info = load_real_qkv()
    began = time.perf_counter()
    for row in decode_quality(q, k, block_size, budgets, sinks, window):
        rows.append(dict(data=f"real {info['model'].rsplit('/', 1)[-1]} layers {info['layers']}", seed=None, **row))
    note(f"real: {time.perf_counter() - began:.0f} s")
    for seed in seeds:
        began = time.perf_counter()
        q, k = synthetic_case(seq_len, dim, block_size, seed)
        for row in decode_quality(q, k, block_size, budgets, sinks, window):
            rows.append(dict(data="synthetic clustered", seed=seed, **row))
        note(f"synthetic seed {seed}: {time.perf_counter() - began:.0f} s")
    means = summary(rows)
    timing = time_step_selection(timing_blocks, block_size, repeats=repeats) if timing_blocks else []
    settings = dict(budgets=list(budgets), seeds=list(seeds), synthetic_seq_len=seq_len, synthetic_dim=dim,
                    synthetic_clusters=4, synthetic_outlier_blocks=4, synthetic_sharpness=0.5,
                    block_size=block_size, sinks=sinks, window=window, real_qkv=info,
                    timing_blocks=list(timing_blocks), repeats=repeats)
    return dict(settings=settings, quality=rows, summary=means, table=markdown(means), timing=timing)


def build_parser() -> argparse.ArgumentParser:
    """The study's command line."""
    parser = cli.ArgumentParser(prog=PROG, description="What topology's kept salience costs at a static decode "
                                "step against the exact prefix salience (quality, and host time).")
    parser.add_argument("--budgets", type=int, nargs="+", default=[2, 4, 8], help="extra blocks per step (>= 1)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3], help="synthetic key sets")
    parser.add_argument("--seq-len", type=int, default=8192, help="tokens of a synthetic decode")
    parser.add_argument("--dim", type=int, default=32, help="head dimension of the synthetic keys")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--sinks", type=int, default=1)
    parser.add_argument("--window", type=int, default=1)
    parser.add_argument("--timing-blocks", type=int, nargs="*", default=[256, 1024, 4096],
                        help="cache sizes in blocks for the host timing (none: no timing)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per measurement")
    parser.add_argument("--out", default=str(OUT), help="the JSON file to write")
    cli.add_progress_argument(parser)
    cli.add_debug_argument(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the study, print its table and the timing, write the JSON file. Returns 0."""
    args = build_parser().parse_args(argv)
    cli.check_at_least("--budgets", args.budgets, 1, "budget")
    cli.check_at_least("--seq-len", args.seq_len, 1)
    cli.check_at_least("--dim", args.dim, 1)
    cli.check_at_least("--block-size", args.block_size, 1)
    cli.check_at_least("--sinks", args.sinks, 0)
    cli.check_at_least("--window", args.window, 0)
    cli.check_at_least("--timing-blocks", args.timing_blocks, 2, "blocks")
    cli.check_at_least("--repeats", args.repeats, 1)
    result = static_topology_quality(args.budgets, args.seeds, args.seq_len, args.dim, args.block_size, args.sinks,
                                     args.window, args.timing_blocks, args.repeats,
                                     cli.progress_enabled(args.progress))
    shown = [a for a in (sys.argv[1:] if argv is None else argv) if a not in ("--progress", "--no-progress")]
    header = dict(command=" ".join([PROG, *map(shlex.quote, shown)]), date=datetime.date.today().isoformat(),
                  **code_version(), python=platform.python_version(), torch=torch.__version__,
                  numpy=np.__version__, cpu=cpu_model(), cpu_cores=len(os.sched_getaffinity(0)),
                  torch_threads=torch.get_num_threads())
    print(result["table"])
    for row in result["timing"]:
        print(f"{row['blocks']} blocks: kept step {row['kept_step_ms']:.3f} ms (update with salience "
              f"{row['update_salience_ms']:.3f}, without {row['update_ms']:.3f}; table {row['topology_table_ms']:.3f}),"
              f" quest step {row['quest_step_ms']:.3f}, recompute {row['recompute_ms']:.2f} ms per completed block")
    Path(args.out).write_text(json.dumps({**header, **result}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main, prog=PROG))
