"""Figures (topo_attn.viz) and the schedule explorer (topo_attn.widgets), built headless with Agg."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.collections import LineCollection, PathCollection  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402
from matplotlib.text import Annotation  # noqa: E402

import topo_attn as ta  # noqa: E402
from topo_attn import viz  # noqa: E402
from topo_attn.samples import clustered_keys  # noqa: E402
from topo_attn.topology import SINK, SKIPPED, TOPOLOGY, WINDOW  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def centroids_of(n: int, dim: int = 16, block_size: int = 16, seed: int = 0) -> torch.Tensor:
    return ta.block_centroids(clustered_keys(n * block_size, dim, block_size, seed=seed), block_size)


def legend_labels(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


# ------------------------------------------------------------------------------------------- centroids
def test_plot_centroids_draws_blocks_tree_and_top_k():
    c = centroids_of(20)
    sal = ta.block_salience(c)
    ax = viz.plot_centroids(c, sal, topk=3)
    scatters = [a for a in ax.collections if isinstance(a, PathCollection)]
    points, rings = scatters
    assert len(points.get_offsets()) == 20 and len(rings.get_offsets()) == 3
    np.testing.assert_array_equal(points.get_array(), np.arange(20))  # coloured by block index
    sizes = points.get_sizes()
    assert np.argmax(sizes) == int(torch.argmax(sal))  # sized by salience
    tree = [a for a in ax.collections if isinstance(a, LineCollection)]
    assert len(tree) == 1 and len(tree[0].get_segments()) == 19  # n - 1 tree edges
    top = ta.top_salient_blocks(sal, 3).tolist()
    assert {t.get_text() for t in ax.texts} == {f"block {b}" for b in top}
    assert "principal axis 1" in ax.get_xlabel() and "principal axis 2" in ax.get_ylabel()
    assert legend_labels(ax) == ["minimum-spanning-tree edge", "top-3 salient"]
    assert ax.figure.axes[1].get_ylabel() == "block index"  # the colour bar


def test_plot_centroids_computes_salience_and_handles_one_dimension():
    c = torch.tensor([[0.0], [1.0], [10.0], [11.0]], dtype=torch.float64)
    ax = viz.plot_centroids(c, topk=1)
    assert [t.get_text() for t in ax.texts] == ["block 0"]  # salience 9, 9, 1, 0: ties to the lower index


def test_plot_salience_marks_top_k():
    sal = torch.tensor([1.0, 5.0, 2.0, 5.0, 0.0], dtype=torch.float64)
    ax = viz.plot_salience(sal, topk=2)
    bars = ax.containers[0]
    assert len(bars) == 5
    red = [i for i, bar in enumerate(bars) if bar.get_facecolor()[:3] == matplotlib.colors.to_rgb(viz.TOP_COLOR)]
    assert red == [1, 3]
    assert ax.get_xlabel() == "key block" and "salience" in ax.get_ylabel()


# ------------------------------------------------------------------------------------ barcode, diagram
@pytest.mark.parametrize("n", [1, 2, 16, 300])
def test_plot_barcode_gudhi_conventions(n):
    c = centroids_of(n, seed=n)
    bars = ta.persistence_barcode(c)
    ax = viz.plot_barcode(bars[::-1])  # any order in; drawn sorted by death
    drawn = ax.containers[0]
    assert len(drawn) == n  # one bar per block
    ends = [r.get_x() + r.get_width() for r in drawn]
    assert ends == sorted(ends)  # sorted by death, shortest first (drawn on top)
    assert ax.yaxis_inverted()
    arrows = [t for t in ax.texts if isinstance(t, Annotation) and t.arrow_patch is not None]
    assert len(arrows) == 1  # the infinite bar
    assert arrows[0].xy[0] == pytest.approx(ends[-1]) and arrows[0].xy[1] == n - 1
    assert ends[-1] > max([b for b in bars[:, 1] if math.isfinite(b)], default=0)
    assert ax.get_xlabel() == "H0, Rips edge length"
    assert legend_labels(ax) == ["H0"] and "barcode" in ax.get_title().lower()


def test_plot_persistence_diagram_has_diagonal_and_infinity():
    c = centroids_of(12)
    bars = ta.persistence_barcode(c)
    ax = viz.plot_persistence_diagram(bars)
    diagonal = ax.lines[0]
    x, y = diagonal.get_data()
    assert np.allclose(x, y) and diagonal.get_label() == "diagonal"
    finite, infinite = [a for a in ax.collections if isinstance(a, PathCollection)]
    assert len(finite.get_offsets()) == 11 and len(infinite.get_offsets()) == 1
    np.testing.assert_allclose(np.sort(finite.get_offsets()[:, 1]), bars[:-1, 1])
    assert infinite.get_offsets()[0, 1] > bars[-2, 1]
    assert ax.get_yticklabels()[-1].get_text() == "+\u221e"
    assert "H0, Rips edge length" in ax.get_xlabel() and "H0, Rips edge length" in ax.get_ylabel()
    assert legend_labels(ax) == ["diagonal", "H0", "H0, infinite bar"]


# -------------------------------------------------------------------------------------------- schedule
@pytest.mark.parametrize("nb", [8, 100, 1024])
def test_plot_schedule_image_and_colours(nb):
    block_size, seq_len = 16, nb * 16 - 5
    sal = torch.rand(nb, generator=torch.Generator().manual_seed(nb), dtype=torch.float64)
    schedule = ta.schedule_from_salience(sal, block_size, seq_len, window=2, sinks=1, topk=4)
    sources = ta.schedule_sources(sal, block_size, seq_len, window=2, sinks=1, topk=4)
    ax = viz.plot_schedule(schedule, sources)
    image = ax.images[0].get_array()
    assert image.shape == (nb, nb)  # one pixel per block pair, however many blocks
    labels = sources.numpy()
    mask = schedule.to_block_mask().numpy()
    np.testing.assert_array_equal(image[mask], labels[mask])
    assert (image[np.triu(np.ones((nb, nb), dtype=bool), 1)] == viz.NOT_CAUSAL).all()
    assert (image[np.tril(~mask)] == SKIPPED).all()
    assert {SINK, WINDOW, TOPOLOGY} <= set(np.unique(image))
    colours = {tuple(ax.images[0].cmap(ax.images[0].norm(c))[:3]) for c in (SINK, WINDOW, TOPOLOGY, SKIPPED)}
    assert len(colours) == 4  # distinct colours
    assert str(schedule.counts()) in ax.get_title()
    assert legend_labels(ax) == ["sink", "window", "topology", "skipped (causal)"]
    assert ax.get_xlabel() == "key block" and ax.get_ylabel() == "query block"


def test_plot_schedule_without_sources_and_per_lane():
    keys = torch.randn(2, 3, 200, 16, generator=torch.Generator().manual_seed(0))
    schedule = ta.topology_schedule(keys, 32, window=1, sinks=1, topk=2)
    ax = viz.plot_schedule(schedule, lane=(1, 2))
    lane_mask = schedule.to_block_mask()[1, 2].numpy()
    assert (ax.images[0].get_array()[lane_mask] == viz.SCHEDULED).all()
    lane_counts = ta.BlockSchedule.from_block_mask(schedule.to_block_mask()[1, 2], 32, 200).counts()
    assert str(lane_counts) in ax.get_title()
    assert legend_labels(ax) == ["scheduled", "skipped (causal)"]
    sal = ta.block_salience(ta.block_centroids(keys, 32))
    sources = ta.schedule_sources(sal, 32, 200, 1, 1, 2)  # [2, 3, n, n]: the plotted lane is taken
    ax = viz.plot_schedule(schedule, sources, lane=(1, 2))
    np.testing.assert_array_equal(ax.images[0].get_array()[lane_mask], sources[1, 2].numpy()[lane_mask])


def test_plot_schedule_rejects_sources_of_another_schedule():
    sal = torch.rand(10, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    schedule = ta.schedule_from_salience(sal, 16, 160, window=1, sinks=1, topk=2)
    with pytest.raises(ValueError, match="does not label exactly"):
        viz.plot_schedule(schedule, ta.schedule_sources(sal, 16, 160, window=2, sinks=1, topk=2))
    with pytest.raises(ValueError, match="shape"):
        viz.plot_schedule(schedule, torch.zeros(9, 9, dtype=torch.int8))


# ------------------------------------------------------------------------------------------- benchmark
def bench_rows() -> list[dict]:
    rows = []
    for block in (64, 128):
        for seq in (4096, 16384, 32768):
            rows.append(dict(case=f"S{seq} b{block}", cfg_name=f"S{seq} b{block}", cfg_seq_len=seq,
                             cfg_block_size=block, cfg_heads=32, seq_len=seq, ours_ms=seq / 8000,
                             sdpa_ms=seq / 4000, flex_ms=float("nan") if seq == 4096 else seq / 6000,
                             limit_ms=seq / 20000, ours_tflops=100.0, sdpa_tflops=500.0,
                             flex_tflops=float("nan") if seq == 4096 else 200.0))
    return rows


def test_plot_benchmark_panels_lines_and_limit():
    fig = viz.plot_benchmark(bench_rows(), title="NVIDIA H200, torch 2.11, triton 3.6")
    axes = fig.axes
    assert len(axes) == 4  # two series (block 64, 128) x (time, TFLOP/s)
    time_ax, rate_ax = axes[0], axes[1]
    assert time_ax.get_title() == "time: block_size=64" and rate_ax.get_title() == "throughput: block_size=64"
    labels = [line.get_label() for line in time_ax.lines]
    assert labels == ["topo_attn (ours)", "SDPA, dense causal", "FlexAttention, same mask",
                      "limit: SDPA x visited fraction"]
    assert [line.get_label() for line in rate_ax.lines] == labels[:3]
    flex = time_ax.lines[2]
    assert list(flex.get_xdata()) == [16384, 32768]  # the NaN point is left out
    np.testing.assert_allclose(time_ax.lines[3].get_ydata(), [4096 / 20000, 16384 / 20000, 32768 / 20000])
    assert time_ax.get_xscale() == "log" and time_ax.get_yscale() == "log"
    assert time_ax.get_xlabel() == "sequence length (tokens)" and "TFLOP/s" in rate_ax.get_ylabel()
    assert "NVIDIA H200" in fig._suptitle.get_text() and "heads=32" in fig._suptitle.get_text()


def test_plot_benchmark_accepts_a_dataframe_and_plain_rows():
    pd = pytest.importorskip("pandas")
    rows = [{k: v for k, v in r.items() if not k.startswith("cfg_")} for r in bench_rows()[:3]]
    fig = viz.plot_benchmark(pd.DataFrame(rows))
    assert len(fig.axes) == 2 and len(fig.axes[0].lines[0].get_xdata()) == 3  # one series over length
    with pytest.raises(ValueError, match="empty"):
        viz.plot_benchmark([])


# -------------------------------------------------------------------------------------------- explorer
def test_explorer_update_follows_the_widgets():
    from topo_attn.viz import ScheduleExplorer

    key_sets = {"a": clustered_keys(512, 16, 32, seed=0), "b": clustered_keys(1000, 16, 32, outlier_blocks=4, seed=1)}
    explorer = ScheduleExplorer(key_sets, key_set="a", block_size=32, sinks=1, window=1, topk=2)
    first_counts, first_stats = explorer.counts, explorer.stats.value
    first_image = explorer.figure.axes[0].images[0].get_array().copy()
    assert first_counts == explorer.schedule.counts() and str(first_counts) in first_stats
    assert first_image.shape == (16, 16)

    explorer.topk.value = 6  # a slider change redraws
    assert explorer.counts.scheduled_blocks > first_counts.scheduled_blocks
    assert explorer.stats.value != first_stats
    assert not np.array_equal(explorer.figure.axes[0].images[0].get_array(), first_image)
    assert torch.equal(explorer.sources > 0, explorer.schedule.to_block_mask())

    explorer.window.value = 0
    explorer.sinks.value = 0
    assert explorer.counts == ta.topology_schedule(key_sets["a"], 32, 0, 0, 6).counts()

    explorer.block_size.value = 16  # more blocks: the image and the slider ranges follow
    assert explorer.figure.axes[0].images[0].get_array().shape == (32, 32)
    assert explorer.topk.max == 32 and explorer.window.max == 31

    explorer.key_set.value = "b"
    assert explorer.schedule.seq_len == 1000 and explorer.figure.axes[0].images[0].get_array().shape == (63, 63)
    assert "<b>b</b>" in explorer.stats.value

    explorer.block_size.value = 128  # 8 blocks: top-k 6 still fits, window clamps to the range
    assert explorer.topk.max == 8 and explorer.counts == explorer.update()


def test_explorer_displays_its_widgets_then_the_live_kernel_note(monkeypatch):
    """Displayed by IPython, the explorer shows its widgets and, under them, the note saying what the sliders
    need, as plain HTML (not a widget, so a static copy shows it without JavaScript)."""
    from IPython.core.formatters import DisplayFormatter
    from IPython.display import HTML

    from topo_attn.viz import ScheduleExplorer, explorer as explorer_module

    explorer = ScheduleExplorer({"a": clustered_keys(256, 16, 32, seed=0)}, key_set="a", block_size=32)
    shown = []
    monkeypatch.setattr(explorer_module, "display", shown.append)
    assert DisplayFormatter().format(explorer) == ({}, {})  # IPython hands the display to the explorer
    assert len(shown) == 2 and shown[0] is explorer.widget and isinstance(shown[1], HTML)
    assert explorer_module.LIVE_KERNEL_NOTE in shown[1].data and ".venv/bin/jupyter lab notebooks/" in shown[1].data


def test_explorer_needs_key_sets():
    from topo_attn.viz import ScheduleExplorer

    with pytest.raises(ValueError, match="key_sets"):
        ScheduleExplorer({})


def test_plot_recall_vs_time_lines_per_selector():
    rows = [dict(selector=s, budget=b, recall=0.5 + 0.1 * b + (0.05 if s == "oracle" else 0), total_ms=0.1 * b,
                 sdpa_ms=0.3) for s in ("centroid", "oracle") for b in (1, 2, 4)]
    fig = viz.plot_recall_vs_time(rows, title="t")
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"centroid", "oracle", "SDPA (dense causal)"}
    assert list(lines["oracle"].get_xdata()) == [0.1, 0.2, 0.4] and ax.get_xscale() == "log"
    with pytest.raises(ValueError, match="empty"):
        viz.plot_recall_vs_time([])


# ---------------------------------------------------------------------------------- the language-model study
def lm_figure_result(**options) -> dict:
    from lm_standin import lm_result  # tests/lm_standin.py

    return lm_result(**options)


def lines_by_label(ax) -> dict:
    return {line.get_label(): line for line in ax.get_lines()}


def test_selector_styles_know_quest_and_give_unknown_names_a_stable_style():
    assert viz.selector_style("quest") == viz.SELECTOR_STYLES["quest"]
    style = viz.selector_style("topology_causal")
    assert style == viz.selector_style("topology_causal") and style[0] not in {s[0] for s in
                                                                               viz.SELECTOR_STYLES.values()}


def test_plot_lm_pareto_lines_per_selector_references_and_window_point():
    result = lm_figure_result()
    fig = viz.plot_lm_pareto(result["perplexity"])
    late, overall = fig.axes
    assert "4k-8k" in late.get_title() and overall.get_title() == "all positions"
    lines = lines_by_label(late)
    assert {"centroid", "quest", "topology_causal", "window", "SDPA (dense causal)",
            "kit, dense schedule"} <= set(lines)
    np.testing.assert_allclose(lines["centroid"].get_xdata(), [0.2, 0.4])  # through its budgets
    np.testing.assert_allclose(lines["centroid"].get_ydata(), [0.82 + 0.1 / 3, 0.82 + 0.1 / 7])
    assert len(lines["window"].get_xdata()) == 1 and lines["window"].get_linestyle() == "None"
    np.testing.assert_allclose(lines["SDPA (dense causal)"].get_ydata(), [0.82, 0.82])  # a horizontal line
    np.testing.assert_allclose(lines_by_label(overall)["quest"].get_ydata(), [0.81 + 0.1 / 3, 0.81 + 0.1 / 7])
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(labels) == len(set(labels)) == 6  # one legend for both panels
    assert len(viz.plot_lm_pareto(result["perplexity"], buckets=["0-1k"]).axes) == 1
    with pytest.raises(ValueError, match="not in the rows"):
        viz.plot_lm_pareto(result["perplexity"], buckets=["16k+"])
    with pytest.raises(ValueError, match="empty"):
        viz.plot_lm_pareto([])


def test_plot_lm_positions_at_one_budget_and_against_sdpa():
    pd = pytest.importorskip("pandas")
    rows = lm_figure_result()["perplexity"]
    for given in (rows, pd.DataFrame(rows)):  # rows, or a DataFrame (budget NaN for the references)
        fig = viz.plot_lm_positions(given, 6)
        absolute, excess = fig.axes
        lines = lines_by_label(absolute)
        np.testing.assert_allclose(lines["quest"].get_ydata(), [0.8 + 0.1 / 7, 0.81 + 0.1 / 7, 0.82 + 0.1 / 7])
        np.testing.assert_allclose(lines["window"].get_ydata(), [0.9, 0.91, 0.92])  # its budget 0
        np.testing.assert_allclose(lines_by_label(excess)["quest"].get_ydata(), [0.1 / 7] * 3)
        assert [t.get_text() for t in absolute.get_xticklabels()] == ["0-1k", "1k-4k", "4k-8k"]
    with pytest.raises(ValueError, match=r"budget 5 is not among .*\[2, 6\]"):
        viz.plot_lm_positions(rows, 5)


def test_plot_lm_retrieval_exact_and_loss_by_distance():
    rows = lm_figure_result()["retrieval"]
    fig = viz.plot_lm_retrieval(rows, 2)
    exact, loss = fig.axes
    lines = lines_by_label(exact)
    assert list(lines["centroid"].get_xdata()) == [1024, 2048, 8064]
    np.testing.assert_allclose(lines["centroid"].get_ydata(), [0.2] * 3)
    np.testing.assert_allclose(lines["SDPA (dense causal)"].get_ydata(), [1.0] * 3)
    np.testing.assert_allclose(lines_by_label(loss)["topology_causal"].get_ydata(), [0.8] * 3)
    fig.canvas.draw()
    assert [t.get_text() for t in exact.get_xticklabels()] == ["1k", "2k", "8064"]
    assert exact.get_xscale() == "log" and "2 probes" in exact.get_ylabel()


def errorbars_by_label(ax) -> dict:
    """The error-bar containers of an axes by label: ``(line, caps, bar collections)`` each."""
    return {c.get_label(): c for c in ax.containers if isinstance(c, ErrorbarContainer)}


def bar_spans(container) -> np.ndarray:
    """``[[low, high], ...]`` of an error-bar container's vertical bars."""
    return np.array([[seg[0][1], seg[1][1]] for seg in container.lines[2][0].get_segments()])


