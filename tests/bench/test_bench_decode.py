"""The ``decode`` suite's CPU-side pieces: its cases, the 1/8 block mask, the bytes each call must read (hand
counts), FlexAttention's two decode calls (eager, against references), the copy bandwidth, the markdown with
its goal marks, the runner's dispatch, and a whole tiny case in Triton's interpreter with a stand-in timer
(that one waits on the kit's ``q_len`` schedule API)."""

from __future__ import annotations

import inspect
import json
import math

import pytest
import torch
import torch.nn.functional as F

import topo_attn as ta
from topo_attn.bench.cases import SUITES, Case
from topo_attn.bench.decode import (DECODE_COLUMNS, GOAL_SPEEDUP_KV_LEN, HBM_PEAK_TBPS, PATHS, decode_bytes, decode_markdown, device_copy_tbps, flex_decoders, metadata_bytes,
                                    one_in_eight_mask, peak_tbps_for, run_decode_case, scheduled_kv_reads)

HAS_DECODE_API = all("q_len" in inspect.signature(f).parameters
                     for f in (ta.dense_causal_schedule, ta.BlockSchedule.from_block_mask))
needs_decode_api = pytest.mark.skipif(
    not HAS_DECODE_API, reason="waits on the kit's decode API: dense_causal_schedule(..., q_len=1) and "
                               "BlockSchedule.from_block_mask(..., q_len=1) with lanes (B, H_kv)")


def test_decode_suite_is_the_issue_cases():
    cases = SUITES["decode"]
    assert {(c.batch, c.seq_len) for c in cases} == {(b, n) for b in (1, 8) for n in (32768, 131072)}
    assert len(cases) == 4 and len({c.name for c in cases}) == 4
    assert all((c.heads, c.kv_heads, c.head_dim, c.block_size, c.dtype) == (32, 8, 128, 64, "bfloat16")
               for c in cases)
    assert [c.name for c in cases] == ["B1 H32 kv8 q1 S32k D128 b64", "B1 H32 kv8 q1 S128k D128 b64",
                                       "B8 H32 kv8 q1 S32k D128 b64", "B8 H32 kv8 q1 S128k D128 b64"]
    assert max(c.seq_len for c in cases) == GOAL_SPEEDUP_KV_LEN and HBM_PEAK_TBPS == 4.8


def test_one_in_eight_mask():
    """nb // 8 blocks per (batch, kv head) lane: the sink, the last block and random others, different per
    lane and the same for the same seed; at least the sink and the last block when nb // 8 < 2."""
    mask = one_in_eight_mask(2, 8, 2048, torch.Generator().manual_seed(3))
    assert mask.shape == (2, 8, 1, 2048) and mask.dtype == torch.bool
    assert bool((mask.sum(-1) == 256).all()) and bool(mask[..., 0].all()) and bool(mask[..., -1].all())
    lanes = mask.reshape(16, 2048)
    assert len({tuple(lane.nonzero().flatten().tolist()) for lane in lanes}) == 16
    assert torch.equal(mask, one_in_eight_mask(2, 8, 2048, torch.Generator().manual_seed(3)))
    small = one_in_eight_mask(1, 2, 10)
    assert small[0, :, 0].nonzero()[:, 1].tolist() == [0, 9, 0, 9]
    assert one_in_eight_mask(1, 1, 1).tolist() == [[[[True]]]]
    assert one_in_eight_mask(1, 1, 24).sum() == 3


