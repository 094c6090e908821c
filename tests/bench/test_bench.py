"""The benchmark runner's CPU-side pieces: work counted in visited token pairs, suites, the tables."""

from __future__ import annotations

import math

import pytest
import torch

import topo_attn as ta
from topo_attn.bench.cases import SUITES, Case
from topo_attn.bench.kernel import kernel_markdown
from topo_attn.bench.runner import main
from topo_attn.bench.timing import visited_pairs


@pytest.mark.parametrize("seq_len,block_size", [(100, 16), (128, 32), (97, 64), (300, 32)])
def test_visited_pairs_count_the_token_mask(seq_len, block_size):
    assert visited_pairs(ta.dense_causal_schedule(seq_len, block_size)) == seq_len * (seq_len + 1) // 2
    keys = torch.randn(seq_len, 8, generator=torch.Generator().manual_seed(seq_len))
    schedule = ta.topology_schedule(keys, block_size, window=0, sinks=1, topk=1)
    assert visited_pairs(schedule) == int(schedule.to_token_mask().sum())
    for q_len in (1, 37, seq_len - 1):  # queries at the end of the keys: partial first rows
        assert visited_pairs(schedule.for_queries(q_len)) == int(schedule.for_queries(q_len).to_token_mask().sum())


def test_suites_cover_the_issue_cases():
    pr = SUITES["pr"]
    assert [c.seq_len for c in pr] == [1024, 2048, 4096]
    assert all(c.heads == 1 and c.head_dim == 64 and c.block_size == 64 and c.dtype == "float16" for c in pr)
    llm = SUITES["llm"]
    assert {(c.seq_len, c.block_size) for c in llm if c.heads == 32 and c.batch == 1 and c.kv_heads == 32} == {
        (s, b) for s in (4096, 16384, 32768, 65536) for b in (64, 128)}
    assert any(c.kv_heads == 8 and c.heads == 32 for c in llm)
    assert any(c.batch == 4 and c.seq_len == 8192 for c in llm)
    assert any(c.head_dim == 64 and c.heads == 16 for c in llm)


def test_markdown_rows():
    row = dict(case="B1 H32 S16k D128 b128", seq_len=16384, scheduled_blocks=1554, causal_blocks=8256,
               block_reduction=0.81, dense_masked_ms=1.0, sdpa_ms=3.85, ours_ms=1.04, dense_csr_ms=5.2,
               flex_ms=1.23, limit_ms=0.72, sdpa_tflops=572.0, ours_tflops=400.0, flex_tflops=340.0,
               ours_vs_sdpa_tflops=0.7, flex_over_ours_time=1.18, dense_csr_over_sdpa_time=1.35, build_ms=15.0,
               max_abs_error=6e-4, ours_host_us=17.25, ours_graph_ms=1.01)
    table = kernel_markdown([row], "llm")
    assert "| B1 H32 S16k D128 b128 | 1554 / 8256 | 3.850 (572) | 1.040 (400) |" in table
    pr = kernel_markdown([row], "pr")
    assert pr.splitlines()[0].startswith("| seq | scheduled / dense blocks") and "| 16384 | 1554 / 8256 |" in pr
    assert "Triton host us" in pr and "| 17.2 | 1.0100 |" in pr
    assert not math.isnan(row["ours_tflops"])