def test_plot_lm_retrieval_suite_a_panel_per_task_with_intervals_and_the_dense_gate():
    from lm_standin import retrieval_suite_result  # tests/lm_standin.py

    rows = retrieval_suite_result(tasks=("single_needle", "multi_key", "variable_tracking", "multi_value"))["rows"]
    fig = viz.plot_lm_retrieval_suite(rows)
    assert [ax.get_title() for ax in fig.axes] == ["single_needle", "multi_key", "variable_tracking", "multi_value"]
    ax = fig.axes[0]
    bars = errorbars_by_label(ax)
    assert set(bars) == {"SDPA (dense causal)", "kit, dense schedule", "quest 6", "quest 30", "topology 6",
                         "topology 30"}  # every budget its own line
    quest = [r for r in rows if r["task"] == "single_needle" and r["attention"] == "quest" and r["budget"] == 6]
    np.testing.assert_allclose(bars["quest 6"].lines[0].get_ydata(), [r["accuracy"] for r in quest])
    np.testing.assert_allclose(bar_spans(bars["quest 6"]), [[r["ci_low"], r["ci_high"]] for r in quest])
    np.testing.assert_allclose(bars["quest 6"].lines[0].get_xdata(), [1024, 4096], rtol=0.08)  # set apart a little
    gate, = [line for line in ax.get_lines() if line.get_label().startswith("dense gate")]
    np.testing.assert_allclose(gate.get_ydata(), [0.9, 0.9])
    assert ax.get_xscale() == "log" and "n = 4 per cell" in ax.get_ylabel()

    at_six = viz.plot_lm_retrieval_suite(rows, budget=6, title="t")
    assert set(errorbars_by_label(at_six.axes[0])) == {"SDPA (dense causal)", "kit, dense schedule", "quest",
                                                       "topology"}
    assert at_six._suptitle.get_text() == "t"


