"""Comparing selectors: the oracle never beaten at equal per-row budget, the verdict and its figure."""

from __future__ import annotations

import pytest

from topo_attn import samples, selection

EQUAL_BUDGET = [s for s in selection.SELECTORS if s not in ("window", "topology_22")]


@pytest.mark.parametrize("data", ["random", "clustered", "clustered_keys_file"])
@pytest.mark.parametrize("budget", [0, 1, 3, 6])
def test_the_oracle_is_never_beaten_at_equal_budget(data, budget, random_qkv, clustered_qkv):
    if data == "random":
        q, k, v = random_qkv(256, 16, heads=3, seed=budget, spread=1.5)
        block = 16
    elif data == "clustered":
        q, k, v = clustered_qkv(512, 32, seed=budget)
        block = 32
    else:
        q, k, v = selection.synthetic_qkv(samples.load_key_set("outliers")[:512], 32, seed=budget)
        block = 32
    rows = selection.compare_selectors(q, k, v, block, [budget], per_lane=True, clusters=3)
    by = {}
    for r in rows:
        by.setdefault(r["selector"], {})[r["lane"]] = r
    for lane, oracle in by["oracle"].items():
        for name in selection.SELECTORS:  # the unequal ones visit at most as many blocks per row
            assert by[name][lane]["recall"] <= oracle["recall"] + 1e-12, (name, lane)
    for name in EQUAL_BUDGET:
        assert by[name][0]["blocks_per_row"] == by["oracle"][0]["blocks_per_row"]


def test_verdict_and_figure(clustered_qkv):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from topo_attn import viz

    q, k, v = clustered_qkv(256, 32, seed=1)
    rows = selection.compare_selectors(q, k, v, 32, [1, 2], clusters=2)
    text = selection.verdict(rows, 2)
    assert "winner (without the oracle)" in text and "of the oracle's" in text
    with pytest.raises(ValueError, match="no rows at budget 5"):
        selection.verdict(rows, 5)
    fig = viz.plot_selection_quality(rows, ("recall", "lse_err"))
    assert len(fig.axes) == 2 and len(fig.axes[0].lines) == len(selection.SELECTORS)
    plt.close(fig)


def test_progress_shows_on_stderr_and_changes_no_row(clustered_qkv, capsys):
    q, k, v = clustered_qkv(256, 32, seed=2)
    quiet = selection.compare_selectors(q, k, v, 32, [1, 2], clusters=2, progress=False)
    assert capsys.readouterr().err == ""
    shown = selection.compare_selectors(q, k, v, 32, [1, 2], clusters=2, progress="test input")
    captured = capsys.readouterr()
    assert shown == quiet and captured.out == ""
    assert "test input" in captured.err and "oracle, budget 2" in captured.err  # what runs, named
    selection.compare_selectors(q, k, v, 32, [1], selectors=["window"])  # the default: a bar with a description
    assert "compare_selectors" in capsys.readouterr().err
    with pytest.raises(TypeError, match="progress must be a bool or a string"):
        selection.compare_selectors(q, k, v, 32, [1], progress=1)


def test_cli_output_is_the_same_with_progress(capsys):
    """``python -m topo_attn.selection``: the tables and verdicts on stdout are byte-identical with the bar on
    stderr and without it."""
    from topo_attn.selection.__main__ import main

    args = ["--budgets", "1", "--report-budget", "1", "--key-set", "outliers"]
    main(args + ["--no-progress"])
    quiet = capsys.readouterr()
    main(args + ["--progress"])  # (without a terminal, a bar only when asked for)
    shown = capsys.readouterr()
    assert shown.out == quiet.out and quiet.err == ""
    assert "winner (without the oracle)" in shown.out and "\r" not in shown.out
    assert "synthetic outliers" in shown.err and "real " in shown.err and "cluster, budget 1" in shown.err