def test_scheduled_kv_reads_count_real_tokens():
    """Blocks and tokens read, by hand, on (square, prefill) schedules: the union over a lane's rows, the
    partial last block at its real size, a shared schedule once per kv lane, (B, H_kv) lanes their own, (B, H)
    lanes once per query head (or once per group when packed)."""
    dense = ta.dense_causal_schedule(300, 32)  # 10 blocks, the last of 300 - 9 * 32 = 12 tokens
    assert scheduled_kv_reads(dense, 2, 4, 2) == (2 * 2 * 10, 2 * 2 * 300)
    # per query head (1, 4): heads 0, 1 share kv head 0, heads 2, 3 kv head 1; rows are causal 3-block rows
    nb, mask = 3, torch.zeros(1, 4, 3, 3, dtype=torch.bool)
    mask[..., 0] = True  # sink in every row
    mask[0, 0, 2, 2] = mask[0, 1, 1, 1] = mask[0, 3, 2, 2] = True
    per_head = ta.BlockSchedule.from_block_mask(mask, 32, seq_len=80)  # last block: 80 - 64 = 16 tokens
    # per query head (the kit's kernel): heads read {0, 2}, {0, 1}, {0}, {0, 2}: 48 + 64 + 32 + 48
    assert scheduled_kv_reads(per_head, 1, 4, 2) == (7, 192)
    # packed: kv 0 reads {0, 1, 2} (32 + 32 + 16), kv 1 reads {0, 2} (32 + 16)
    assert scheduled_kv_reads(per_head, 1, 4, 2, packed_group=True) == (5, 128)
    per_kv = ta.BlockSchedule.from_block_mask(mask[:, ::2], 32, seq_len=80)  # lanes (1, 2) = (B, H_kv)
    assert scheduled_kv_reads(per_kv, 1, 4, 2) == (3, 80)  # heads 0 and 2: {0, 2} and {0}
    with pytest.raises(ValueError, match="neither"):
        scheduled_kv_reads(per_kv, 1, 6, 3)
    assert metadata_bytes(per_kv) == 4 * (2 * nb + 1) + 4 * per_kv.nnz
    q = torch.zeros(2, 4, 1, 16, dtype=torch.bfloat16)
    assert decode_bytes(q, 100, 16, 2, metadata=12) == 2 * 100 * 16 * 2 + 2 * 2 * 4 * 16 * 2 + 12


