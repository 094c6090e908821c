"""The ``model`` suite's CPU-side pieces: a tiny Llama through the whole case (the kit's backend in Triton's
interpreter, a stand-in timer; the rows from topo_attn.prefill_speed), the ratios and the markdown table."""

from __future__ import annotations

import math

import pytest
import torch

from topo_attn.bench.cases import SUITES, Case

pytest.importorskip("transformers", minversion="5")

TINY = dict(num_hidden_layers=2, intermediate_size=128, vocab_size=96)


def test_model_suite_is_the_issue_case():
    from topo_attn.bench.model import LLAMA_1B
    from topo_attn.prefill_speed import FIXED_BUDGET

    cases = SUITES["model"]
    assert [c.seq_len for c in cases] == [8192, 32768, 65536, 131072]
    for case in cases:
        assert (case.batch, case.heads, case.kv_heads, case.head_dim, case.block_size, case.dtype) == (
            1, 32, 8, 64, 64, "bfloat16")
        assert case.heads * case.head_dim == LLAMA_1B["hidden_size"] and case.topk is None
    assert LLAMA_1B == dict(num_hidden_layers=16, hidden_size=2048, intermediate_size=5632, vocab_size=32000)
    assert FIXED_BUDGET * 64 == 2048


def test_model_case_rows_on_a_tiny_model(device):
    """Every implementation runs on the same model (FlexAttention left out: it compiles), timed by the
    stand-in timer: the floor, SDPA, the kit's dense, then every selector at n / 8 and at the fixed budget;
    the dense backend's logits equal SDPA's, the sparse ones visit fewer blocks, and the attention share
    takes the floor out."""
    from topo_attn import selection
    from topo_attn.bench.model import MODEL_COLUMNS, model_markdown, run_model_case
    from topo_attn.prefill_speed import FLOOR

    timed = []
    times = {0: 1.0, 1: 3.0, 2: 2.0}

    def timer(fn):
        timed.append(fn().shape)
        return times.get(len(timed) - 1, 1.5)

    case = Case("tiny", 1, 4, 2, 160, 16, 16, "float32")  # 10 blocks: budgets n / 8 -> 1 and 32
    rows = run_model_case(case, timer, with_flex=False, device=device, shape=TINY)
    expected = [FLOOR, "sdpa", "topo_attn dense"] + [
        f"topo_attn {s}" for s in selection.names("block") for _ in ((1,) if s == "window" else (1, 32))]
    assert [r["attention"] for r in rows] == expected
    assert timed == [(1, 1, 96)] * len(rows)  # logits of the last position only
    floor, sdpa, dense, *sparse = rows
    assert math.isnan(sdpa["visited_fraction"]) and sdpa["max_logit_diff"] == 0.0 and sdpa["vs_sdpa"] == 1.0
    assert floor["attention_share"] == 0.0 and sdpa["attention_share"] == 1.0 and dense["attention_share"] == 0.5
    assert dense["visited_fraction"] == 1.0 and dense["max_logit_diff"] < 1e-4 and dense["floor_ms"] == 1.0
    assert [r["budget"] for r in sparse[:3]] == [1, 1, 32]  # window (no budget to vary), random at both
    assert all(r["visited_fraction"] < 1.0 for r in sparse if r["budget"] == 1)
    assert all(math.isnan(r["vs_flex"]) for r in rows)
    assert all(r["layers"] == 2 and r["hidden"] == 64 and r["transformers"] for r in rows)
    table = model_markdown(rows).splitlines()
    assert table[0] == "| " + " | ".join(MODEL_COLUMNS) + " |" and len(table) == 2 + len(rows)
    counted = sdpa.get("syncs")  # counted on a GPU only: None or NaN elsewhere
    syncs = "" if counted is None or math.isnan(counted) else f"{counted:.0f}"
    assert table[3] == f"| tiny | sdpa |  | 3.0 | 1.00x | 1.00 |  |  |  | {syncs} | 0.00e+00 |"