def test_plot_lm_retrieval_suite_gate_is_the_runners_threshold():
    from topo_attn.lm.retrieval_runner import DENSE_THRESHOLD
    from topo_attn.viz.lm import DENSE_GATE

    assert DENSE_GATE == DENSE_THRESHOLD


def test_plot_lm_retrieval_suite_errors_name_the_argument():
    from lm_standin import retrieval_suite_result

    rows = retrieval_suite_result()["rows"]
    with pytest.raises(ValueError, match="rows are empty"):
        viz.plot_lm_retrieval_suite([])
    with pytest.raises(ValueError, match=r"rows: retrieval suite row 0 lacks \['ci_low'\]"):
        viz.plot_lm_retrieval_suite([{k: v for k, v in rows[0].items() if k != "ci_low"}])
    with pytest.raises(ValueError, match=r"budget 5 is not among .*\[6, 30\]"):
        viz.plot_lm_retrieval_suite(rows, budget=5)


def test_plot_lm_eviction_bits_per_policy_and_retrieval_per_fraction_with_intervals():
    from lm_standin import eviction_result

    rows = eviction_result()["rows"]
    fig = viz.plot_lm_eviction(rows)
    bits, quarter, eighth = fig.axes
    assert "1/4" in quarter.get_title() and "1/8" in eighth.get_title()
    lines = lines_by_label(bits)
    assert list(lines["salience"].get_xdata()) == [0.125, 0.25]
    np.testing.assert_allclose(lines["snapkv"].get_ydata(), [1.5 + 0.3, 1.5 + 0.15])
    np.testing.assert_allclose(lines["dense (full cache)"].get_ydata(), [1.5, 1.5])  # the reference line
    assert lines["salience"].get_color() == viz.selector_style("topology")[0]  # salience is topology's ranking
    bars = errorbars_by_label(quarter)
    assert set(bars) == {"dense (full cache)", "salience", "streaming", "snapkv"}
    streaming = next(r for r in rows if r["policy"] == "streaming" and r["cache_fraction"] == 0.25)["retrieval"]
    np.testing.assert_allclose(bars["streaming"].lines[0].get_ydata(), [c["accuracy"] for c in streaming.values()])
    np.testing.assert_allclose(bar_spans(bars["streaming"]), [[c["ci_low"], c["ci_high"]] for c in streaming.values()])
    assert [t.get_text() for t in quarter.get_xticklabels()] == ["single_needle", "multi_key"]
    without = [dict(r, retrieval={}) for r in rows]  # a run with --no-retrieval: the bits panel only
    assert len(viz.plot_lm_eviction(without).axes) == 1


