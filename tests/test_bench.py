"""The benchmark runner's CPU-side pieces: work counted in visited token pairs, suites, the table."""

from __future__ import annotations

import math

import pytest
import torch

import topo_attn as ta
from topo_attn.bench import SUITES, _visited_pairs, main, markdown


@pytest.mark.parametrize("seq_len,block_size", [(100, 16), (128, 32), (97, 64), (300, 32)])
def test_visited_pairs_count_the_token_mask(seq_len, block_size):
    assert _visited_pairs(ta.dense_causal_schedule(seq_len, block_size)) == seq_len * (seq_len + 1) // 2
    keys = torch.randn(seq_len, 8, generator=torch.Generator().manual_seed(seq_len))
    schedule = ta.topology_schedule(keys, block_size, window=0, sinks=1, topk=1)
    assert _visited_pairs(schedule) == int(schedule.to_token_mask().sum())


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
               max_abs_error=6e-4)
    table = markdown([row], "llm")
    assert "| B1 H32 S16k D128 b128 | 1554 / 8256 | 3.850 (572) | 1.040 (400) |" in table
    pr = markdown([row], "pr")
    assert pr.splitlines()[0].startswith("| seq | scheduled / dense blocks") and "| 16384 | 1554 / 8256 |" in pr
    assert not math.isnan(row["ours_tflops"])


def test_runner_needs_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("this checks the message on machines without CUDA")
    assert main(["--suite", "pr"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