def test_model_case_with_some_selectors_keeps_the_floor_and_sdpa(device):
    from topo_attn.bench.model import run_model_case
    from topo_attn.prefill_speed import FLOOR

    case = Case("tiny", 1, 4, 2, 160, 16, 16, "float32")
    timed = iter(range(1, 100))
    rows = run_model_case(case, lambda fn: float(next(timed)), with_flex=False, device=device, shape=TINY,
                          selectors=("quest",))
    assert [(r["attention"], r["budget"]) for r in rows] == [(FLOOR, None), ("sdpa", None),
                                                             ("topo_attn quest", 1), ("topo_attn quest", 32)]
    assert rows[2]["vs_sdpa"] == 3.0 / 2.0 and rows[2]["floor_ms"] == 1.0  # ratios against this run's rows
    timed = iter(range(1, 100))
    rows = run_model_case(case, lambda fn: float(next(timed)), with_flex=False, device=device, shape=TINY,
                          selectors=("dense", "window"))
    assert [r["attention"] for r in rows] == [FLOOR, "sdpa", "topo_attn dense", "topo_attn window"]


def test_model_case_compiled_times_the_compiled_forward(device):
    """With ``compile``, every timed row runs the compiled forward (with a cache), FlexAttention is left out, a
    selector whose schedule waits for the host gets a skipped row, and the visited fraction and logits still
    come from the eager forward; the kit's calls go through the prefill op (the forward compiles whole)."""
    from topo_attn.bench.model import run_model_case
    from topo_attn.prefill_speed import FLOOR, SDPA_MASKED

    compiled_calls = []

    def compile(forward):
        compiled = torch.compile(forward, backend="eager", fullgraph=True)

        def run(*args, **kwargs):
            compiled_calls.append(kwargs.get("use_cache"))
            return compiled(*args, **kwargs)
        return run

    timed = []

    def timer(fn):
        timed.append(fn().shape)
        # floor, sdpa, sdpa with its mask, dense, topology_22 (sync-free: its schedule is padded), centroid
        return (1.0, 3.0, 3.5, 2.0, 2.2, 2.5)[len(timed) - 1]

    case = Case("tiny", 1, 4, 2, 160, 16, 16, "float32", topk=1)
    rows = run_model_case(case, timer, with_flex=True, device=device, shape=TINY,
                          selectors=("dense", "centroid", "topology_22", "oracle"), compile=compile)
    torch._dynamo.reset()
    assert [r["attention"] for r in rows] == [FLOOR, "sdpa", SDPA_MASKED, "topo_attn dense",
                                              "topo_attn topology_22", "topo_attn centroid", "topo_attn oracle"]
    # on a GPU each timed row also counts its compiled call's syncs and host time: as many more calls per row
    assert all(compiled_calls) and len(compiled_calls) % 6 == 0 and (len(compiled_calls) == 6) == (device == "cpu")
    assert timed == [(1, 1, 96)] * 6 and all(r["compiled"] for r in rows)
    assert "waits for the host" in rows[6]["skipped"] and math.isnan(rows[6]["ms"])
    assert rows[4]["ms"] == 2.2 and rows[4]["visited_fraction"] < 1.0
    assert rows[5]["visited_fraction"] < 1.0 and rows[5]["ms"] == 2.5 and rows[3]["max_logit_diff"] < 1e-4
    assert rows[2]["max_logit_diff"] < 1e-4 and rows[2]["vs_sdpa"] == 3.5 / 3.0  # the same attention, masked


def test_slow_selectors_are_left_out_of_long_cases(device, monkeypatch):
    from topo_attn import selection
    from topo_attn import prefill_speed
    from topo_attn.bench import model

    monkeypatch.setattr(prefill_speed, "SLOW_SELECTORS_UP_TO", 100)
    monkeypatch.setattr(selection, "names", lambda path=None: ("window", "oracle", "cluster"))
    case = Case("tiny", 1, 4, 2, 160, 16, 16, "float32")
    timed = iter(range(1, 100))
    rows = model.run_model_case(case, lambda fn: float(next(timed)), with_flex=False, device=device, shape=TINY)
    assert {r["selector"] for r in rows if r["skipped"]} == {"oracle", "cluster"}
    assert all(math.isnan(r["ms"]) and "wait for the host" in r["skipped"] for r in rows if r["skipped"])
    assert [r["ms"] for r in rows if not r["skipped"]] == [1.0, 2.0, 3.0, 4.0]  # floor, sdpa, dense, window