def test_plot_lm_eviction_errors_name_the_argument():
    from lm_standin import eviction_result

    rows = eviction_result()["rows"]
    with pytest.raises(ValueError, match="rows are empty"):
        viz.plot_lm_eviction([])
    with pytest.raises(ValueError, match=r"rows: eviction row 0 lacks \['bits_per_byte'\]"):
        viz.plot_lm_eviction([{k: v for k, v in rows[0].items() if k != "bits_per_byte"}])
    broken = dict(rows[1], retrieval={"multi_key": {"accuracy": 0.5}})
    with pytest.raises(ValueError, match=r"rows: eviction row 1's retrieval row 0 lacks \['ci_low', 'ci_high'\]"):
        viz.plot_lm_eviction([rows[0], broken])


def test_plot_lm_recall_mean_over_heads_per_layer():
    pytest.importorskip("pandas")
    from topo_attn.lm.results import lm_quality_tables

    result = lm_figure_result(layers=3)
    for given in (result["recall"], lm_quality_tables(result)["recall"]):
        ax = viz.plot_lm_recall(given, 6).axes[0]
        lines = lines_by_label(ax)
        assert set(lines) == {"window", "centroid", "quest", "topology_causal"}  # no sdpa, dense in recall rows
        assert list(lines["quest"].get_xdata()) == [0, 1, 2]
        np.testing.assert_allclose(lines["quest"].get_ydata(), [0.8, 0.79, 0.78])
        np.testing.assert_allclose(lines["window"].get_ydata(), [0.5, 0.49, 0.48])


