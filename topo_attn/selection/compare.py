"""Comparing selectors: every selector at every budget on one input (:func:`compare_selectors`), and what
the rows say (:func:`verdict`)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ..cli import progress_enabled
from .metrics import DEFAULT_CHUNK, block_attention_mass, full_attention, schedule_quality
from .selectors import SELECTORS, TOPOLOGY_AWARE, schedule_from_scores, select


def compare_selectors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int, budgets: Sequence[int],
                      selectors: Sequence[str] | None = None, sinks: int = 1, window: int = 1,
                      per_lane: bool = False, chunk: int = DEFAULT_CHUNK, progress: bool | str | None = True,
                      **options) -> list[dict]:
    """Every selector at every budget on one input; full attention is computed once (and the oracle's block
    mass once for all budgets).

    Arguments:
        q, k, v: as for :func:`~topo_attn.selection.metrics.schedule_quality` (``[S, D]``, or ``[B, H, S, D]``
            and ``[B, H_kv, S, D]``).
        block_size: tokens per block, ``>= 1``.
        budgets: extra blocks per query block, ints ``>= 0``.
        selectors: names from :data:`~topo_attn.selection.selectors.SELECTORS` (all of them, in that order,
            when None).
        sinks, window: ints ``>= 0``, the same for every selector.
        per_lane: one row per lane instead of lane means.
        chunk: query rows per reference call, ``>= 1``.
        progress: a tqdm bar on stderr over the (selector, budget) pairs, naming the one that runs and cleared
            when all are done (stdout is left alone); a string is the bar's description; False shows none;
            None shows one only when stderr is a terminal (:func:`topo_attn.cli.progress_enabled`).
        options: passed to :func:`~topo_attn.selection.selectors.select` (``seed``, ``clusters``, ``scale``).

    Returns:
        A list of dicts, budget-major then in selector order: ``selector``, ``budget``, ``blocks_per_row`` and
        the metrics ``recall``, ``recall_min``, ``rel_l2``, ``cos_err``, ``lse_err`` (lane means, and the lowest
        ``recall_min``); with ``per_lane`` one dict per lane, with ``lane`` (``b * H + h``), ``b`` and ``h``.

    Raises:
        ValueError, TypeError: as :func:`~topo_attn.selection.selectors.select` and
        :func:`~topo_attn.selection.metrics.schedule_quality`; TypeError for a ``progress`` that is neither a
        bool, a string nor None.
    """
    if progress is not None and not isinstance(progress, (bool, str)):
        raise TypeError(f"progress must be a bool or a string (the bar's description), or None (a bar when stderr "
                        f"is a terminal), got {progress!r}")
    from tqdm import tqdm

    selectors = list(SELECTORS) if selectors is None else list(selectors)
    pairs = [(budget, name) for budget in budgets for name in selectors]
    description = "compare_selectors" if progress is True or progress is None else progress or None
    rows = []
    with tqdm(total=len(pairs), desc=description, unit="selector", file=sys.stderr, leave=False,
              disable=not progress_enabled(None if progress is None else progress is not False)) as bar:
        bar.set_postfix_str("full attention (the reference)")
        reference = full_attention(q, k, v, block_size, options.get("scale"), chunk)
        mass = None
        heads = 1 if q.ndim == 2 else q.shape[1]
        for budget, name in pairs:
            bar.set_postfix_str(f"{name}, budget {budget}")
            if name == "oracle":  # the block mass does not depend on the budget: compute it once
                if mass is None:
                    mass = block_attention_mass(q, k, block_size, options.get("scale"), chunk)
                schedule = schedule_from_scores(mass, block_size, q.shape[-2], sinks, window, budget)
            else:
                schedule = select(name, q, k, block_size, sinks, window, budget, **options)
            m = schedule_quality(q, k, v, schedule, options.get("scale"), reference, chunk)
            if per_lane:
                for lane in range(m.recall.numel()):
                    rows.append({"selector": name, "budget": budget, "lane": lane,
                                 "b": lane // heads, "h": lane % heads,
                                 "blocks_per_row": m.blocks_per_row, "recall": float(m.recall[lane]),
                                 "recall_min": float(m.recall_min[lane]), "rel_l2": float(m.rel_l2[lane]),
                                 "cos_err": float(m.cos_err[lane]), "lse_err": float(m.lse_err[lane])})
            else:
                rows.append({"selector": name, "budget": budget, **m.summary()})
            bar.update()
    return rows


def verdict(rows: Sequence[Mapping], budget: int) -> str:
    """Plain sentences on :func:`compare_selectors` rows at ``budget``: which selector wins, by how much, and
    the best topology-aware selector's recall as a fraction of the oracle's.

    Arguments:
        rows: mappings with ``selector``, ``budget``, ``recall`` and ``blocks_per_row`` (aggregated or per
            lane; several rows of one selector are averaged).
        budget: the budget to report on.

    Returns:
        Lines of text joined by newlines.

    Raises:
        ValueError: no row has this budget.
    """
    recall: dict[str, list[float]] = {}
    blocks: dict[str, float] = {}
    for r in rows:
        if int(r["budget"]) == budget:
            recall.setdefault(r["selector"], []).append(float(r["recall"]))
            blocks[r["selector"]] = float(r["blocks_per_row"])
    if not recall:
        raise ValueError(f"no rows at budget {budget}")
    mean = {name: float(np.mean(v)) for name, v in recall.items()}
    ranked = sorted((n for n in mean if n != "oracle"), key=lambda n: -mean[n])
    lines = [f"budget {budget} extra blocks per query block ({blocks.get(ranked[0], float('nan')):.2f} blocks "
             f"per row visited, sinks and window included):"]
    if len(ranked) > 1:
        best, second = ranked[0], ranked[1]
        gap = mean[best] - mean[second]
        lines.append(f"  winner (without the oracle): {best}, recall {mean[best]:.4f}, ahead of {second} "
                     f"({mean[second]:.4f}) by {gap:+.4f}" + (" (a tie to 4 decimals)" if gap < 5e-5 else ""))
    if "oracle" in mean:
        lines.append(f"  oracle recall {mean['oracle']:.4f}; " + ", ".join(
            f"{n} {mean[n] / mean['oracle']:.3f}" for n in ranked) + " of it")
        topo = [n for n in ranked if n in TOPOLOGY_AWARE]
        if topo:
            t = topo[0]
            closes = "closes" if mean[t] >= 0.98 * mean["oracle"] else "does not close"
            lines.append(f"  best topology-aware selector: {t}, recall {mean[t]:.4f} = "
                         f"{mean[t] / mean['oracle']:.3f} of the oracle's ({closes} the gap to 0.98)")
    return "\n".join(lines)