def test_runner_needs_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("this checks the message on machines without CUDA")
    assert main(["--suite", "pr"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_train_suite_cases():
    from topo_attn.bench.train import BACKWARD_WORK

    train = SUITES["train"]
    assert {(c.seq_len, c.block_size) for c in train if c.kv_heads == c.heads} == {
        (s, b) for s in (16384, 32768) for b in (64, 128)}
    assert all(c.batch == 1 and c.heads == 32 and c.head_dim == 128 and c.dtype == "bfloat16" for c in train)
    assert any(c.kv_heads < c.heads for c in train)
    assert BACKWARD_WORK == 2.5


TRAIN_ROW = dict(case="B1 H32 S16k D128 b64", scheduled_blocks=4670, causal_blocks=32896, sdpa_bwd_ms=10.0,
                 sdpa_bwd_tflops=550.0, ours_bwd_ms=2.0, ours_bwd_tflops=390.0, flex_bwd_ms=4.0,
                 flex_bwd_tflops=195.0, ours_vs_sdpa_bwd_tflops=0.71, flex_over_ours_bwd_time=2.0, sdpa_step_ms=14.0,
                 ours_step_ms=2.9, flex_step_ms=5.5, max_grad_rel_error=4e-3)


def test_train_markdown_rows():
    from topo_attn.bench.train import TRAIN_COLUMNS, train_markdown

    table = train_markdown([TRAIN_ROW]).splitlines()
    assert table[0] == "| " + " | ".join(TRAIN_COLUMNS) + " |"
    assert table[2] == ("| B1 H32 S16k D128 b64 | 4670 / 32896 | 10.000 (550) | 2.000 (390) | 4.000 (195) | 0.71 | "
                        "2.00x | 14.000 / 2.900 / 5.500 | 4.0e-03 |")


def test_train_markdown_marks_autotuned_flex():
    from topo_attn.bench.train import train_markdown

    assert "| 4.000 (195) autotuned | 0.71 |" in train_markdown([dict(TRAIN_ROW, flex_autotuned=True)])


def test_flex_is_autotuned_only_where_its_default_tiles_fail(capsys):
    """FlexAttention's times with its default tiles where they compile; else autotuned, the failure reported
    on stderr; NaN and None where both fail."""
    from topo_attn.bench.train import first_that_compiles

    tried = []

    def times(fails_when):
        def run(autotune):
            tried.append(autotune)
            if autotune in fails_when:
                raise RuntimeError(f"no tile (autotune={autotune})")
            return (1.0 + autotune, 2.0 + autotune)
        return run

    assert first_that_compiles(times(()), "case A") == ((1.0, 2.0), False) and tried == [False]
    tried.clear()
    assert first_that_compiles(times((False,)), "case B") == ((2.0, 3.0), True) and tried == [False, True]
    assert "FlexAttention (default tiles) failed on case B: RuntimeError: no tile" in capsys.readouterr().err
    (bwd, step), autotuned = first_that_compiles(times((False, True)), "case C")
    assert math.isnan(bwd) and math.isnan(step) and autotuned is None
    assert "FlexAttention (autotuned) failed on case C" in capsys.readouterr().err


def test_train_timing_helpers_on_the_interpreter(device):
    """The pieces of a train case that need no GPU: backward and forward + backward timed with gradients reset
    (a stand-in timer calls each function twice), and the gradient check on the first kv head's group."""
    from topo_attn.bench.timing import backward_and_step_ms
    from topo_attn.bench.train import max_grad_error

    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 96, 16, generator=gen).to(device).requires_grad_()
    k, v = (torch.randn(1, 2, 96, 16, generator=gen).to(device).requires_grad_() for _ in range(2))
    d_out = torch.randn(1, 4, 96, 16, generator=gen).to(device)
    schedule = ta.topology_schedule(k.detach(), 32, window=1, sinks=1, topk=1, shared_lane=(0, 0))
    ours = lambda q, k, v: ta.scheduled_attention(q, k, v, schedule)  # noqa: E731
    calls = []

    def twice(fn):
        fn()
        fn()
        calls.append(q.grad.clone())
        return 1.0

    ours(q, k, v).backward(d_out)
    once = q.grad.clone()
    assert backward_and_step_ms(ours, q, k, v, d_out, twice) == (1.0, 1.0)
    assert len(calls) == 2 and all(torch.equal(c, once) for c in calls)  # reset, not accumulated
    assert max_grad_error(q, k, v, d_out, schedule) < 1e-4
    q.grad = q.grad * 1.1
    assert 0.05 < max_grad_error(q, k, v, d_out, schedule) < 0.2


def test_select_suite_rows_on_a_small_input(device):
    """The select suite's rows on a tiny real-shaped input (timer stubbed: it only calls the function):
    every selector at every budget, finite metrics, the oracle's recall the highest at equal budget, and
    the dense-budget rows identical in blocks per row."""
    from topo_attn import selection
    from topo_attn.bench.select import run_select_case, select_markdown

    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, 96, 16, generator=gen).to(torch.float16) for _ in range(3))
    calls = []

    def timer(fn):
        calls.append(fn())
        return 1.5

    case = Case("tiny", 1, 2, 2, 96, 16, 16, "float16")
    rows = run_select_case(case, timer, budgets=(1, 2), device=device, qkv=(q, k, v, {"model": "random",
                                                                                        "layers": [0]}))
    assert {(r["selector"], r["budget"]) for r in rows} == {(s, b) for s in selection.SELECTORS for b in (1, 2)}
    for budget in (1, 2):
        at = {r["selector"]: r for r in rows if r["budget"] == budget}
        equal = [r for name, r in at.items() if name not in ("topology_22", "window")]
        assert len({round(r["blocks_per_row"], 9) for r in equal}) == 1
        assert all(at["oracle"]["recall"] >= r["recall"] - 1e-12 for r in at.values())
        assert all(0 < r["recall"] <= 1 + 1e-12 and r["total_ms"] == 3.0 for r in at.values())
    assert len(calls) == 1 + 2 * len(rows)  # SDPA once, then each build and attention
    assert select_markdown(rows).count("\n") == len(rows) + 1