def pretend_gpu(monkeypatch) -> None:
    """The runner sees a CUDA GPU called "NVIDIA Test GPU" (the cases are stand-ins)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "NVIDIA Test GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)


def test_runner_runs_the_model_suite_on_a_pretend_gpu(monkeypatch, tmp_path):
    import json

    from topo_attn.bench import runner

    seen = []

    def fake(case, median_ms, with_flex=True, after_row=None, selectors=None, compile=None):
        seen.append((case.name, median_ms, with_flex, selectors))
        return [dict(case=case.name, attention="sdpa", budget=None, ms=1.0, vs_sdpa=1.0, vs_flex=float("nan"),
                     visited_fraction=float("nan"), max_logit_diff=0.0)]

    pretend_gpu(monkeypatch)
    monkeypatch.setattr(runner, "run_model_case", fake)
    out = tmp_path / "model.json"
    assert runner.main(["--suite", "model", "--no-flex", "--out", str(out), "--no-progress"]) == 0
    assert seen == [(c.name, runner.calls_median_ms, False, None) for c in SUITES["model"]]
    data = json.loads(out.read_text())
    assert data["suite"] == "model" and data["gpu"] == "NVIDIA Test GPU" and "torch" in data and "triton" in data
    assert data["command"] == f"python -m topo_attn.bench --suite model --no-flex --out {out}" and "commit" in data
    assert data["table"].splitlines()[2] == "| Llama-1B-shape B1 S8k b64 | sdpa |  | 1.0 | 1.00x |  |  |  |  |  | 0.00e+00 |"


def test_a_model_run_cut_short_keeps_the_rows_of_its_running_case(monkeypatch, tmp_path):
    """The runner rewrites the file after every row of a model case: a run stopped during its second case
    holds the first case's rows and the second's rows so far, marked partial."""
    import json

    from topo_attn.bench import runner

    cases = SUITES["model"][:2]

    def fake(case, median_ms, with_flex=True, after_row=None, selectors=None, compile=None):
        rows = []
        for attention in ("no attention", "sdpa", "topo_attn dense"):
            rows.append(dict(case=case.name, attention=attention, selector=None, budget=None, ms=2.0,
                             vs_sdpa=1.0, vs_flex=float("nan"), visited_fraction=float("nan"),
                             max_logit_diff=0.0))
            after_row(list(rows))
            if case is cases[1] and attention == "sdpa":
                raise KeyboardInterrupt  # the run's time limit
        return rows

    pretend_gpu(monkeypatch)
    monkeypatch.setattr(runner, "run_model_case", fake)
    out = tmp_path / "model.json"
    with pytest.raises(KeyboardInterrupt):
        runner.main(["--suite", "model", "--no-flex", "--out", str(out), "--no-progress", "--cases",
                     *(c.name.split()[2] for c in cases)])
    data = json.loads(out.read_text())
    assert [(r["case"], r["attention"]) for r in data["rows"]] == [
        (cases[0].name, "no attention"), (cases[0].name, "sdpa"), (cases[0].name, "topo_attn dense"),
        (cases[1].name, "no attention"), (cases[1].name, "sdpa")]
    assert data["partial"] == f"1 of 2 cases so far, and the rows of {cases[1].name} done so far"


def test_runner_passes_the_selectors_to_the_model_suite(monkeypatch, tmp_path):
    from topo_attn.bench import runner
    from topo_attn.cli import UsageError

    seen, compilers = [], []

    def fake(case, median_ms, with_flex=True, after_row=None, selectors=None, compile=None):
        seen.append(selectors)
        compilers.append(compile)
        return [dict(case=case.name, attention="sdpa", budget=None, ms=1.0, vs_sdpa=1.0, vs_flex=float("nan"),
                     visited_fraction=float("nan"), max_logit_diff=0.0)]

    pretend_gpu(monkeypatch)
    monkeypatch.setattr(runner, "run_model_case", fake)
    assert runner.main(["--suite", "model", "--cases", "S8k", "--selectors", "quest", "dense", "--out",
                        str(tmp_path / "m.json"), "--no-progress"]) == 0
    assert seen == [("quest", "dense")] and compilers == [None]
    assert runner.main(["--suite", "model", "--cases", "S8k", "--compile", "reduce-overhead", "--out",
                        str(tmp_path / "c.json"), "--no-progress"]) == 0
    assert compilers[1].func is torch.compile and compilers[1].keywords == {"mode": "reduce-overhead"}
    with pytest.raises(UsageError, match="--compile: applies to the model suite only"):
        runner.main(["--suite", "generate", "--compile", "default"])
    with pytest.raises(UsageError, match="--selectors: applies to the model and generate suites only"):
        runner.main(["--suite", "llm", "--selectors", "quest"])
    with pytest.raises(SystemExit):  # not a selector of the suite: argparse's choices
        runner.build_parser().parse_args(["--suite", "model", "--selectors", "bogus"])


def test_runner_passes_selectors_and_merges_to_the_generate_suite(monkeypatch, tmp_path):
    """``--selectors`` and ``--merges`` choose the generate suite's kit rows ('dense': its dense rows); a selector
    without a fixed-shape step, or ``--merges`` for another suite, is a usage error before anything runs."""
    import json

    from topo_attn.bench import runner
    from topo_attn.cli import UsageError

    seen = []

    def fake(case, selectors=None, dense=True, merges=("separate", "kernel"), after_row=None):
        seen.append((selectors, dense, merges))
        rows = [dict(case=case.name, attention=a, budget_tokens=None, ms_per_token=1.0, attention_ms=0.0,
                     vs_recipe=1.0, new_tokens=32) for a in ("no attention", "recipe")]
        after_row(rows[:1])
        raise KeyboardInterrupt  # the run's time limit, after the floor

    pretend_gpu(monkeypatch)
    monkeypatch.setattr(runner, "run_generate_case", fake)
    out = tmp_path / "g.json"
    with pytest.raises(KeyboardInterrupt):
        runner.main(["--suite", "generate", "--cases", "B8 S128k", "--selectors", "topology", "--merges",
                     "separate", "--out", str(out), "--no-progress"])
    assert seen == [(("topology",), False, ("separate",))]
    data = json.loads(out.read_text())  # the rows so far survive
    assert [r["attention"] for r in data["rows"]] == ["no attention"] and "partial" in data
    with pytest.raises(KeyboardInterrupt):
        runner.main(["--suite", "generate", "--cases", "B1 S32k", "--selectors", "dense", "quest", "--out",
                     str(out), "--no-progress"])
    assert seen[-1] == (("quest",), True, ("separate", "kernel"))
    with pytest.raises(UsageError, match="--selectors: the generate suite runs"):
        runner.main(["--suite", "generate", "--selectors", "topology_22"])
    with pytest.raises(UsageError, match="--merges: applies to the generate suite only"):
        runner.main(["--suite", "model", "--merges", "kernel"])


def test_idle_call_us_times_each_call_to_its_return():
    """The compiled rows' host time: the median over the calls of each call's own time (a call that sleeps
    2 ms or 4 ms in turn: at least 2000 us, and each call made once per measurement)."""
    import time

    from topo_attn.prefill_speed import idle_call_us

    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.002 * (1 + len(calls) % 2))

    us = idle_call_us(fn, calls=5)
    assert len(calls) == 5 and 2000 <= us < 1e6


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # functorch.compile's import path
@pytest.mark.parametrize("length", [4, 3])
def test_a_compiled_floor_keeps_the_query_and_key_projections(length):
    """The floor's attention takes the query and the key into an opaque op, so the compiler cannot drop their
    projections as dead code (an attention function that ignored them lost two of the three matmuls of this
    layer once AOT autograd had traced it); it returns each query head's first ``length`` values, compiled or
    not. (The generate suite's decode floor is the same op, with fewer queries than keys.)"""
    from functorch.compile import aot_module_simplified, make_boxed_func

    from topo_attn.prefill_speed import no_attention

    graphs = []

    def backend(gm, inputs):
        def keep(graph, _):
            graphs.append(graph)
            return make_boxed_func(graph.forward)
        return aot_module_simplified(gm, inputs, fw_compiler=keep)

    gen = torch.Generator().manual_seed(5)
    wq, wk, wv = torch.randn(8, 8, generator=gen), torch.randn(8, 4, generator=gen), torch.randn(8, 4, generator=gen)

    def layer(x):  # 2 query heads over 1 key/value head of 4 features, 4 keys
        q = (x[:, -length:] @ wq).view(1, length, 2, 4).transpose(1, 2)
        k, v = ((x @ w).view(1, 4, 1, 4).transpose(1, 2) for w in (wk, wv))
        return no_attention(None, q, k, v, None)[0]

    x = torch.randn(1, 4, 8, generator=gen)
    with torch.no_grad():
        got = torch.compile(layer, backend=backend, fullgraph=True)(x)
    assert sum("mm" in str(node.target) for node in graphs[0].graph.nodes) == 3
    want = (x @ wv)[:, :length, None, :].expand(1, length, 2, 4)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    torch.testing.assert_close(layer(x), want, atol=0, rtol=0)
