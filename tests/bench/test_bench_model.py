"""The ``model`` suite's CPU-side pieces: a tiny Llama through the whole case (the kit's backend in Triton's
interpreter, a stand-in timer), the ratios and the markdown table."""

from __future__ import annotations

import math

import pytest
import torch

from topo_attn.bench.cases import SUITES, Case

pytest.importorskip("transformers", minversion="5")

TINY = dict(num_hidden_layers=2, intermediate_size=128, vocab_size=96)


def test_model_suite_is_the_issue_case():
    from topo_attn.bench.model import LLAMA_1B, SPARSE_SELECTORS

    case, = SUITES["model"]
    assert (case.batch, case.heads, case.kv_heads, case.head_dim, case.seq_len, case.block_size, case.dtype) == (
        1, 32, 8, 64, 16384, 64, "bfloat16")
    assert LLAMA_1B == dict(num_hidden_layers=16, hidden_size=2048, intermediate_size=5632, vocab_size=32000)
    assert case.heads * case.head_dim == LLAMA_1B["hidden_size"] and case.topk is None
    assert "centroid" in SPARSE_SELECTORS or "topology_22" in SPARSE_SELECTORS


def test_model_case_rows_on_a_tiny_model(device):
    """Every implementation runs on the same model (FlexAttention left out: it compiles), timed by the
    stand-in timer; the dense backend's logits equal SDPA's and the sparse ones visit fewer blocks."""
    from topo_attn.bench.model import MODEL_COLUMNS, SPARSE_SELECTORS, model_markdown, run_model_case

    timed = []

    def timer(fn):
        timed.append(fn().shape)
        return {0: 2.0, 1: 1.0}.get(len(timed) - 1, 0.5)

    case = Case("tiny", 1, 4, 2, 96, 16, 16, "float32")  # 6 blocks: budget n / 8 -> 1
    rows = run_model_case(case, timer, with_flex=False, device=device, shape=TINY)
    assert [r["attention"] for r in rows] == ["sdpa", "topo_attn dense"] + [f"topo_attn {s}" for s in SPARSE_SELECTORS]
    assert timed == [(1, 1, 96)] * len(rows)  # logits of the last position only
    sdpa, dense, *sparse = rows
    assert math.isnan(sdpa["visited_fraction"]) and sdpa["max_logit_diff"] == 0.0 and sdpa["vs_sdpa"] == 1.0
    assert dense["visited_fraction"] == 1.0 and dense["max_logit_diff"] < 1e-4 and dense["vs_sdpa"] == 0.5
    assert all(r["visited_fraction"] < 1.0 and r["budget"] == 1 for r in sparse)
    assert all(math.isnan(r["vs_flex"]) for r in rows)
    assert all(r["layers"] == 2 and r["hidden"] == 64 and r["transformers"] for r in rows)
    table = model_markdown(rows).splitlines()
    assert table[0] == "| " + " | ".join(MODEL_COLUMNS) + " |" and len(table) == 2 + len(rows)
    assert table[2] == "| tiny | sdpa | 2.0 | 1.00x |  |  | 0.00e+00 |"
    assert table[3].startswith("| tiny | topo_attn dense | 1.0 | 0.50x |  | 100.0% |")


def test_model_markdown_with_flex():
    from topo_attn.bench.model import model_markdown

    base = dict(case="Llama-1B-shape B1 S16k b64", max_logit_diff=0.03)
    rows = [dict(base, attention="sdpa", ms=300.0, vs_sdpa=1.0, vs_flex=1.5, visited_fraction=float("nan")),
            dict(base, attention="topo_attn centroid", ms=150.0, vs_sdpa=0.5, vs_flex=0.75, visited_fraction=0.17)]
    assert model_markdown(rows).splitlines()[3] == (
        "| Llama-1B-shape B1 S16k b64 | topo_attn centroid | 150.0 | 0.50x | 0.75x | 17.0% | 3.00e-02 |")


def test_runner_runs_the_model_suite_on_a_pretend_gpu(monkeypatch, tmp_path):
    import json

    from topo_attn.bench import runner

    seen = []

    def fake(case, median_ms, with_flex=True):
        seen.append((case.name, median_ms, with_flex))
        return [dict(case=case.name, attention="sdpa", ms=1.0, vs_sdpa=1.0, vs_flex=float("nan"),
                     visited_fraction=float("nan"), max_logit_diff=0.0)]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "NVIDIA Test GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(runner, "run_model_case", fake)
    out = tmp_path / "model.json"
    assert runner.main(["--suite", "model", "--no-flex", "--out", str(out), "--no-progress"]) == 0
    assert seen == [(SUITES["model"][0].name, runner.calls_median_ms, False)]
    data = json.loads(out.read_text())
    assert data["suite"] == "model" and data["gpu"] == "NVIDIA Test GPU" and "torch" in data and "triton" in data
    assert data["command"] == f"python -m topo_attn.bench --suite model --no-flex --out {out}" and "commit" in data
    assert data["table"].splitlines()[2] == "| Llama-1B-shape B1 S16k b64 | sdpa | 1.0 | 1.00x |  |  | 0.00e+00 |"
