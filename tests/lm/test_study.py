"""``python -m topo_attn.lm evaluate`` (topo_attn.lm.study) end to end on a tiny random Llama saved to disk, the
Triton kernels in the interpreter on the CPU: the JSON's perplexity, retrieval and recall rows for sdpa, the
kit's dense backend and three selectors, the summary table, and the configuration list."""

from __future__ import annotations

import contextlib
import io
import json
import math

import numpy as np
import pytest
import torch

from helpers import DEVICE  # in tests/: the GPU where the compiled kernel runs, else the CPU (interpreter)
from topo_attn.lm import study
from topo_attn.lm.evaluate import bits_per_byte, passkey_scores, token_losses
from topo_attn.lm.train import probe_set

transformers = pytest.importorskip("transformers", minversion="5")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

LENGTH, BLOCK, BUDGET = 256, 32, 1  # 8 blocks of 32: 36 causal block pairs per lane, one probe distance (128)
HEADS = 4
SELECTORS = ("window", "centroid", "quest")
CONFIGS = [("sdpa", None), ("dense", None), ("window", 0), ("centroid", BUDGET), ("quest", BUDGET)]


def visited_fraction(blocks: int, per_row: int) -> float:
    """Scheduled / causal block pairs when row ``r`` visits ``min(r + 1, per_row)`` blocks."""
    return sum(min(r + 1, per_row) for r in range(blocks)) / (blocks * (blocks + 1) // 2)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One evaluation: the model folder, the documents, ``main``'s printed output and the JSON it wrote."""
    root = tmp_path_factory.mktemp("study")
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=HEADS, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                         initializer_range=0.1, attn_implementation="sdpa")
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(root / "model")
    rng = np.random.default_rng(0)
    documents = rng.integers(32, 127, (2, LENGTH)).astype(np.uint8)  # printable bytes
    np.savez_compressed(root / "docs.npz", documents=documents)
    out = root / "result.json"
    argv = ["--model", str(root / "model"), "--eval-set", str(root / "docs.npz"), "--length", str(LENGTH),
            "--block-size", str(BLOCK), "--budgets", str(BUDGET), "--probes", "1", "--documents", "2", "--batch", "2",
            "--selectors", *SELECTORS, "--out", str(out), "--no-progress", "--device", DEVICE, "--dtype", "float32",
            "--no-speed"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert study.main(argv) == 0
    assert out.is_file()
    return dict(root=root, documents=documents, printed=printed.getvalue(), result=json.loads(out.read_text()))


@pytest.fixture(scope="module")
def saved_model(run):
    return LlamaForCausalLM.from_pretrained(run["root"] / "model", attn_implementation="sdpa").eval()


def rows_by_config(rows: list[dict]) -> dict:
    return {(r["attention"], r["budget"]): r for r in rows}


def test_result_header(run):
    result = run["result"]
    gpu = "cpu" if DEVICE == "cpu" else torch.cuda.get_device_name()
    assert result["suite"] == "lm" and result["gpu"] == gpu and result["dtype"] == "float32"
    assert result["documents"] == 2 and result["length"] == LENGTH and result["block_size"] == BLOCK
    assert result["sinks"] == 1 and result["window"] == 1 and result["dense_layers"] == []
    assert result["causal_blocks_per_lane"] == 36
    assert result["command"].startswith("python -m topo_attn.lm evaluate --model ")
    assert "commit" in result and result["seconds"] > 0
    assert "speed" not in result  # --no-speed


def test_sdpa_rows_equal_the_scores_of_the_saved_model(run, saved_model):
    """The sdpa rows hold what evaluate's functions give for the whole evaluation set and the seeded probes."""
    ids = torch.from_numpy(run["documents"].astype(np.int64))
    want = bits_per_byte(token_losses(saved_model, ids))
    got = rows_by_config(run["result"]["perplexity"])[("sdpa", None)]["bits_per_byte"]
    assert set(got) == set(want) and all(got[k] == pytest.approx(want[k], rel=1e-6) for k in want)
    (probe,) = probe_set(run["documents"], [LENGTH - 128], 1, seed=1)  # --seed's default
    (score,) = passkey_scores(saved_model, [probe])
    sdpa = rows_by_config(run["result"]["retrieval"])[("sdpa", None)]
    assert sdpa["loss"] == pytest.approx(score["loss"], rel=1e-6) and sdpa["exact"] == float(score["exact"])


def test_perplexity_rows(run):
    rows = run["result"]["perplexity"]
    assert [(r["attention"], r["budget"]) for r in rows] == CONFIGS
    by = rows_by_config(rows)
    for r in rows:
        bits = r["bits_per_byte"]
        assert set(bits) == {"all", "0-1k"} and r["documents"] == 2  # 255 predicted positions: one bucket
        assert bits["0-1k"] == bits["all"] and math.isfinite(bits["all"]) and 0 < bits["all"] < 20
    sdpa, dense = by[("sdpa", None)], by[("dense", None)]
    assert sdpa["visited_fraction"] == 1.0 and dense["visited_fraction"] == 1.0
    assert dense["bits_per_byte"]["all"] == pytest.approx(sdpa["bits_per_byte"]["all"], rel=1e-4)
    # the sparse selectors change the scores: the comparison above would see a sparse schedule
    assert all(abs(by[c]["bits_per_byte"]["all"] - sdpa["bits_per_byte"]["all"]) > 1e-3 for c in CONFIGS[2:])
    # sink + window + diagonal (3 blocks per row), plus the budget for centroid and quest: equal budgets visit
    # equal numbers of blocks
    window, centroid, quest = by[("window", 0)], by[("centroid", BUDGET)], by[("quest", BUDGET)]
    assert window["visited_fraction"] == pytest.approx(visited_fraction(LENGTH // BLOCK, 3))
    assert centroid["visited_fraction"] == quest["visited_fraction"]
    assert centroid["visited_fraction"] == pytest.approx(visited_fraction(LENGTH // BLOCK, 3 + BUDGET))
    assert window["visited_fraction"] < centroid["visited_fraction"] < 1.0


def test_retrieval_rows(run):
    rows = run["result"]["retrieval"]
    assert [(r["attention"], r["budget"]) for r in rows] == CONFIGS  # one distance
    perplexity = rows_by_config(run["result"]["perplexity"])
    for r in rows:
        assert r["distance"] == LENGTH - 128 and r["probes"] == 1
        assert 0.0 <= r["exact"] <= 1.0 and math.isfinite(r["loss"]) and r["loss"] > 0
        assert r["visited_fraction"] == perplexity[(r["attention"], r["budget"])]["visited_fraction"]
    by = rows_by_config(rows)
    assert by[("dense", None)]["loss"] == pytest.approx(by[("sdpa", None)]["loss"], rel=1e-4)
    assert by[("dense", None)]["exact"] == by[("sdpa", None)]["exact"]


def test_recall_rows(run):
    rows = run["result"]["recall"]
    assert sorted((r["layer"], r["attention"], r["budget"]) for r in rows) == sorted(
        (layer, a, b) for layer in (0, 1) for a, b in CONFIGS[2:])
    perplexity = rows_by_config(run["result"]["perplexity"])
    for r in rows:
        assert len(r["recall"]) == HEADS and all(0.0 <= x <= 1.0 for x in r["recall"])
        # the schedules of the recall rows are the model's: the same share of blocks
        assert r["visited_fraction"] == pytest.approx(perplexity[(r["attention"], r["budget"])]["visited_fraction"])
    recall = {(r["layer"], r["attention"]): r["recall"] for r in rows}
    for layer in (0, 1):
        # centroid and quest visit the window's blocks and more: at least its attention mass, head by head
        for selector in ("centroid", "quest"):
            assert all(s >= w - 1e-9 for s, w in zip(recall[(layer, selector)], recall[(layer, "window")]))
        assert max(recall[(layer, "window")]) < 1.0


def test_summary_table(run):
    result = run["result"]
    table = study.summary_table(result)
    lines = table.splitlines()
    assert lines[0] == "| attention | budget | visited | bits/byte | 0-1k | passkey @128 |"
    assert lines[1] == "|" + " --- |" * 6
    assert len(lines) == 2 + len(CONFIGS)
    for line, row in zip(lines[2:], result["perplexity"]):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0] == row["attention"] and cells[1] == ("" if row["budget"] is None else str(row["budget"]))
        assert cells[2] == f"{row['visited_fraction']:.1%}" and cells[3] == f"{row['bits_per_byte']['all']:.3f}"
    assert table in run["printed"]  # main prints it


def test_per_query_head_reaches_every_selection(run, monkeypatch, tmp_path):
    """With --per-query-head every selection of the study (the backend's and the recall rows') gets
    per_query_head=True, the header records it, and centroid's perplexity moves from the default run's (the
    query heads of a key/value head choosing together)."""
    from topo_attn.integrations import transformers as tat
    from topo_attn.selection import select

    seen = []

    def spy(*args, **options):
        seen.append(options.get("per_query_head"))
        return select(*args, **options)

    monkeypatch.setattr(tat, "select", spy)
    monkeypatch.setattr(study, "select", spy)
    out = tmp_path / "per_head.json"
    root = run["root"]
    argv = ["--model", str(root / "model"), "--eval-set", str(root / "docs.npz"), "--length", str(LENGTH),
            "--block-size", str(BLOCK), "--budgets", str(BUDGET), "--probes", "1", "--documents", "2", "--batch", "2",
            "--selectors", "centroid", "--out", str(out), "--no-progress", "--device", DEVICE, "--dtype", "float32",
            "--no-speed", "--per-query-head"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert study.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["per_query_head"] is True and run["result"]["per_query_head"] is False
    assert seen and all(flag is True for flag in seen)
    assert {r["layer"] for r in result["recall"]} == {0, 1}  # the recall path selected too
    mine = rows_by_config(result["perplexity"])[("centroid", BUDGET)]["bits_per_byte"]["all"]
    together = rows_by_config(run["result"]["perplexity"])[("centroid", BUDGET)]["bits_per_byte"]["all"]
    assert abs(mine - together) > 1e-4


def test_a_run_cut_short_keeps_what_it_finished(run, monkeypatch, tmp_path):
    """--out is rewritten after each configuration, with ``partial`` saying what is missing: a run stopped in
    its second configuration keeps the first one's rows, one stopped in the recall rows keeps every
    configuration's; a complete run has no ``partial``."""
    assert "partial" not in run["result"]
    root = run["root"]
    out = tmp_path / "cut.json"
    argv = ["--model", str(root / "model"), "--eval-set", str(root / "docs.npz"), "--length", str(LENGTH),
            "--block-size", str(BLOCK), "--budgets", str(BUDGET), "--probes", "1", "--documents", "2", "--batch", "2",
            "--selectors", "centroid", "--out", str(out), "--no-progress", "--device", DEVICE, "--dtype", "float32",
            "--no-speed"]
    real, calls = study.passkey_scores, []

    def stopped_in_the_second(*args, **options):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # what a time limit's signal would be
        return real(*args, **options)

    monkeypatch.setattr(study, "passkey_scores", stopped_in_the_second)
    with pytest.raises(KeyboardInterrupt), contextlib.redirect_stdout(io.StringIO()):
        study.main(argv)
    kept = json.loads(out.read_text())
    assert kept["partial"] == "perplexity and retrieval of 1 of 3 configurations so far"
    assert [r["attention"] for r in kept["perplexity"]] == ["sdpa"]
    assert kept["perplexity"][0]["bits_per_byte"] == rows_by_config(run["result"]["perplexity"])[
        ("sdpa", None)]["bits_per_byte"]
    monkeypatch.setattr(study, "passkey_scores", real)

    def stopped(*args, **options):
        raise KeyboardInterrupt

    monkeypatch.setattr(study, "recall_rows", stopped)
    with pytest.raises(KeyboardInterrupt), contextlib.redirect_stdout(io.StringIO()):
        study.main(argv)
    kept = json.loads(out.read_text())
    assert kept["partial"] == "perplexity and retrieval done; the recall and speed rows not yet"
    assert [(r["attention"], r["budget"]) for r in kept["perplexity"]] == [
        ("sdpa", None), ("dense", None), ("centroid", BUDGET)]
    assert "recall" not in kept


def test_configurations():
    assert study.configurations([1, 2], ("window", "centroid")) == [
        ("sdpa", None), ("dense", None), ("window", 0), ("centroid", 1), ("centroid", 2)]
    # in the order of SELECTORS, whatever the order asked; no window unless asked
    assert study.configurations([3], ("quest", "centroid")) == [
        ("sdpa", None), ("dense", None), ("centroid", 3), ("quest", 3)]
    everything = study.configurations([2, 6])
    assert len(everything) == 3 + 2 * (len(study.SELECTORS) - 1)
    with pytest.raises(ValueError, match="bogus"):
        study.configurations([1], ("centroid", "bogus"))
    with pytest.raises(ValueError, match="dense"):
        study.configurations([1], ("dense",))  # not a selector of the list


def test_load_documents(tmp_path):
    docs = np.arange(3 * 40, dtype=np.uint8).reshape(3, 40)
    np.savez_compressed(tmp_path / "d.npz", documents=docs)
    assert np.array_equal(study.load_documents(tmp_path / "d.npz"), docs)
    assert np.array_equal(study.load_documents(tmp_path / "d.npz", 2, 16), docs[:2, :16])
    with pytest.raises(ValueError, match="at least \\[4, 40\\]"):
        study.load_documents(tmp_path / "d.npz", 4)
    with pytest.raises(ValueError, match="at least \\[3, 41\\]"):
        study.load_documents(tmp_path / "d.npz", length=41)


def test_main_rejects_an_unknown_selector(capsys):
    with pytest.raises(SystemExit):
        study.main(["--selectors", "bogus", "--device", "cpu"])
    assert "invalid choice: 'bogus'" in capsys.readouterr().err


def test_compile_reaches_the_speed_rows(monkeypatch):
    """``--compile MODE`` times the speed rows on ``torch.compile(model.forward, mode=MODE)``."""
    import argparse

    seen = []
    monkeypatch.setattr(study, "prefill_speed_rows", lambda *args, **options: seen.append(options["compile"]))
    args = argparse.Namespace(length=LENGTH, block_size=BLOCK, sinks=1, window=1, flex=False,
                              compile_mode="reduce-overhead")
    study.speed_rows(None, args)
    assert seen[0].func is torch.compile and seen[0].keywords == {"mode": "reduce-overhead"}
    parsed = study.build_parser().parse_args(["--compile", "default"])
    assert parsed.compile_mode == "default"


def test_selectors_choose_the_speed_rows(monkeypatch):
    """``--selectors`` keeps the speed rows of the kit's ``dense`` and of the selectors named; without it every
    selector is timed."""
    import argparse

    seen = []
    monkeypatch.setattr(study, "prefill_speed_rows", lambda *args, **options: seen.append(options["selectors"]))
    for chosen in (["quest", "topology"], None):
        args = argparse.Namespace(length=LENGTH, block_size=BLOCK, sinks=1, window=1, flex=False, selectors=chosen)
        study.speed_rows(None, args)
    assert seen == [("dense", "quest", "topology"), None]
    assert study.build_parser().parse_args(["--selectors", "quest"]).selectors == ["quest"]


def test_speed_rows_time_the_study_model_with_the_shared_prefill_timing(run, monkeypatch):
    """The speed section is topo_attn.prefill_speed's rows (those of the benchmark's model suite) for the study's
    own model: its heads, head dim and dtype, the study's length, block size, sinks and window (a stand-in timer
    and two selectors here: no GPU)."""
    import argparse

    from lm_standin import SPEED_FIELDS  # in tests/: the fields the speed figure is tested on

    from topo_attn import prefill_speed, selection

    times = iter(range(2, 100))

    def rows(*args, **options):  # the study's call, with a stand-in timer
        assert options["with_flex"] is False and options["sinks"] == 1 and options["window"] == 1
        assert options["compile"] is None  # no --compile
        return prefill_speed.prefill_speed_rows(*args, **options, median_ms=lambda fn: float(next(times)))

    monkeypatch.setattr(study, "prefill_speed_rows", rows)
    monkeypatch.setattr(selection, "names", lambda path=None: ("window", "quest"))
    args = argparse.Namespace(length=LENGTH, block_size=BLOCK, sinks=1, window=1, flex=False)
    model = LlamaForCausalLM.from_pretrained(run["root"] / "model", attn_implementation="sdpa").eval()
    found = study.speed_rows(model.to(DEVICE), args)
    assert [(r["attention"], r["budget"]) for r in found] == [
        (prefill_speed.FLOOR, None), ("sdpa", None), ("topo_attn dense", None), ("topo_attn window", 1),
        ("topo_attn quest", 1), ("topo_attn quest", prefill_speed.FIXED_BUDGET)]  # 8 blocks: n / 8 = 1
    assert all(set(r) == set(SPEED_FIELDS) for r in found)
    floor, sdpa, dense, *sparse = found
    assert {(r["case"], r["seq_len"], r["block_size"], r["heads"], r["kv_heads"], r["head_dim"], r["dtype"])
            for r in found} == {(f"kit LM S0k b{BLOCK}", LENGTH, BLOCK, HEADS, 2, 16, "float32")}
    assert dense["max_logit_diff"] < 1e-4 and dense["visited_fraction"] == 1.0 and sdpa["vs_sdpa"] == 1.0
    assert [r["ms"] for r in found] == [2.0, 3.0, 4.0, 5.0, 6.0, 7.0] and floor["attention_share"] == 0.0
    assert all(r["visited_fraction"] < 1.0 for r in sparse if r["budget"] == 1)