# ------------------------------------------------------------------------- the runner's output and progress
FAKE_ROW = dict(scheduled_blocks=59, causal_blocks=136, block_reduction=0.57, dense_masked_ms=0.1, sdpa_ms=0.016,
                ours_ms=0.011, dense_csr_ms=0.02, flex_ms=0.03, limit_ms=0.0065, sdpa_tflops=8.2, ours_tflops=4.7,
                flex_tflops=1.0, ours_vs_sdpa_tflops=0.57, flex_over_ours_time=2.7, dense_csr_over_sdpa_time=1.25,
                build_ms=1.5, max_abs_error=1e-3, ours_host_us=12.0, ours_graph_ms=0.008)


def fake_gpu_runner(monkeypatch) -> list[str]:
    """The runner on a pretend GPU: CUDA reported present, and a kernel case that returns a fixed row at once
    (the names of the cases run are collected in the list returned)."""
    from topo_attn.bench import runner

    ran = []

    def fake_case(case, suite, median_ms, with_flex=True):
        ran.append(case.name)
        return {**FAKE_ROW, "case": case.name, "suite": suite, "seq_len": case.seq_len}

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "NVIDIA Test GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(runner, "run_kernel_case", fake_case)
    return ran


def test_runner_progress_leaves_the_table_and_the_json_alone(monkeypatch, capsys, tmp_path):
    """The bar goes to stderr and names each case; stdout (the markdown table) and the JSON file are
    byte-identical with and without it, and the stored command leaves out --no-progress."""
    import json

    from topo_attn.provenance import code_version

    ran = fake_gpu_runner(monkeypatch)
    out = tmp_path / "pr.json"
    assert main(["--suite", "pr", "--out", str(out), "--no-progress"]) == 0
    quiet, quiet_json = capsys.readouterr(), out.read_text()
    assert main(["--suite", "pr", "--out", str(out), "--progress"]) == 0  # (no terminal: a bar only when asked for)
    shown, shown_json = capsys.readouterr(), out.read_text()
    names = [c.name for c in SUITES["pr"]]
    assert ran == names + names
    expected_rows = [{**FAKE_ROW, "case": c.name, "suite": "pr", "seq_len": c.seq_len} for c in SUITES["pr"]]
    assert quiet.out == kernel_markdown(expected_rows, "pr") + "\n"  # the table only, as the formatter writes it
    assert shown.out == quiet.out and shown_json == quiet_json
    assert "suite pr" in shown.err and all(name in shown.err for name in names)  # the bar, naming each case
    assert not any(name in quiet.err for name in names) and "\r" not in shown.out
    data = json.loads(shown_json)
    assert data["command"] == f"python -m topo_attn.bench --suite pr --out {out}"
    assert data["table"] == quiet.out.rstrip("\n") and data["gpu"] == "NVIDIA Test GPU"
    assert {k: data[k] for k in code_version()} == code_version()  # the commit of this checkout


def test_run_cases_keeps_the_order_and_flattens_lists(capsys):
    from topo_attn.bench.runner import run_cases

    cases = [Case(f"c{i}", 1, 1, 1, 64, 16, 16, "float16") for i in range(3)]
    two_for_c1 = lambda c: [{"case": c.name}, {"case": c.name + "'"}] if c.name == "c1" else {"case": c.name}  # noqa: E731
    rows = run_cases(cases, two_for_c1, description="test suite")
    assert [r["case"] for r in rows] == ["c0", "c1", "c1'", "c2"]
    err = capsys.readouterr().err
    assert "test suite" in err and "c2" in err
    assert run_cases(cases, lambda c: {"case": c.name}, progress=False) == [{"case": f"c{i}"} for i in range(3)]
    assert capsys.readouterr().err == ""


def test_run_cases_reports_the_rows_after_each_case():
    """``after_case`` sees the rows so far and how many cases are done, so a run cut short keeps its rows."""
    from topo_attn.bench.runner import run_cases

    cases = [Case(f"c{i}", 1, 1, 1, 64, 16, 16, "float16") for i in range(3)]
    seen = []
    run_cases(cases, lambda c: {"case": c.name}, progress=False,
              after_case=lambda rows, done: seen.append(([r["case"] for r in rows], done)))
    assert seen == [(["c0"], 1), (["c0", "c1"], 2), (["c0", "c1", "c2"], 3)]
