"""The ``host`` suite's CPU-side pieces: every piece it times runs the real thing (the kernels in Triton's
interpreter, the backend as a model calls it), its rows and table, and the idle-GPU timer."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from topo_attn.bench.cases import SUITES, Case

TINY = Case("tiny layer", 1, 4, 2, 256, 16, 32, "float32", topk=2)


def test_host_suite_is_the_model_layer():
    cases = SUITES["host"]
    assert [c.seq_len for c in cases] == [8192, 32768] and all(c.topk == 32 for c in cases)
    assert all((c.batch, c.heads, c.kv_heads, c.head_dim, c.block_size, c.dtype) == (1, 32, 8, 64, 64, "bfloat16")
               for c in cases)


def test_host_case_times_each_piece_of_a_layer(device):
    """One row per piece, timed in three interleaved rounds by the stand-in timer (which keeps what the first
    round's call returned; the rows hold the median and the least of the rounds): the
    backend's dense call and the kernel on the dense schedule give SDPA's output, the sparse kernel runs
    centroid's schedule, and every selection is a schedule of the case's budget."""
    import pytest

    pytest.importorskip("transformers", minversion="5")
    from topo_attn.bench.host import HOST_COLUMNS, host_markdown, run_host_case
    from topo_attn.schedule import BlockSchedule
    from topo_attn.selection import names

    returned, order = {}, []

    def timer(fn):
        order.append(fn)
        if fn not in returned:  # the first round: keep what the call returned
            returned[fn] = fn()
        piece, round_ = list(returned).index(fn), order.count(fn) - 1
        return 10.0 * (piece + 1) + (2, 0, 1)[round_]  # distinct per piece; median +1, least +0

    rows = run_host_case(TINY, timer, device=device, rounds=3)
    selectors = names("block", sync_free=True)
    assert [r["piece"] for r in rows] == ["sdpa", "kernel dense", "kernel sparse",
                                         *[f"select {s}" for s in selectors], "backend dense",
                                         *[f"backend {s}" for s in selectors]]
    assert order == order[:len(rows)] * 3  # three rounds, each piece once per round, in turn
    out = dict(zip([r["piece"] for r in rows], returned.values()))
    sdpa = out["sdpa"]
    torch.testing.assert_close(out["kernel dense"], sdpa, rtol=1e-4, atol=1e-4)
    backend_dense, none = out["backend dense"]
    assert none is None
    torch.testing.assert_close(backend_dense, sdpa.transpose(1, 2), rtol=1e-4, atol=1e-4)
    for s in selectors:
        schedule = out[f"select {s}"]
        assert isinstance(schedule, BlockSchedule) and schedule.lanes == (1, 2)
    assert not torch.allclose(out["kernel sparse"], sdpa, atol=1e-3)  # a sparse schedule: another output
    assert all(r["sdpa_us"] == 11.0 and r["host_us"] == 10.0 * (i + 1) + 1 and r["host_us_min"] == 10.0 * (i + 1)
               and r["rounds"] == 3 and r["vs_sdpa"] == (10.0 * (i + 1) + 1) / 11.0 for i, r in enumerate(rows))
    assert {r["budget"] for r in rows if r["piece"].startswith("select")} == {2}
    table = host_markdown(rows).splitlines()
    assert table[0] == "| " + " | ".join(HOST_COLUMNS) + " |" and len(table) == 2 + len(rows)
    assert table[2] == "| tiny layer | sdpa |  | 11.0 | 10.0 | 1.0x |"


def test_idle_host_us_times_single_calls():
    from topo_attn.bench.timing import idle_host_us

    calls = []
    us = idle_host_us(lambda: calls.append(F.relu(torch.ones(4))), calls=7, warmup=2)
    assert len(calls) == 9 and us > 0