def test_flex_decoders_match_the_references():
    """FlexAttention's two decode calls (eager here, compiled on the GPU): dense with GQA equals SDPA; the
    1/8 call, the group packed as query rows, equals attention over each kv head's scheduled blocks; the
    block-mask bytes count the counts and the indices used."""
    gen = torch.Generator().manual_seed(5)
    B, H, H_kv, N, D, bs = 2, 4, 2, 300, 32, 32
    q = torch.randn(B, H, 1, D, generator=gen)
    k, v = (torch.randn(B, H_kv, N, D, generator=gen) for _ in range(2))
    mask = one_in_eight_mask(B, H_kv, 10)
    mask[0, 1, 0, 4] = mask[1, 0, 0, 6] = mask[1, 0, 0, 7] = True  # lanes differ
    calls = flex_decoders(q, k, v, mask, bs)
    assert list(calls) == ["flex", "flex 1/8"]
    dense_out = calls["flex"][0]()
    assert dense_out.shape == q.shape
    assert (dense_out - F.scaled_dot_product_attention(q, k, v, enable_gqa=True)).abs().max() < 1e-5
    tokens = mask[:, :, 0].repeat_interleave(bs, -1)[..., :N].repeat_interleave(H // H_kv, 1)  # [B, H, N]
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = (q @ kk.transpose(-1, -2) / math.sqrt(D)).masked_fill(~tokens[:, :, None], float("-inf"))
    reference = torch.softmax(scores, -1) @ vv
    sparse_out = calls["flex 1/8"][0]()
    assert sparse_out.shape == q.shape and (sparse_out - reference).abs().max() < 1e-5
    assert calls["flex"][1] == 2 * 4 + 10 * 4  # partial and full counts of [1, 1, 1], ten full indices
    assert calls["flex 1/8"][1] == 2 * B * H_kv * 4 + int(mask.sum()) * 4


def test_device_copy_tbps_is_measured_once():
    calls = []

    def timer(fn):
        fn()
        calls.append(1)
        return 0.5

    first = device_copy_tbps(timer, "cpu", 1 << 20)
    assert first == pytest.approx(2 * (1 << 20) / 0.5e-3 / 1e12)
    assert device_copy_tbps(timer, "cpu", 1 << 20) == first and len(calls) == 1  # cached


def _row(path: str, ms: float | None, **extra) -> dict:
    base = dict(case="B8 H32 kv8 q1 S128k D128 b64", path=path, scheduled_blocks=16384, kv_blocks=131072,
                bytes=1.0e9, ms=ms, failure=None, tbps=None, peak_fraction=None, copy_fraction=None,
                speedup_vs_sdpa=None, speedup_vs_flex=None, max_abs_error=None, select_ms=0.05,
                goal_bandwidth=True, goal_vs_sdpa=True, goal_vs_flex=False, goal_dense_vs_sdpa=False)
    return {**base, **extra}


def test_decode_markdown_marks_the_goals_on_their_rows():
    rows = [_row("sdpa", 2.0, tbps=4.3, peak_fraction=0.9, copy_fraction=1.05, speedup_vs_sdpa=1.0),
            _row("flex", None, failure="BackendCompilerFailed: boom"),
            _row("ours dense", 2.6, speedup_vs_sdpa=0.769, max_abs_error=3e-3),
            _row("ours 1/8", 0.3, tbps=3.6, peak_fraction=0.75, copy_fraction=0.88, speedup_vs_sdpa=6.67,
                 max_abs_error=4e-3)]
    table = decode_markdown(rows).splitlines()
    assert table[0] == "| " + " | ".join(DECODE_COLUMNS) + " |" and len(table) == 2 + len(rows)
    assert table[1].startswith("| --- | --- | ---: |")
    assert table[2] == ("| B8 H32 kv8 q1 S128k D128 b64 | sdpa | 16384 / 131072 | 1000.0 | 2.000 | 4.30 | 90% | "
                        "105% | 1.00x |  |  |  |  |  |  |  |")
    assert "| flex | 16384 / 131072 | 1000.0 | failed |  |" in table[3]
    assert table[4].endswith("| 0.77x |  | 3.0e-03 |  |  |  |  | ✗ |")
    assert table[5].endswith("| 0.300 | 3.60 | 75% | 88% | 6.67x |  | 4.0e-03 | 0.050 | ✓ | ✓ | ✗ |  |")


def test_runner_runs_the_decode_suite_on_a_pretend_gpu(monkeypatch, tmp_path):
    from topo_attn.bench import runner
    from topo_attn.bench.timing import graph_median_ms, median_ms

    timing_median_ms = median_ms
    seen = []

    def fake(case, median_ms, with_flex=True, select_step=None, select_timer=None, peak_tbps=None):
        assert callable(select_step) and select_timer is timing_median_ms
        assert peak_tbps == HBM_PEAK_TBPS  # a GPU not in the datasheet table: the H200's peak
        seen.append((case.name, median_ms, with_flex))
        return [_row("ours 1/8", 0.3, case=case.name)]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "NVIDIA Test GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(runner, "run_decode_case", fake)
    out = tmp_path / "decode.json"
    assert runner.main(["--suite", "decode", "--cases", "S128k", "--no-flex", "--out", str(out),
                        "--no-progress"]) == 0
    assert seen == [(c.name, median_ms, False) for c in SUITES["decode"] if "S128k" in c.name]
    data = json.loads(out.read_text())
    assert data["suite"] == "decode" and len(data["rows"]) == 2
    assert data["table"] == decode_markdown([_row("ours 1/8", 0.3, case=name) for name, *_ in seen])
    assert {row["timer"] for row in data["rows"]} == {"eager"}
    seen.clear()
    assert runner.main(["--suite", "decode", "--cases", "S128k", "--no-flex", "--out", str(out), "--no-progress",
                        "--timer", "graph"]) == 0
    assert [timer for _, timer, _ in seen] == [graph_median_ms] * len(seen) and seen
    assert json.loads(out.read_text())["rows"][0]["timer"] == "cuda graph replay"


@needs_decode_api
def test_decode_case_rows_on_the_interpreter(device):
    """A whole tiny case (B=2, H=4, H_kv=2, N=1200, D=32, blocks of 32, float32) with a stand-in timer: the
    rows of the three non-Flex paths, the bytes against a hand count, the errors, the ratios, the goals and
    the table. N = 37 * 32 + 16: 38 blocks, the last of 16 tokens; 1/8: 38 // 8 = 4 blocks per kv lane, the
    sink, the last and two random full ones."""
    times = iter([2.0, 2.2, 0.25, 0.125, 0.0625])  # sdpa, ours dense, ours 1/8, then select_step (twice)
    timed, selected = [], []

    def timer(fn):
        timed.append(fn())
        return next(times)

    def select_step(q, k):
        selected.append((q.shape, k.shape))
        return k.mean(dim=2)

    case = Case("tiny", 2, 4, 2, 1200, 32, 32, "float32")
    rows = run_decode_case(case, timer, with_flex=False, device=device, select_step=select_step, copy_tbps=2.0)
    assert [r["path"] for r in rows] == [p for p in PATHS if not p.startswith("flex")]
    assert len(timed) == 5 and selected == [((2, 4, 1, 32), (2, 2, 1200, 32))] * 2
    sdpa, dense, sparse = rows
    qo = 2 * (2 * 4 * 1 * 32 * 4)  # q and the output, float32
    kv_all = 2 * (2 * 2 * 1200 * 32 * 4)  # K and V, every token of the 4 kv lanes
    assert sdpa["bytes"] == kv_all + qo == 1_230_848
    # shared dense schedule: one row of 38 blocks: offsets [0, 38] and 38 indices, int32
    assert dense["metadata_bytes"] == 2 * 4 + 38 * 4 and dense["bytes"] == kv_all + qo + 160 == 1_231_008
    # 1/8 per (batch, kv head): 4 lanes x (3 full blocks of 32 + the last of 16) = 448 tokens; CSR of 4 rows
    assert sparse["kv_tokens"] == 448 and sparse["kv_bytes"] == 2 * 448 * 32 * 4
    assert sparse["metadata_bytes"] == 5 * 4 + 16 * 4
    assert sparse["bytes"] == 114_688 + qo + 84 == 116_820
    assert (sparse["scheduled_blocks"], sparse["kv_blocks"]) == (16, 152)
    assert sparse["scheduled_fraction"] == pytest.approx(16 / 152)
    assert all(r["max_abs_error"] < 2e-5 for r in rows)
    assert sparse["error_reference"].startswith("dense_masked_attention") and dense["error_reference"] == "sdpa float32"
    assert sparse["tbps"] == pytest.approx(116_820 / 0.25e-3 / 1e12)
    assert sparse["peak_fraction"] == pytest.approx(sparse["tbps"] / 4.8)
    assert sparse["copy_fraction"] == pytest.approx(sparse["tbps"] / 2.0)
    for r in rows:  # the case's comparisons, the same in every row
        shape = (r["batch"], r["heads"], r["kv_heads"], r["q_len"], r["kv_len"], r["head_dim"], r["block_size"])
        assert shape == (2, 4, 2, 1, 1200, 32, 32) and r["dtype"] == "float32" and r["case"] == "tiny"
        assert r["sdpa_over_ours_sparse"] == 8.0 and r["ours_dense_over_sdpa"] == pytest.approx(1.1)
        assert r["flex_over_ours_sparse"] is None and r["speedup_vs_flex"] is None and r["select_ms"] == 0.125
        assert r["select_timed_ms"] == 0.0625
        assert r["goal_bandwidth"] is False and r["goal_dense_vs_sdpa"] is True
        assert r["goal_vs_sdpa"] is None and r["goal_vs_flex"] is None  # 1200 keys: not the 128k goal
    assert [r["speedup_vs_sdpa"] for r in rows] == [1.0, pytest.approx(2.0 / 2.2), 8.0]
    table = decode_markdown(rows).splitlines()
    assert len(table) == 5 and table[4].startswith("| tiny | ours 1/8 | 16 / 152 | 0.1 | 0.250 |")
    assert table[3].endswith("| ✓ |") and table[4].endswith("| 0.125 | ✗ |  |  |  |")


def test_peak_bandwidth_follows_the_gpu_name():
    assert peak_tbps_for("NVIDIA H200") == 4.8
    assert peak_tbps_for("NVIDIA H100 80GB HBM3") == 3.35
    assert peak_tbps_for("NVIDIA Test GPU") == HBM_PEAK_TBPS
