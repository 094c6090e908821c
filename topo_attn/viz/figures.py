"""Figures for key-block topology, schedules and benchmarks (matplotlib is imported here only).

Every function draws on ``ax`` (or ``axes``) when given, else on a new pyplot figure, and returns what it drew
on, so notebooks show it inline and callers can combine panels. Barcodes and diagrams follow GUDHI's
conventions: H0 of the Rips filtration, lengths in Rips edge length, bars sorted by death with the infinite
bar drawn as an arrow, diagrams with the diagonal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib import patheffects
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from ..rule import SINK, SKIPPED, SOURCE_NAMES, TOPOLOGY, WINDOW
from ..schedule import BlockSchedule
from ..topology import block_salience, minimum_spanning_tree, top_salient_blocks

H0_COLOR = plt.cm.Set1.colors[0]  # GUDHI's colour for dimension 0
TOP_COLOR = "#d62728"  # the top-k salient blocks
EDGE_LABEL = "H0, Rips edge length"
# schedule image categories: the labels of rule.source_labels, then above the diagonal, then a scheduled
# block whose source is not given
NOT_CAUSAL, SCHEDULED = 4, 5
SCHEDULE_COLORS = {SKIPPED: "#e4e4e4", SINK: "#d55e00", WINDOW: "#0072b2", TOPOLOGY: "#009e73",
                   NOT_CAUSAL: "#ffffff"}
SCHEDULED_COLOR = "#404040"
METHOD_STYLES = {"ours": ("topo_attn (ours)", "#009e73", "o"), "sdpa": ("SDPA, dense causal", "#0072b2", "s"),
                 "flex": ("FlexAttention, same mask", "#d55e00", "^")}


def _axes(ax: Axes | None, figsize: tuple[float, float]) -> Axes:
    return plt.subplots(figsize=figsize, layout="constrained")[1] if ax is None else ax


def _numpy(x) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def display_figure(figure: Figure) -> None:
    """Show ``figure`` in the current output (a notebook cell or an ipywidgets ``Output``) and release it from
    pyplot, so it is not shown a second time at the end of the cell."""
    from IPython.display import display

    display(figure)
    plt.close(figure)


# ------------------------------------------------------------------------------------------ centroids
def pca_2d(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Project points ``[n, D]`` on their first two principal axes: ``[n, 2]`` and the explained variance
    fractions ``[2]`` (zero-padded when ``D`` or ``n`` allows fewer than two axes)."""
    centred = points - points.mean(axis=0)
    _, sing, vt = np.linalg.svd(centred, full_matrices=False)
    coords = np.zeros((len(points), 2))
    k = min(2, vt.shape[0])
    coords[:, :k] = centred @ vt[:k].T
    total = float((sing ** 2).sum())
    explained = np.zeros(2)
    explained[:k] = (sing[:k] ** 2) / total if total > 0 else 0.0
    return coords, explained


def plot_centroids(centroids: torch.Tensor, salience: torch.Tensor | None = None, topk: int = 0,
                   ax: Axes | None = None) -> Axes:
    """Key-block centroids ``[n, D]`` in 2-D (PCA), coloured by block index, sized by salience ``[n]``
    (:func:`~topo_attn.block_salience` of the centroids when not given), the ``topk`` most salient blocks
    ringed and numbered, and the minimum-spanning-tree edges (computed in ``D`` dimensions) drawn."""
    if salience is None:
        salience = block_salience(centroids)
    sal = _numpy(salience).astype(np.float64)
    n = len(sal)
    xy, explained = pca_2d(_numpy(centroids).astype(np.float64))
    ax = _axes(ax, (7.0, 5.5))
    edges, _ = minimum_spanning_tree(centroids)
    ax.add_collection(LineCollection(xy[edges], colors="0.6", linewidths=1.0, zorder=1))
    size = 30 + 400 * sal / sal.max() if sal.max() > 0 else np.full(n, 60.0)
    points = ax.scatter(xy[:, 0], xy[:, 1], c=np.arange(n), cmap="viridis", s=size, edgecolors="k",
                        linewidths=0.5, zorder=2, vmin=0, vmax=max(n - 1, 1))
    top = top_salient_blocks(torch.as_tensor(sal), topk).tolist()
    handles = [Line2D([], [], color="0.6", lw=1.0, label="minimum-spanning-tree edge")]
    if top:
        ax.scatter(xy[top, 0], xy[top, 1], s=size[top] + 250, facecolors="none", edgecolors=TOP_COLOR,
                   linewidths=2.0, zorder=3)
        for b in top:
            ax.annotate(f"block {b}", xy[b], xytext=(12, 10), textcoords="offset points", fontsize=10,
                        color=TOP_COLOR, weight="bold", zorder=4,
                        path_effects=[patheffects.withStroke(linewidth=3, foreground="white")])
        handles.append(Line2D([], [], marker="o", ls="none", markersize=11, markerfacecolor="none",
                              markeredgecolor=TOP_COLOR, markeredgewidth=2, label=f"top-{len(top)} salient"))
    ax.figure.colorbar(points, ax=ax, label="block index", shrink=0.85)
    ax.set_xlabel(f"principal axis 1 ({explained[0]:.0%} of variance)")
    ax.set_ylabel(f"principal axis 2 ({explained[1]:.0%} of variance)")
    ax.set_title(f"Key-block centroids ({n} blocks), marker area ~ salience")
    ax.legend(handles=handles, loc="best", fontsize=9)
    ax.margins(0.12)
    ax.autoscale_view()
    return ax


