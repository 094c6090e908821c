"""Figures of the language-model study, ``python -m topo_attn.lm evaluate`` (matplotlib is imported here only).

Each function takes one section of the study's results (the JSON's ``perplexity``, ``retrieval``, ``recall`` or
``speed`` rows: a list of dicts, or a pandas DataFrame of them such as
:func:`topo_attn.lm.results.lm_quality_tables` gives; or the ``rows`` of the retrieval suite,
``python -m topo_attn.lm retrieval``, and of KV-cache eviction, ``python -m topo_attn.lm eviction``) and returns a
new figure. A configuration is an
``attention`` name and a ``budget`` (extra key blocks per query block): ``sdpa`` and the kit's ``dense`` have no
budget and are drawn as references, ``window`` has budget 0 and is drawn as a point, every other name is a
selector drawn through its budgets. Names the figures do not know (a selector added later) get a colour of
their own, the same in every figure.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator, PercentFormatter

from .figures import METHOD_STYLES, SELECTOR_STYLES

REFERENCES = ("sdpa", "dense")
"""Configurations without a budget: every causal block (SDPA, and the kit's kernel with the dense schedule)."""
REFERENCE_STYLES = {"sdpa": ("SDPA (dense causal)", "0.15", "-"), "dense": ("kit, dense schedule", "0.55", "--")}
"""``(label, colour, linestyle)`` of the references (greys: the selectors' colours stay unambiguous)."""
FALLBACK_COLORS = ("#17becf", "#9467bd", "#e377c2", "#2ca02c", "#ff7f0e", "#1f77b4", "#bc80bd", "#8dd3c7")
FALLBACK_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "h")
BITS_LABEL = "bits per byte (lower is better)"
DENSE_GATE = 0.9
"""The accuracy ``dense`` must reach on every task and distance of the retrieval suite before selectors are compared
(:data:`topo_attn.lm.retrieval_runner.DENSE_THRESHOLD`; a test keeps the two equal)."""
GATE_STYLE = dict(color="#d62728", ls=":", lw=1.2)
POLICY_STYLE_OF = {"salience": "topology"}
"""Eviction policies drawn in a selector's style: elder-rule salience is topology's ranking."""
RETRIEVAL_SUITE_KEYS = ("task", "distance", "attention", "accuracy", "ci_low", "ci_high")
EVICTION_KEYS = ("policy", "cache_fraction", "bits_per_byte", "retrieval")
VISITED_LABEL = "visited fraction of the causal blocks"


