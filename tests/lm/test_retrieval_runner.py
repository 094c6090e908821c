"""``python -m topo_attn.lm retrieval`` (topo_attn.lm.retrieval_runner) end to end on a tiny random Llama saved to
disk, on the test device (float32): the JSON's fields and rows, n per cell, the intervals, the dense gate, the
plumbing of the scores (a scorer that always answers right gives accuracy 1), the loader, and one-line usage
errors."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from helpers import DEVICE, write_corpus
from topo_attn.lm import retrieval_runner
from topo_attn.lm.results import LM_RETRIEVAL_ROW_KEYS, load_lm_retrieval
from topo_attn.lm.retrieval import TASKS

transformers = pytest.importorskip("transformers", minversion="5")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

LENGTH, BLOCK, BUDGET, PROBES, DISTANCE = 1024, 64, 1, 2, 600
SELECTORS = ("topology", "centroid")
CONFIGS = [("sdpa", None), ("dense", None), ("topology", BUDGET), ("centroid", BUDGET)]


def documents(root, count: int) -> np.ndarray:
    """``count`` documents ``uint8 [count, LENGTH]``: windows of Python-like files (tests/helpers.write_corpus)."""
    write_corpus(root / "corpus", 40)
    text = b"\n".join(p.read_bytes() for p in sorted((root / "corpus").rglob("*.py")))
    assert len(text) >= count * LENGTH
    return np.frombuffer(text[:count * LENGTH], np.uint8).reshape(count, LENGTH).copy()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("retrieval")
    config = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=2048,
                         initializer_range=0.1, attn_implementation="sdpa")
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(root / "model")
    np.savez_compressed(root / "docs.npz", documents=documents(root, 3))
    return root


def argv(root, out, *extra) -> list[str]:
    return ["--model", str(root / "model"), "--eval-set", str(root / "docs.npz"), "--documents", "3",
            "--block-size", str(BLOCK), "--budgets", str(BUDGET), "--probes", str(PROBES), "--distances",
            str(DISTANCE), "--selectors", *SELECTORS, "--device", DEVICE, "--dtype", "float32", "--batch", "2",
            "--no-progress", "--out", str(out), *extra]


def run_main(args: list[str]) -> str:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert retrieval_runner.main(args) == 0
    return printed.getvalue()


@pytest.fixture(scope="module")
def run(setup):
    out = setup / "result.json"
    printed = run_main(argv(setup, out))
    return dict(printed=printed, result=json.loads(out.read_text()), path=out)


def test_header_and_rows(run):
    result = run["result"]
    assert result["suite"] == "lm_retrieval" and result["dtype"] == "float32"
    assert result["gpu"] == ("cpu" if DEVICE == "cpu" else torch.cuda.get_device_name(DEVICE))
    assert result["command"].startswith("python -m topo_attn.lm retrieval --model ")
    assert "commit" in result and "commit_source" in result and result["seconds"] > 0
    assert result["length"] == LENGTH and result["probes_per_cell"] == PROBES and result["granularity"] == "token"
    assert result["tasks"] == list(TASKS) and result["distances"] == [DISTANCE]
    assert "bootstrap" in result["interval"] and "Wilson" in result["interval"]
    rows = result["rows"]
    assert len(rows) == len(CONFIGS) * len(TASKS)
    assert {(r["attention"], r["budget"]) for r in rows} == set(CONFIGS)
    assert {(r["task"], r["distance"]) for r in rows} == {(t, DISTANCE) for t in TASKS}
    for r in rows:
        assert set(LM_RETRIEVAL_ROW_KEYS) <= set(r)
        assert r["n"] == PROBES
        assert r["ci_low"] <= r["accuracy"] <= r["ci_high"]
        assert r["wilson_low"] <= r["accuracy"] <= r["wilson_high"]
        assert 0 <= r["ci_low"] and r["ci_high"] <= 1
        assert r["selector"] == (None if r["attention"] in ("sdpa", "dense") else r["attention"])
        assert ("minus_dense" in r) == (r["selector"] is not None)
        assert 0 <= r["lookup_accuracy"] <= 1 and 0 <= r["copy_accuracy"] <= 1
    dense = {r["task"]: r["accuracy"] for r in rows if r["attention"] == "dense"}
    for r in rows:
        assert r["dense_reaches_90"] == (dense[r["task"]] >= 0.9)
    assert result["dense_gate"]["passed"] == all(a >= 0.9 for a in dense.values())
    assert "dense reaches 90%" in run["printed"]


def test_dense_agrees_with_sdpa(run):
    """The kit's dense backend and SDPA attend to the same bytes: the same greedy answers (a random model, so
    mostly wrong, but wrong alike)."""
    rows = run["result"]["rows"]
    sdpa = {r["task"]: r["accuracy"] for r in rows if r["attention"] == "sdpa"}
    assert sdpa == {r["task"]: r["accuracy"] for r in rows if r["attention"] == "dense"}


def test_loader(run, tmp_path):
    assert load_lm_retrieval(run["path"])["rows"] == run["result"]["rows"]
    broken = dict(run["result"], rows=[{k: v for k, v in r.items() if k != "ci_low"} for r in run["result"]["rows"]])
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    with pytest.raises(ValueError, match="ci_low"):
        load_lm_retrieval(tmp_path / "broken.json")
    (tmp_path / "other.json").write_text(json.dumps(dict(suite="lm_research", rows=[])))
    with pytest.raises(ValueError, match="retrieval suite"):
        load_lm_retrieval(tmp_path / "other.json")


def test_a_scorer_that_always_answers_right_gives_accuracy_1(setup, monkeypatch):
    calls = []

    def always_right(model, probes, batch=1):
        calls.append(len(probes))
        return [dict(distance=p.distance, loss=0.0, exact=True, lookups=2, lookups_right=2, copies=5, copies_right=5)
                for p in probes]

    monkeypatch.setattr(retrieval_runner, "passkey_scores", always_right)
    out = setup / "right.json"
    run_main(argv(setup, out, "--tasks", "multi_key", "plain_needle"))
    result = json.loads(out.read_text())
    assert calls == [2 * PROBES] * len(CONFIGS)  # every probe, once per configuration
    assert result["dense_gate"] == dict(threshold=0.9, passed=True, failing=[], formats="held_out")
    for r in result["rows"]:
        assert r["accuracy"] == 1 and r["n"] == PROBES and r["ci_high"] == 1 and r["dense_reaches_90"]
        assert r["lookup_accuracy"] == r["copy_accuracy"] == 1
        assert r.get("minus_dense", 0) == 0


def test_a_run_stopped_midway_keeps_what_it_measured(setup, monkeypatch):
    """The file is written after every configuration from dense on: a run stopped during the third one leaves
    sdpa's and dense's rows, marked incomplete with the rest listed as missing; a full run is complete."""
    calls = []

    def stops_at_the_third(model, probes, batch=1):
        calls.append(len(probes))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return [dict(distance=p.distance, loss=0.0, exact=i % 2 == 0, lookups=1, lookups_right=i % 2, copies=3,
                     copies_right=3) for i, p in enumerate(probes)]

    monkeypatch.setattr(retrieval_runner, "passkey_scores", stops_at_the_third)
    out = setup / "stopped.json"
    with pytest.raises(KeyboardInterrupt):
        run_main(argv(setup, out, "--tasks", "multi_key"))
    result = json.loads(out.read_text())
    assert result["complete"] is False
    assert result["missing"] == [list(c) for c in CONFIGS[2:]]
    assert {(r["attention"], r["budget"]) for r in result["rows"]} == set(CONFIGS[:2])
    assert all(r["n"] == PROBES for r in result["rows"])
    assert all(r["copy_accuracy"] == 1 and 0 < r["lookup_accuracy"] < 1 for r in result["rows"])


def test_a_full_run_is_complete(run):
    assert run["result"]["complete"] is True and run["result"]["missing"] == []


def test_the_training_formats_diagnostic(setup):
    """--formats training builds the probes in the tasks' training formats and says so in the file and the
    table; the default is the held-out formats."""
    from topo_attn.lm.retrieval import held_out_formats, training_formats

    out = setup / "training.json"
    printed = run_main(argv(setup, out, "--tasks", "multi_key", "--formats", "training"))
    result = json.loads(out.read_text())
    assert result["format_kind"] == "training" and result["dense_gate"]["formats"] == "training"
    assert result["formats"] == {"multi_key": list(training_formats("multi_key"))}
    assert "a diagnostic, not the gate" in printed
    docs = np.load(setup / "docs.npz")["documents"]
    probes = retrieval_runner.build_probes(docs, ["multi_key"], [DISTANCE], 4, seed=0, budget=1, block_size=BLOCK,
                                           formats="training")
    assert {p.format for p in probes} <= set(training_formats("multi_key"))
    assert not {p.format for p in probes} & set(held_out_formats("multi_key"))


def test_the_default_is_the_held_out_formats(run):
    assert run["result"]["format_kind"] == "held_out" and run["result"]["dense_gate"]["formats"] == "held_out"


def test_probes_use_held_out_formats_and_are_seeded(setup):
    docs = np.load(setup / "docs.npz")["documents"]
    a = retrieval_runner.build_probes(docs, ["multi_value"], [DISTANCE], 3, seed=1, budget=2, block_size=BLOCK)
    b = retrieval_runner.build_probes(docs, ["multi_value"], [DISTANCE], 3, seed=1, budget=2, block_size=BLOCK)
    assert [p.format for p in a] == ["dict", "arrow", "dict"]
    assert all(np.array_equal(x.ids, y.ids) for x, y in zip(a, b))
    assert all(len(p.ids) == LENGTH for p in a)


@pytest.mark.parametrize("extra, option", [
    (["--probes", "0"], "--probes"),
    (["--distances", "0"], "--distances"),
    (["--distances", "5000", "--length", "1024"], "--distances"),
    (["--budgets", "-1"], "--budgets"),
    (["--batch", "0"], "--batch"),
    (["--tasks", "nosuchtask"], "--tasks"),
    (["--selectors", "window"], "--selectors"),
    (["--model", "/nonexistent/model"], "--model"),
])
def test_bad_arguments_give_a_one_line_usage_error(extra, option, capsys):
    """In process, as ``python -m topo_attn.lm`` runs it (topo_attn.cli.run): exit 2, one error line naming the
    argument (argparse's own errors add a 'see --help' line), no traceback."""
    from topo_attn import cli
    from topo_attn.lm.__main__ import PROG, main

    try:
        code = cli.run(main, ["retrieval", "--device", "cpu", *extra], prog=PROG)
    except SystemExit as done:  # argparse's errors
        code = done.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert lines[0].startswith("python -m topo_attn.lm") and ": error: " in lines[0] and option in lines[0], lines
    assert len(lines) <= 2 and "Traceback" not in err


def test_usage_error_from_the_command_line():
    result = subprocess.run([sys.executable, "-m", "topo_attn.lm", "retrieval", "--distances", "0"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "python -m topo_attn.lm: error: argument --distances: distance must be >= 1, got 0"], result.stderr


def test_registered_as_a_subcommand():
    from topo_attn.lm.__main__ import SUBCOMMANDS, build_parser

    assert SUBCOMMANDS["retrieval"] == "retrieval_runner"
    assert "retrieval" in build_parser().format_help()  # (a '%' in a help text would break --help)
    args = build_parser().parse_args(["retrieval", "--tasks", "multi_key", "--budgets", "2", "6"])
    assert args.tasks == ["multi_key"] and args.budgets == [2, 6] and args.probes == 16