def test_plot_lm_speed_bars_with_ratio_to_sdpa_and_failures():
    ax = viz.plot_lm_speed(lm_figure_result()["speed"], title="t").axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "no attention", "sdpa", "topo_attn dense", "topo_attn centroid 16", "topo_attn oracle 16", "flex_attention"]
    widths = [bar.get_width() for bar in ax.containers[0]]
    assert widths == [10.0, 40.0, 50.0, 20.0, 0.0, 0.0]
    texts = [t.get_text() for t in ax.texts]
    assert any("20.0 ms, 0.50x SDPA, visits 30%" in t for t in texts) and any("(failed)" in t for t in texts)
    assert any("(skipped)" in t for t in texts)
    assert ax.get_title() == "kit LM S8k b64"


def test_plot_lm_training_steps_and_validation():
    log = [{"event": "corpus"}] + [{"event": "step", "step": s, "bits_per_byte": 8.0 / (1 + s)} for s in range(5)] + [
        {"event": "validation", "step": s, "bits_per_byte": {"all": 1.0 / s, "0-1k": 1.2 / s}} for s in (2, 4)]
    ax = viz.plot_lm_training(log).axes[0]
    lines = lines_by_label(ax)
    assert list(lines["training batches"].get_xdata()) == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(lines["validation, all positions"].get_ydata(), [0.5, 0.25])
    assert "validation, positions 0-1k" in lines and ax.get_yscale() == "log"
    with pytest.raises(ValueError, match="no 'step' or 'validation'"):
        viz.plot_lm_training([{"event": "corpus"}])


def test_the_stand_in_speed_rows_have_the_prefill_timings_fields():
    """The speed rows of the stand-in carry what topo_attn.prefill_speed.prefill_speed_rows writes (its row dict
    and the ratios; the study's speed rows and the benchmark's model suite both come from it), so the speed
    figure is tested on the real shape."""
    import ast
    import inspect

    from lm_standin import SPEED_FIELDS

    from topo_attn import prefill_speed

    tree = ast.parse(inspect.getsource(prefill_speed.prefill_speed_rows))
    written = [kw.arg for node in ast.walk(tree)
               if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "dict" for kw in node.keywords]
    assert set(written) | {"floor_ms", "vs_sdpa", "vs_flex", "attention_share"} == set(SPEED_FIELDS)
    assert all(set(row) == set(SPEED_FIELDS) for row in lm_figure_result()["speed"])