def selector_style(name: str) -> tuple[str, str, str]:
    """``(colour, marker, linestyle)`` of a selector: :data:`~topo_attn.viz.SELECTOR_STYLES`' entry, else one
    derived from the name (stable across figures and runs)."""
    if name in SELECTOR_STYLES:
        return SELECTOR_STYLES[name]
    code = zlib.crc32(name.encode())
    return (FALLBACK_COLORS[code % len(FALLBACK_COLORS)],
            FALLBACK_MARKERS[(code // len(FALLBACK_COLORS)) % len(FALLBACK_MARKERS)], "-.")


def _records(rows: Sequence[Mapping] | object, section: str) -> list[dict]:
    records = rows.to_dict("records") if hasattr(rows, "to_dict") else [dict(r) for r in rows]
    if not records:
        raise ValueError(f"{section} rows are empty: nothing to plot")
    return records


def _check_keys(records: list[dict], keys: Sequence[str], section: str) -> None:
    """``ValueError`` naming ``rows`` for the first of ``records`` that lacks one of ``keys``."""
    for i, record in enumerate(records):
        missing = [k for k in keys if k not in record]
        if missing:
            raise ValueError(f"rows: {section} row {i} lacks {missing}; expected keys {list(keys)}")


def _budget(row: Mapping) -> int | None:
    """The row's budget; None for sdpa and dense (also NaN or ``pd.NA``, as pandas stores a missing budget)."""
    value = row.get("budget")
    if value is None or type(value).__name__ == "NAType" or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(value)


def _bits(row: Mapping) -> dict[str, float]:
    """Bits per byte by bucket (``all`` first): the row's ``bits_per_byte`` dict, or its ``bpb_*`` columns (a
    flattened table)."""
    if isinstance(row.get("bits_per_byte"), Mapping):
        return {k: float(v) for k, v in row["bits_per_byte"].items()}
    return {k[4:]: float(v) for k, v in row.items() if k.startswith("bpb_") and v is not None
            and not (isinstance(v, float) and math.isnan(v))}


def _recall(row: Mapping) -> float:
    """Mean recall over the query heads: of the row's ``recall`` list, or its ``recall_mean``."""
    value = row.get("recall")
    if isinstance(value, (list, tuple, np.ndarray)):
        return float(np.mean(value))
    return float(row["recall_mean"] if "recall_mean" in row else value)


def _names(records: list[dict]) -> list[str]:
    return list(dict.fromkeys(str(r["attention"]) for r in records))


def _selectors(records: list[dict]) -> list[str]:
    """The names with budgets (window included), in the rows' order."""
    return [n for n in _names(records) if n not in REFERENCES]


def _at_budget(records: list[dict], name: str, budget: int) -> list[dict]:
    """The rows of ``name`` at ``budget``: its budget-0 rows for ``window``, its own for sdpa and dense."""
    if name in REFERENCES:
        return [r for r in records if r["attention"] == name]
    want = 0 if name == "window" else budget
    return [r for r in records if r["attention"] == name and _budget(r) == want]


def _check_budget(records: list[dict], budget: int, section: str) -> None:
    budgets = sorted({b for r in records if (b := _budget(r)) not in (None, 0)})
    if budgets and budget not in budgets:
        raise ValueError(f"budget {budget} is not among the {section} rows' budgets {budgets}")


def _style_of(name: str) -> tuple[str, str, str, str]:
    """``(label, colour, marker, linestyle)`` of a configuration name."""
    if name in REFERENCE_STYLES:
        label, color, ls = REFERENCE_STYLES[name]
        return label, color, "s" if name == "sdpa" else "D", ls
    color, marker, ls = selector_style(name)
    return name, color, marker, ls


def _legend(fig: Figure, axes) -> None:
    """One legend for the figure, below the panels (names from every panel, once)."""
    seen: dict[str, object] = {}
    for ax in np.ravel(axes):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncols=min(len(seen), 5), fontsize=8)


# ------------------------------------------------------------------------------------------------ Pareto
def plot_lm_pareto(rows: Sequence[Mapping] | object, buckets: Sequence[str] | None = None,
                   title: str | None = None) -> Figure:
    """Quality against cost: per panel, bits per byte of one position bucket (default: the last bucket, where
    the context is longest, and ``all``) against the visited fraction of the causal blocks; one line per selector
    through its budgets, ``window`` as a point, ``sdpa`` and ``dense`` as horizontal lines. ``rows``: the
    study's ``perplexity`` rows."""
    records = _records(rows, "perplexity")
    known = list(_bits(records[0]))
    if buckets is None:
        late = [b for b in known if b != "all"]
        buckets = ([late[-1]] if late else []) + ["all"]
    missing = [b for b in buckets if b not in known]
    if missing:
        raise ValueError(f"buckets {missing} are not in the rows' bits per byte {known}")
    fig, axes = plt.subplots(1, len(buckets), figsize=(5.4 * len(buckets), 4.4), squeeze=False,
                             layout="constrained")
    for ax, bucket in zip(axes[0], buckets):
        for name in REFERENCES:
            at = [r for r in records if r["attention"] == name]
            if at:
                label, color, _, ls = _style_of(name)
                ax.axhline(_bits(at[0])[bucket], color=color, ls=ls, lw=1.3, label=label)
        for name in _selectors(records):
            sel = sorted((r for r in records if r["attention"] == name),
                         key=lambda r: (float(r["visited_fraction"]), _budget(r) or 0))
            label, color, marker, ls = _style_of(name)
            x = [float(r["visited_fraction"]) for r in sel]
            y = [_bits(r)[bucket] for r in sel]
            if name == "window" or len(sel) == 1:
                ax.plot(x, y, color=color, marker=marker, ls="none", markersize=9, label=label)
            else:
                ax.plot(x, y, color=color, marker=marker, ls=ls, label=label)
        ax.xaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_xlabel(VISITED_LABEL)
        ax.set_ylabel(BITS_LABEL)
        ax.set_title(f"bytes at positions {bucket}" if bucket != "all" else "all positions", fontsize=10)
        ax.grid(True, alpha=0.3)
    _legend(fig, axes)
    fig.suptitle(title or "Bits per byte against the visited fraction (each point a budget)", fontsize=10)
    return fig


# ------------------------------------------------------------------------------------- loss by position
def plot_lm_positions(rows: Sequence[Mapping] | object, budget: int, title: str | None = None) -> Figure:
    """Loss by position bucket at one ``budget``: bits per byte per bucket (left) and its excess over ``sdpa``
    (right, when sdpa is among the rows), one line per configuration (``window`` at budget 0, sdpa and dense
    without a budget). ``rows``: the study's ``perplexity`` rows. Raises ``ValueError`` for a budget the rows
    do not have."""
    records = _records(rows, "perplexity")
    _check_budget(records, budget, "perplexity")
    buckets = [b for b in _bits(records[0]) if b != "all"]
    sdpa = [r for r in records if r["attention"] == "sdpa"]
    panels = 2 if sdpa else 1
    fig, axes = plt.subplots(1, panels, figsize=(5.4 * panels, 4.2), squeeze=False, layout="constrained")
    x = np.arange(len(buckets))
    for name in _names(records):
        at = _at_budget(records, name, budget)
        if not at:
            continue
        label, color, marker, ls = _style_of(name)
        y = np.array([_bits(at[0]).get(b, np.nan) for b in buckets])
        axes[0][0].plot(x, y, color=color, marker=marker, ls=ls, label=label)
        if sdpa and name != "sdpa":
            reference = np.array([_bits(sdpa[0]).get(b, np.nan) for b in buckets])
            axes[0][1].plot(x, y - reference, color=color, marker=marker, ls=ls, label=label)
    if sdpa:
        axes[0][1].axhline(0.0, color=REFERENCE_STYLES["sdpa"][1], lw=1.3, label=REFERENCE_STYLES["sdpa"][0])
        axes[0][1].set_ylabel("bits per byte above SDPA")
    axes[0][0].set_ylabel(BITS_LABEL)
    for ax in axes[0]:
        ax.set_xticks(x, buckets)
        ax.set_xlabel("position of the predicted byte")
        ax.grid(True, alpha=0.3)
    _legend(fig, axes)
    fig.suptitle(title or f"Loss by position at budget {budget} (window: its sinks and window only)", fontsize=10)
    return fig


def _distance_axis(ax, distances: Sequence[int], label: str) -> None:
    """A log2 x axis with a tick at each distance, written ``1k``, ``2k`` ... where a multiple of 1024."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(list(distances)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1024:g}k" if v and v % 1024 == 0 else f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(label)
    ax.grid(True, alpha=0.3)


def _accuracy_axis(ax, label: str) -> None:
    ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel(label)


def _interval(records: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """``(accuracy, [below, above])`` of cells with ``accuracy``, ``ci_low``, ``ci_high``: the error bars."""
    y = np.array([float(r["accuracy"]) for r in records])
    low = np.array([float(r["ci_low"]) for r in records])
    high = np.array([float(r["ci_high"]) for r in records])
    return y, np.vstack([np.clip(y - low, 0, None), np.clip(high - y, 0, None)])


def _dodge(count: int, spread: float) -> np.ndarray:
    """Offsets of ``count`` series side by side, centred on 0, ``spread`` apart (so error bars do not cover each
    other)."""
    return (np.arange(count) - (count - 1) / 2) * spread


# ---------------------------------------------------------------------------------------------- passkey
def plot_lm_retrieval(rows: Sequence[Mapping] | object, budget: int, title: str | None = None) -> Figure:
    """The passkey probe at one ``budget``: exact-match rate (left) and loss on the repeated value's bytes
    (right, nats per byte) against the distance between the two copies, one line per configuration.
    ``rows``: the study's ``retrieval`` rows. Raises ``ValueError`` for a budget the rows do not have."""
    records = _records(rows, "retrieval")
    _check_budget(records, budget, "retrieval")
    fig, (exact_ax, loss_ax) = plt.subplots(1, 2, figsize=(10.8, 4.2), layout="constrained")
    distances = sorted({int(r["distance"]) for r in records})
    for name in _names(records):
        at = sorted(_at_budget(records, name, budget), key=lambda r: int(r["distance"]))
        if not at:
            continue
        label, color, marker, ls = _style_of(name)
        d = [int(r["distance"]) for r in at]
        exact_ax.plot(d, [float(r["exact"]) for r in at], color=color, marker=marker, ls=ls, label=label)
        loss_ax.plot(d, [float(r["loss"]) for r in at], color=color, marker=marker, ls=ls, label=label)
    probes = sorted({int(r["probes"]) for r in records if "probes" in r})
    exact_ax.set_ylabel("exact match" + (f" ({'/'.join(map(str, probes))} probes per distance)" if probes else ""))
    exact_ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    exact_ax.set_ylim(-0.05, 1.05)
    loss_ax.set_ylabel("loss on the copied value (nats per byte)")
    losses = np.array([float(r["loss"]) for r in records])
    if (losses > 0).all() and losses.max() > 20 * losses.min():  # from copied (~0.001) to guessed (~3): log
        loss_ax.set_yscale("log")
        loss_ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    for ax in (exact_ax, loss_ax):
        _distance_axis(ax, distances, "distance between the two copies (bytes)")
    _legend(fig, (exact_ax, loss_ax))
    fig.suptitle(title or f"Passkey retrieval at budget {budget}", fontsize=10)
    return fig


# ------------------------------------------------------------------------------------- retrieval suite
def plot_lm_retrieval_suite(rows: Sequence[Mapping] | object, budget: int | None = None,
                            title: str | None = None) -> Figure:
    """The retrieval suite (``python -m topo_attn.lm retrieval``): one panel per task, exact-match accuracy against
    the distance from the needle to the answer, one line per configuration with its 95% interval (``ci_low`` ..
    ``ci_high``) as error bars, and the dense gate (:data:`DENSE_GATE`, the accuracy ``dense`` must reach) as a
    horizontal line. The lines of one panel are set slightly apart along the distance (a factor within
    ``2 ** +-0.1``) so that their bars stay apart.

    Parameters
    ----------
    rows : the suite's ``rows`` (dicts, or a DataFrame of them), each with ``task``, ``distance``, ``attention``,
        ``budget`` (None for ``sdpa`` and ``dense``), ``accuracy``, ``ci_low``, ``ci_high`` and ``n``.
    budget : draw the selectors at this budget only (``sdpa`` and ``dense`` always); None: every budget of every
        selector is its own line (``quest 6``, ``quest 30``).
    title : the figure's title (default: says the budget and the interval).

    Returns
    -------
    Figure with one axes per task, in the rows' order.

    Raises
    ------
    ValueError: ``rows`` is empty or a row lacks one of :data:`RETRIEVAL_SUITE_KEYS`; ``budget`` is not among the
        rows' budgets.
    """
    records = _records(rows, "retrieval suite")
    _check_keys(records, RETRIEVAL_SUITE_KEYS, "retrieval suite")
    if budget is not None:
        _check_budget(records, budget, "retrieval suite")
    tasks = list(dict.fromkeys(str(r["task"]) for r in records))
    distances = sorted({int(r["distance"]) for r in records})
    budgets = sorted({b for r in records if (b := _budget(r)) is not None})
    if budget is None:
        configs = list(dict.fromkeys((str(r["attention"]), _budget(r)) for r in records))
    else:
        configs = [(name, None if name in REFERENCES else 0 if name == "window" else budget)
                   for name in _names(records) if _at_budget(records, name, budget)]
    columns = min(len(tasks), 3)
    panels = -(-len(tasks) // columns)
    fig, axes = plt.subplots(panels, columns, figsize=(4.6 * columns, 3.6 * panels + 0.8), squeeze=False,
                             sharey=True, layout="constrained")
    for ax in axes.ravel()[len(tasks):]:
        fig.delaxes(ax)
    offsets = 2.0 ** _dodge(len(configs), min(0.2 / max(len(configs) - 1, 1), 0.05))
    for ax, task in zip(axes.ravel(), tasks):
        for (name, at_budget), offset in zip(configs, offsets):
            cells = sorted((r for r in records if str(r["task"]) == task and str(r["attention"]) == name
                            and _budget(r) == at_budget), key=lambda r: int(r["distance"]))
            if not cells:
                continue
            label, color, marker, ls = _style_of(name)
            if budget is None and at_budget is not None:
                label = f"{name} {at_budget}"
                ls = ("-", "--", "-.", ":")[budgets.index(at_budget) % 4]
            y, error = _interval(cells)
            ax.errorbar(np.array([int(r["distance"]) for r in cells]) * offset, y, yerr=error, color=color,
                        marker=marker, ls=ls, capsize=3, markersize=5, lw=1.2, label=label)
        ax.axhline(DENSE_GATE, **GATE_STYLE, label=f"dense gate ({DENSE_GATE:.0%})")
        probes = sorted({int(r["n"]) for r in records if str(r["task"]) == task and "n" in r})
        _accuracy_axis(ax, "exact match" + (f" (n = {'/'.join(map(str, probes))} per cell)" if probes else ""))
        _distance_axis(ax, distances, "distance from the needle to the answer (bytes)")
        ax.set_title(task, fontsize=10)
    _legend(fig, axes.ravel()[:len(tasks)])
    fig.suptitle(title or "Retrieval suite" + (f" at budget {budget}" if budget is not None else "")
                 + ": exact match with its 95% interval", fontsize=10)
    return fig


# ------------------------------------------------------------------------------------------- eviction
def _policy_style(name: str) -> tuple[str, str, str, str]:
    """``(label, colour, marker, linestyle)`` of an eviction policy (``dense``: the kit's dense reference)."""
    if name == "dense":
        return "dense (full cache)", REFERENCE_STYLES["dense"][1], "D", REFERENCE_STYLES["dense"][2]
    color, marker, ls = selector_style(POLICY_STYLE_OF.get(name, name))
    return name, color, marker, ls


def _fraction_text(fraction: float) -> str:
    return f"1/{1 / fraction:g}" if fraction < 1 and (1 / fraction).is_integer() else f"{fraction:g}"


def plot_lm_eviction(rows: Sequence[Mapping] | object, title: str | None = None) -> Figure:
    """KV-cache eviction (``python -m topo_attn.lm eviction``): bits per byte of the continuation per policy
    against the cache fraction it keeps (first panel; ``dense``, the full cache, as a horizontal line), then, when
    the rows have retrieval cells, one panel per cache fraction with each policy's exact-match accuracy per task
    and its 95% interval (``ci_low`` .. ``ci_high``) as error bars, ``dense`` beside them. Per task rather than a
    mean over tasks: the rows hold each task's interval, not one for the mean.

    Parameters
    ----------
    rows : the eviction ``rows`` (dicts, or a DataFrame of them), each with ``policy``, ``cache_fraction``,
        ``bits_per_byte`` and ``retrieval`` (per task a dict with ``accuracy``, ``ci_low``, ``ci_high``; empty for
        a run with ``--no-retrieval``).
    title : the figure's title.

    Returns
    -------
    Figure with ``1 + (number of cache fractions below 1)`` axes, or one axes when no row has retrieval cells.

    Raises
    ------
    ValueError: ``rows`` is empty, a row lacks one of :data:`EVICTION_KEYS`, or a retrieval cell lacks
        ``accuracy``, ``ci_low`` or ``ci_high``.
    """
    records = _records(rows, "eviction")
    _check_keys(records, EVICTION_KEYS, "eviction")
    for i, r in enumerate(records):
        if not isinstance(r["retrieval"], Mapping):
            raise ValueError(f"rows: eviction row {i}'s retrieval is not a dict of tasks, got {r['retrieval']!r}")
        _check_keys([dict(cell, task=task) for task, cell in r["retrieval"].items()],
                    ("task", "accuracy", "ci_low", "ci_high"), f"eviction row {i}'s retrieval")
    dense = [r for r in records if r["policy"] == "dense"]
    policies = list(dict.fromkeys(str(r["policy"]) for r in records if r["policy"] != "dense"))
    fractions = sorted({float(r["cache_fraction"]) for r in records if r["policy"] != "dense"}, reverse=True)
    tasks = list(dict.fromkeys(t for r in records for t in r["retrieval"]))
    shown = fractions if tasks else []
    fig, axes = plt.subplots(1, 1 + len(shown), figsize=(5.4 + 4.8 * len(shown), 4.4), squeeze=False,
                             layout="constrained")
    bits_ax = axes[0][0]
    if dense:
        label, color, _, ls = _policy_style("dense")
        bits_ax.axhline(float(dense[0]["bits_per_byte"]), color=color, ls=ls, lw=1.3, label=label)
    for name in policies:
        at = sorted((r for r in records if r["policy"] == name), key=lambda r: float(r["cache_fraction"]))
        label, color, marker, ls = _policy_style(name)
        bits_ax.plot([float(r["cache_fraction"]) for r in at], [float(r["bits_per_byte"]) for r in at],
                     color=color, marker=marker, ls=ls, label=label)
    if fractions:
        bits_ax.set_xscale("log", base=2)
        bits_ax.xaxis.set_major_locator(FixedLocator(fractions))
        bits_ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _fraction_text(v)))
        bits_ax.xaxis.set_minor_locator(NullLocator())
    bits_ax.set_xlabel("cache kept (fraction of the context's blocks)")
    bits_ax.set_ylabel(BITS_LABEL + ", continuation")
    bits_ax.set_title("perplexity of the continuation", fontsize=10)
    bits_ax.grid(True, alpha=0.3)
    x = np.arange(len(tasks))
    names = (["dense"] if dense else []) + policies
    offsets = _dodge(len(names), 0.8 / max(len(names), 1))
    for ax, fraction in zip(axes[0][1:], shown):
        for name, offset in zip(names, offsets):
            at = dense if name == "dense" else [r for r in records if r["policy"] == name
                                                 and float(r["cache_fraction"]) == fraction]
            cells = [(i, at[0]["retrieval"][t]) for i, t in enumerate(tasks) if at and t in at[0]["retrieval"]]
            if not cells:
                continue
            label, color, marker, _ = _policy_style(name)
            y, error = _interval([c for _, c in cells])
            ax.errorbar(np.array([x[i] for i, _ in cells]) + offset, y, yerr=error, color=color, marker=marker,
                        ls="none", capsize=3, markersize=5, label=label)
        _accuracy_axis(ax, "exact match")
        ax.set_xticks(x, tasks, rotation=20, ha="right", fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
        ax.set_title(f"retrieval, cache {_fraction_text(fraction)} (dense: full cache)", fontsize=10)
    _legend(fig, axes)
    fig.suptitle(title or "KV-cache eviction: quality kept per policy (retrieval with its 95% interval)",
                 fontsize=10)
    return fig


# ----------------------------------------------------------------------------------------------- recall
def plot_lm_recall(rows: Sequence[Mapping] | object, budget: int, title: str | None = None) -> Figure:
    """Attention-mass recall per layer (mean over query heads) at one ``budget``, one line per selector
    (``window`` at budget 0). ``rows``: the study's ``recall`` rows. Raises ``ValueError`` for a budget the rows
    do not have."""
    records = _records(rows, "recall")
    _check_budget(records, budget, "recall")
    fig, ax = plt.subplots(figsize=(6.8, 4.4), layout="constrained")
    for name in _names(records):
        at = sorted(_at_budget(records, name, budget), key=lambda r: int(r["layer"]))
        if not at:
            continue
        label, color, marker, ls = _style_of(name)
        ax.plot([int(r["layer"]) for r in at], [_recall(r) for r in at], color=color, marker=marker, ls=ls,
                label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("layer")
    ax.set_ylabel("attention-mass recall, mean over heads")
    ax.set_ylim(top=1.01)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(title or f"Recall of the model's own attention per layer at budget {budget}", fontsize=10)
    return fig


# ------------------------------------------------------------------------------------------------ speed
def _speed_color(row: Mapping) -> str:
    selector = row.get("selector")
    if isinstance(selector, str):
        return REFERENCE_STYLES["dense"][1] if selector == "dense" else selector_style(selector)[0]
    attention = str(row["attention"])
    if attention == "sdpa":
        return REFERENCE_STYLES["sdpa"][1]
    return METHOD_STYLES["flex"][1] if attention.startswith("flex") else "0.5"


def plot_lm_speed(rows: Sequence[Mapping] | object, title: str | None = None) -> Figure:
    """Prefill time per implementation as horizontal bars, one panel per case, each bar labelled with its
    ratio to SDPA (``vs_sdpa``, else computed from the ``sdpa`` row) and its visited fraction; an
    implementation without a time (NaN: it failed) is marked so. ``rows``: the study's ``speed`` rows
    (:func:`topo_attn.prefill_speed.prefill_speed_rows`)."""
    records = _records(rows, "speed")
    cases = list(dict.fromkeys(str(r.get("case", "")) for r in records))
    fig, axes = plt.subplots(len(cases), 1, figsize=(7.6, 0.9 + 0.42 * len(records) + 0.6 * len(cases)),
                             squeeze=False, layout="constrained")
    for ax, case in zip(axes[:, 0], cases):
        sel = [r for r in records if str(r.get("case", "")) == case]
        times = {r["attention"]: float(r["ms"]) for r in sel if r.get("ms") is not None}
        sdpa = times.get("sdpa", math.nan)
        ms = np.array([math.nan if r.get("ms") is None else float(r["ms"]) for r in sel])
        y = np.arange(len(sel))
        ax.barh(y, np.nan_to_num(ms, nan=0.0), color=[_speed_color(r) for r in sel], height=0.7)
        top = np.nanmax(ms) if np.isfinite(ms).any() else 1.0
        for i, (r, t) in enumerate(zip(sel, ms)):
            if not np.isfinite(t):
                why = "skipped" if r.get("skipped") else "failed"
                ax.text(0, i, f"  no time ({why})", va="center", fontsize=8, color="0.3")
                continue
            ratio = r.get("vs_sdpa")
            ratio = t / sdpa if ratio is None or (isinstance(ratio, float) and math.isnan(ratio)) else float(ratio)
            visited = r.get("visited_fraction")
            parts = [f"{t:.1f} ms"] + ([f"{ratio:.2f}x SDPA"] if np.isfinite(ratio) else [])
            if visited is not None and np.isfinite(float(visited)):
                parts.append(f"visits {float(visited):.0%}")
            ax.text(t + 0.01 * top, i, "  " + ", ".join(parts), va="center", fontsize=8)
        if np.isfinite(sdpa):
            ax.axvline(sdpa, color=REFERENCE_STYLES["sdpa"][1], ls=":", lw=1.0)
        ax.set_yticks(y, [str(r["attention"]) + (f" {r['budget']}" if r.get("budget") else "") for r in sel])
        ax.invert_yaxis()
        ax.set_xlim(0, top * 1.55)
        ax.set_xlabel("prefill time (ms, lower is better)")
        ax.grid(True, axis="x", alpha=0.3)
        ax.set_title(case, fontsize=10)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


# --------------------------------------------------------------------------------------------- training
def plot_lm_training(log: Sequence[Mapping], title: str | None = None) -> Figure:
    """The training log (``train_log.jsonl``'s events, parsed): the training batches' bits per byte (``step``
    events) as a thin line and the held-out validation's bits per byte by position bucket (``validation``
    events) as markers, against the step; log-scaled bits per byte. Raises ``ValueError`` when the log has
    neither."""
    steps = [e for e in log if e.get("event") == "step"]
    checks = [e for e in log if e.get("event") == "validation"]
    if not steps and not checks:
        raise ValueError("the log has no 'step' or 'validation' events: nothing to plot")
    fig, ax = plt.subplots(figsize=(7.4, 4.2), layout="constrained")
    if steps:
        ax.plot([e["step"] for e in steps], [float(e["bits_per_byte"]) for e in steps], color="0.6", lw=1.0,
                label="training batches")
    buckets = list(dict.fromkeys(b for e in checks for b in e["bits_per_byte"]))
    colors = plt.cm.viridis(np.linspace(0.0, 0.85, max(len(buckets) - 1, 1)))
    late = iter(colors)
    for bucket in buckets:
        x = [e["step"] for e in checks if bucket in e["bits_per_byte"]]
        y = [float(e["bits_per_byte"][bucket]) for e in checks if bucket in e["bits_per_byte"]]
        if bucket == "all":
            ax.plot(x, y, color="k", marker="o", lw=1.8, label="validation, all positions")
        else:
            ax.plot(x, y, color=next(late), marker=".", lw=1.0, ls="--", label=f"validation, positions {bucket}")
    if checks:
        last = checks[-1]
        ax.annotate(f"{float(last['bits_per_byte'].get('all', np.nan)):.3f}", (last["step"],
                    float(last["bits_per_byte"].get("all", np.nan))), xytext=(4, 6), textcoords="offset points",
                    fontsize=9)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if str(v)[0] in "2345" else ""))
    ax.set_xlabel("training step")
    ax.set_ylabel("bits per byte (log scale)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or "Training: bits per byte over the steps", fontsize=10)
    return fig