def plot_salience(salience: torch.Tensor, topk: int = 0, ax: Axes | None = None) -> Axes:
    """Salience ``[n]`` per block as bars, the ``topk`` most salient in red and ranked."""
    sal = _numpy(salience).astype(np.float64)
    n = len(sal)
    top = top_salient_blocks(torch.as_tensor(sal), topk).tolist()
    colors = np.array(["#7f7f7f"] * n, dtype=object)
    colors[top] = TOP_COLOR
    ax = _axes(ax, (7.0, 3.2))
    ax.bar(np.arange(n), sal, color=list(colors), width=0.8 if n <= 64 else 1.0)
    if n <= 32:
        for rank, b in enumerate(top):
            ax.annotate(f"#{rank + 1}", (b, sal[b]), xytext=(0, 3), textcoords="offset points",
                        ha="center", fontsize=8, color=TOP_COLOR)
    ax.set_xlabel("key block")
    ax.set_ylabel("salience (Rips edge length)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("Elder-rule salience per block" + (f" (top-{len(top)} in red)" if top else ""))
    ax.set_xlim(-0.6, n - 0.4)
    return ax


# ----------------------------------------------------------------------------------- barcode, diagram
def _finite_and_infinity(barcode: np.ndarray) -> tuple[np.ndarray, float]:
    """Rows of ``barcode`` sorted by death (infinite last) and where to draw infinity."""
    bars = np.asarray(barcode, dtype=np.float64).reshape(-1, 2)
    bars = bars[np.lexsort((bars[:, 0], bars[:, 1]))]
    finite = bars[np.isfinite(bars[:, 1]), 1]
    top = float(finite.max()) if finite.size else 1.0
    low = float(bars[:, 0].min()) if len(bars) else 0.0
    return bars, top + 0.1 * max(top - low, 1e-12)


def plot_barcode(barcode: np.ndarray, ax: Axes | None = None, title: str | None = None) -> Axes:
    """The H0 barcode ``[n, 2]`` (birth, death) as horizontal bars sorted by death (shortest on top); the
    infinite bar ends in an arrow at an infinity mark 10% past the largest finite death, where GUDHI puts it."""
    bars, infinity = _finite_and_infinity(barcode)
    n = len(bars)
    ax = _axes(ax, (6.5, 0.8 + min(max(n, 4), 48) * 0.12))
    ends = np.where(np.isinf(bars[:, 1]), infinity, bars[:, 1])
    ax.barh(np.arange(n), ends - bars[:, 0], left=bars[:, 0], height=0.8 if n <= 200 else 1.0,
            color=H0_COLOR, alpha=0.6, linewidth=0, label="H0")
    for row in np.flatnonzero(np.isinf(bars[:, 1])):
        ax.annotate("", xy=(infinity, row), xytext=(bars[row, 0], row),
                    arrowprops=dict(arrowstyle="-|>", color=H0_COLOR, lw=1.5, mutation_scale=14))
    ax.axvline(infinity, color="0.3", lw=0.8, ls=":")
    ax.text(infinity, -0.02, "\u221e", transform=ax.get_xaxis_transform(), ha="center", va="top", fontsize=11)
    ax.set_xlim(min(0.0, float(bars[:, 0].min(initial=0.0))) - 0.02 * infinity, infinity * 1.04)
    ax.set_ylim(n - 0.5, -0.5)  # first bar on top
    ax.set_yticks([])
    ax.set_ylabel(f"{n} bars, sorted by death")
    ax.set_xlabel(EDGE_LABEL)
    ax.set_title(title or "Persistence barcode")
    ax.legend(loc="upper right", fontsize=9)
    return ax


def plot_persistence_diagram(barcode: np.ndarray, ax: Axes | None = None, title: str | None = None) -> Axes:
    """The H0 persistence diagram of ``barcode [n, 2]``: one point per bar at (birth, death), the diagonal,
    and the infinite bar on a dashed line marked +infinity, 10% above the largest finite death."""
    bars, infinity = _finite_and_infinity(barcode)
    ax = _axes(ax, (5.0, 5.0))
    inf_rows = np.isinf(bars[:, 1])
    deaths = np.where(inf_rows, infinity, bars[:, 1])
    low = min(0.0, float(bars[:, 0].min(initial=0.0)))
    lim = (low - 0.05 * infinity, infinity * 1.05)
    ax.plot(lim, lim, color="0.3", lw=1.0, label="diagonal")
    ax.axhline(infinity, color="0.3", lw=0.8, ls="--")
    ax.scatter(bars[~inf_rows, 0], deaths[~inf_rows], color=H0_COLOR, alpha=0.6, s=30, label="H0")
    ax.scatter(bars[inf_rows, 0], deaths[inf_rows], color=H0_COLOR, marker="^", s=60,
               label="H0, infinite bar")
    ax.set_xlim(lim)
    ax.set_ylim(lim)
    ticks = [t for t in ax.get_yticks() if lim[0] <= t <= infinity - 0.08 * (infinity - lim[0])]
    ax.set_yticks(ticks + [infinity], [f"{t:g}" for t in ticks] + ["+\u221e"])
    ax.set_aspect("equal")
    ax.set_xlabel(f"birth ({EDGE_LABEL})")
    ax.set_ylabel(f"death ({EDGE_LABEL})")
    ax.set_title(title or "Persistence diagram")
    ax.legend(loc="lower right", fontsize=9)
    return ax


# --------------------------------------------------------------------------------------------- schedule
def plot_schedule(schedule: BlockSchedule, sources: torch.Tensor | None = None, ax: Axes | None = None,
                  lane: tuple[int, int] = (0, 0), title: str | None = None) -> Axes:
    """A schedule's block mask as an image, rows query blocks and columns key blocks (lane ``lane`` of a
    per-lane schedule). With ``sources`` ``[n, n]`` (:func:`~topo_attn.schedule_sources` for the same
    schedule), sink, window and topology blocks get their own colours; it must label exactly the scheduled
    blocks. The title gives the block counts and the reduction. Drawn as one image, so 8 or 1024 blocks
    read the same."""
    if schedule.transposed:
        raise ValueError("plot_schedule needs a row schedule; call it on schedule.transpose()")
    mask = schedule.to_block_mask()
    if schedule.lanes is not None:
        mask = mask[lane]
        counts = BlockSchedule.from_block_mask(mask, schedule.block_size, schedule.seq_len).counts()
    else:
        counts = schedule.counts()
    mask = mask.cpu()
    n = mask.shape[0]
    image = np.full((n, n), NOT_CAUSAL, dtype=np.int8)
    causal = np.tril(np.ones((n, n), dtype=bool))
    image[causal] = SKIPPED
    if sources is None:
        image[mask.numpy()] = SCHEDULED
        colors = {**SCHEDULE_COLORS, SCHEDULED: SCHEDULED_COLOR}
        legend = [("scheduled", SCHEDULED)]
    else:
        labels = sources.detach().cpu()
        if labels.ndim > 2 and schedule.lanes is not None:  # labels of every lane: take the plotted one
            labels = labels.reshape(-1, *labels.shape[-2:])[lane[0] * schedule.lanes[1] + lane[1]]
        if labels.shape != (n, n):
            raise ValueError(f"sources must have shape [{n}, {n}] like the block mask, got {tuple(labels.shape)}")
        if not torch.equal(labels > SKIPPED, mask):
            raise ValueError("sources does not label exactly the schedule's blocks; were they built with the "
                             "same salience, block size, seq_len, window, sinks and topk?")
        image[mask.numpy()] = labels.numpy()[mask.numpy()]
        colors = SCHEDULE_COLORS
        legend = [(SOURCE_NAMES[c], c) for c in (SINK, WINDOW, TOPOLOGY)]
    legend += [("skipped (causal)", SKIPPED)]
    cmap = ListedColormap([colors.get(c, "#ffffff") for c in range(max(colors) + 1)])
    ax = _axes(ax, (6.0, 6.0))
    ax.imshow(image, cmap=cmap, vmin=-0.5, vmax=max(colors) + 0.5, interpolation="antialiased",
              interpolation_stage="rgba", origin="upper", extent=(-0.5, n - 0.5, n - 0.5, -0.5))
    if n <= 48:  # cell borders while cells are large enough to see them
        ax.set_xticks(np.arange(-0.5, n, 1), minor=True)
        ax.set_yticks(np.arange(-0.5, n, 1), minor=True)
        ax.grid(which="minor", color="white", linewidth=0.6)
        ax.tick_params(which="minor", length=0)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(MaxNLocator(nbins=min(n, 9), integer=True))
    ax.set_xlabel("key block")
    ax.set_ylabel("query block")
    ax.set_title((title or f"Block schedule, {n} blocks of {schedule.block_size} tokens") + f"\n{counts}",
                 fontsize=10)
    ax.legend(handles=[Patch(facecolor=colors[c], edgecolor="0.5", label=name) for name, c in legend],
              loc="upper right", fontsize=9, framealpha=0.95)
    return ax


# -------------------------------------------------------------------------------------------- benchmark
def _benchmark_series(records: list[dict]) -> tuple[list[tuple[str, list[dict]]], str]:
    """Group rows into series over sequence length. Rows that carry their case's configuration as
    ``cfg_*`` fields (``cfg_name`` and ``cfg_seq_len`` aside) are grouped by it and labelled by the fields that
    vary; the fields common to all rows form the second return value. Without ``cfg_*`` fields, rows are
    grouped by ``case`` when a case repeats, else form one series."""
    fields = [k for k in records[0] if k.startswith("cfg_") and k not in ("cfg_name", "cfg_seq_len")]
    if fields:
        varying = [k for k in fields if len({repr(r.get(k)) for r in records}) > 1]
        common = ", ".join(f"{k[4:]}={records[0].get(k)}" for k in fields if k not in varying)
        key = lambda r: ", ".join(f"{k[4:]}={r.get(k)}" for k in varying)  # noqa: E731
    else:
        cases = [str(r["case"]) for r in records]
        common = ""
        key = (lambda r: str(r["case"])) if len(set(cases)) < len(cases) else (lambda r: "")  # noqa: E731
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(key(r), []).append(r)
    return [(label, sorted(rows, key=lambda r: r["seq_len"])) for label, rows in groups.items()], common


def _tokens(n: float) -> str:
    return f"{n / 1024:g}k" if n >= 1024 and n % 1024 == 0 else f"{n:g}"


def plot_benchmark(rows: Sequence[Mapping] | object, title: str | None = None) -> Figure:
    """Benchmark rows (dicts, or a pandas DataFrame, with ``case``, ``seq_len``, ``{ours,sdpa,flex}_ms``,
    ``limit_ms`` and ``{ours,sdpa,flex}_tflops``): time and TFLOP/s against sequence length for ours, SDPA
    and FlexAttention, one pair of panels per series of cases that differ only in length (see
    :func:`_benchmark_series`); the time panel has the limit line (SDPA's dense-causal time scaled by the
    fraction of causal work the schedule visits). TFLOP/s are the rows' own: the runner counts the causal
    work for SDPA and the visited work for the block-sparse kernels. Missing values (a method that did not
    run, NaN or None) are skipped."""
    records = rows.to_dict("records") if hasattr(rows, "to_dict") else [dict(r) for r in rows]
    if not records:
        raise ValueError("rows is empty: nothing to plot")
    series, common = _benchmark_series(records)
    fig, axes = plt.subplots(len(series), 2, figsize=(11.0, 0.6 + 3.4 * len(series)), squeeze=False,
                             layout="constrained")

    def column(sel: list[dict], key: str) -> np.ndarray:
        return np.array([np.nan if r.get(key) is None else float(r[key]) for r in sel])

    for (time_ax, rate_ax), (label, sel) in zip(axes, series):
        seq = column(sel, "seq_len")
        for method, (name, color, marker) in METHOD_STYLES.items():
            for ax_, key in ((time_ax, f"{method}_ms"), (rate_ax, f"{method}_tflops")):
                y = column(sel, key)
                ok = np.isfinite(y)
                ax_.plot(seq[ok], y[ok], color=color, marker=marker, label=name)
        limit = column(sel, "limit_ms")
        ok = np.isfinite(limit)
        time_ax.plot(seq[ok], limit[ok], color="k", ls="--", marker="_", lw=1.2,
                     label="limit: SDPA x visited fraction")
        time_ax.set_yscale("log")
        time_ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        time_ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        time_ax.yaxis.set_minor_formatter(NullFormatter())
        time_ax.set_ylabel("time (ms, log scale)")
        rate_ax.set_ylabel("TFLOP/s (work done)")
        rate_ax.set_ylim(bottom=0)
        ticks = np.unique(seq)
        for ax_, what in ((time_ax, "time"), (rate_ax, "throughput")):
            ax_.set_xscale("log", base=2)
            ax_.set_xticks(ticks, [_tokens(t) for t in ticks])
            ax_.minorticks_off()
            ax_.set_xlim(ticks[0] / 1.4, ticks[-1] * 1.4)
            ax_.set_xlabel("sequence length (tokens)")
            ax_.set_title(f"{what}" + (f": {label}" if label else ""), fontsize=10)
            ax_.grid(True, which="major", alpha=0.3)
            ax_.legend(fontsize=8)
    heading = "\n".join(t for t in (title, common) if t)
    if heading:
        fig.suptitle(heading, fontsize=10)
    return fig


# ------------------------------------------------------------------------------------------ selection quality
SELECTOR_STYLES = {"window": ("#7f7f7f", "x", ":"), "random": ("#bcbd22", "v", ":"),
                   "topology_22": ("#8c564b", "D", "--"), "topology": ("#009e73", "o", "--"),
                   "centroid": ("#0072b2", "s", "-"), "quest": ("#e69f00", "h", "-"),
                   "cluster": ("#cc79a7", "^", "-"), "cluster_centroid": ("#d55e00", "P", "-"),
                   "oracle": ("#000000", "*", "-")}
METRIC_LABELS = {"recall": "attention-mass recall (higher is better)", "rel_l2": "relative L2 error of the output",
                 "cos_err": "1 - cosine of the output", "lse_err": "log-sum-exp error (nats)"}


def plot_selection_quality(rows: Sequence[Mapping] | object, metrics: Sequence[str] = ("recall", "rel_l2"),
                           title: str | None = None) -> Figure:
    """Selection-quality rows (dicts or a DataFrame with ``selector``, ``budget`` and the metric columns, as
    :func:`topo_attn.selection.compare_selectors` gives; several rows per selector and budget, e.g. one per
    lane, are averaged): each metric against the budget (extra blocks per row), one line per selector."""
    records = rows.to_dict("records") if hasattr(rows, "to_dict") else [dict(r) for r in rows]
    if not records:
        raise ValueError("rows is empty: nothing to plot")
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 3.8), squeeze=False,
                             layout="constrained")
    selectors = list(dict.fromkeys(r["selector"] for r in records))
    for ax, metric in zip(axes[0], metrics):
        for name in selectors:
            sel = [r for r in records if r["selector"] == name]
            budgets = sorted({int(r["budget"]) for r in sel})
            y = [np.mean([float(r[metric]) for r in sel if int(r["budget"]) == b]) for b in budgets]
            color, marker, ls = SELECTOR_STYLES.get(name, (None, "o", "-"))
            ax.plot(budgets, y, color=color, marker=marker, ls=ls, label=name)
        ax.set_xlabel("budget (extra key blocks per query block)")
        ax.set_ylabel(METRIC_LABELS.get(metric, metric))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_recall_vs_time(rows: Sequence[Mapping] | object, title: str | None = None) -> Figure:
    """Selection quality against cost: rows with ``selector``, ``budget``, ``recall`` and ``total_ms`` (schedule
    build + attention, as the runner's ``select`` suite writes them), one line per selector through its
    budgets; time on a log axis; ``sdpa_ms``, when present, as a vertical line."""
    records = rows.to_dict("records") if hasattr(rows, "to_dict") else [dict(r) for r in rows]
    if not records:
        raise ValueError("rows is empty: nothing to plot")
    fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
    for name in dict.fromkeys(r["selector"] for r in records):
        sel = sorted((r for r in records if r["selector"] == name), key=lambda r: int(r["budget"]))
        color, marker, ls = SELECTOR_STYLES.get(name, (None, "o", "-"))
        ax.plot([float(r["total_ms"]) for r in sel], [float(r["recall"]) for r in sel], color=color,
                marker=marker, ls=ls, label=name)
    if "sdpa_ms" in records[0]:
        ax.axvline(float(records[0]["sdpa_ms"]), color="0.4", ls=":", label="SDPA (dense causal)")
    ax.set_xscale("log")
    ax.set_xlabel("schedule build + attention (ms)")
    ax.set_ylabel(METRIC_LABELS.get("recall", "recall"))
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return fig
