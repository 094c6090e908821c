"""``topo_attn.compat`` runs code written against triton-lang/kernels#22: its tests, ported with only the
import changed (CPU inputs run in the interpreter here instead of being rejected), plus checks that the
results match the native API."""

from __future__ import annotations

import pytest
import torch

import topo_attn as ta
from topo_attn.compat import (build_dense_causal_block_schedule, build_topology_block_schedule,
                              dense_masked_attention, scheduled_attention)


def test_dense_causal_block_schedule_is_lower_triangular_csr():
    offsets, indices = build_dense_causal_block_schedule(4)
    assert offsets.dtype == indices.dtype == torch.int64
    assert offsets.tolist() == [0, 1, 3, 6, 10]
    assert indices.tolist() == [0, 0, 1, 0, 1, 2, 0, 1, 2, 3]


def test_topology_schedule_adds_persistent_block_outside_local_window():
    centroids = torch.tensor([[0.0, 0.0], [100.0, 0.0], [101.0, 0.0], [102.0, 0.0]])
    keys = centroids.repeat_interleave(2, dim=0)
    local_offsets, local_indices = build_topology_block_schedule(keys, block_size=2, local_radius_blocks=0,
                                                                 sink_blocks=0, topk_topology_blocks=0)
    topology_offsets, topology_indices = build_topology_block_schedule(keys, block_size=2, local_radius_blocks=0,
                                                                       sink_blocks=0, topk_topology_blocks=1)
    assert local_indices[local_offsets[3]:local_offsets[4]].tolist() == [3]
    assert topology_indices[topology_offsets[3]:topology_offsets[4]].tolist() == [0, 3]


def test_dense_causal_block_schedule_rejects_non_positive_block_count():
    with pytest.raises(ValueError, match="num_blocks"):
        build_dense_causal_block_schedule(0)


@pytest.mark.parametrize("name", ["local_radius_blocks", "sink_blocks", "topk_topology_blocks"])
def test_topology_block_schedule_rejects_negative_structural_parameters(name):
    keys = torch.empty((8, 4))
    params = dict(local_radius_blocks=0, sink_blocks=0, topk_topology_blocks=0)
    params[name] = -1
    with pytest.raises(ValueError, match=name):
        build_topology_block_schedule(keys, block_size=2, **params)


@pytest.mark.parametrize("block_size", [0, 24])
def test_scheduled_attention_rejects_bad_block_size(block_size):
    q = torch.randn((96, 32), dtype=torch.float16)
    offsets, indices = build_dense_causal_block_schedule(4)
    with pytest.raises(ValueError, match="block_size"):
        scheduled_attention(q, q, q, offsets, indices, block_size)


def test_scheduled_attention_rejects_unsupported_head_dimension():
    q = torch.randn((64, 24), dtype=torch.float16)
    offsets, indices = build_dense_causal_block_schedule(4)
    with pytest.raises(ValueError, match="head dimension"):
        scheduled_attention(q, q, q, offsets, indices, 16)


def test_scheduled_attention_rejects_mismatched_csr_offsets():
    q = torch.randn((64, 32), dtype=torch.float16)
    offsets, indices = build_dense_causal_block_schedule(3)
    with pytest.raises(ValueError, match="offsets"):
        scheduled_attention(q, q, q, offsets, indices, 16)


@pytest.mark.parametrize("which", ["offsets", "indices"])
def test_scheduled_attention_rejects_non_integer_schedule_tensors(which):
    q = torch.randn((64, 32), dtype=torch.float16)
    schedule = dict(zip(("offsets", "indices"), build_dense_causal_block_schedule(4)))
    schedule[which] = schedule[which].to(torch.float32)
    with pytest.raises(ValueError, match="integer"):
        scheduled_attention(q, q, q, schedule["offsets"], schedule["indices"], 16)


@pytest.mark.cuda
def test_scheduled_attention_rejects_cpu_schedule_for_cuda_inputs():
    q = torch.randn((64, 32), device="cuda", dtype=torch.float16)
    offsets, indices = build_dense_causal_block_schedule(4)
    with pytest.raises(ValueError, match="same device"):
        scheduled_attention(q, q, q, offsets, indices, 16)


def test_topology_schedule_preserves_key_device_for_direct_kernel_use(device):
    torch.manual_seed(3)
    q, k, v = (torch.randn((128, 32), device=device, dtype=torch.float16) for _ in range(3))
    offsets, indices = build_topology_block_schedule(k.float(), block_size=32, local_radius_blocks=1,
                                                     sink_blocks=1, topk_topology_blocks=1)
    assert offsets.device == k.device and indices.device == k.device
    expected = dense_masked_attention(q.float().cpu(), k.float().cpu(), v.float().cpu(), offsets.cpu(),
                                      indices.cpu(), 32)
    actual = scheduled_attention(q, k, v, offsets, indices, 32)
    torch.testing.assert_close(actual.float().cpu(), expected, rtol=3e-2, atol=3e-2)


def test_scheduled_attention_supports_batch_and_heads_and_keeps_dtype(device):
    torch.manual_seed(1)
    q, k, v = (torch.randn((2, 3, 128, 32), device=device, dtype=torch.float16) for _ in range(3))
    offsets, indices = build_topology_block_schedule(k[0, 0].float(), block_size=32, local_radius_blocks=1,
                                                     sink_blocks=1, topk_topology_blocks=1)
    actual = scheduled_attention(q, k, v, offsets.to(device), indices.to(device), 32)
    assert actual.dtype == q.dtype
    expected = torch.empty_like(q, dtype=torch.float64)
    for b in range(2):
        for h in range(3):
            expected[b, h] = dense_masked_attention(q[b, h].double(), k[b, h].double(), v[b, h].double(),
                                                    offsets.to(device), indices.to(device), 32)
    torch.testing.assert_close(actual.double(), expected, rtol=3e-2, atol=3e-2)


def test_builder_matches_native_topology_schedule():
    gen = torch.Generator().manual_seed(4)
    keys = torch.randn(512, 16, generator=gen)
    offsets, indices = build_topology_block_schedule(keys, 32, 2, 1, 3)
    native = ta.topology_schedule(keys, 32, window=2, sinks=1, topk=3)
    assert torch.equal(offsets, native.offsets.long()) and torch.equal(indices, native.indices.long())


def test_builder_matches_pr22_loop_on_random_keys():
    """#22's own rule, written out as its loop over query blocks (salience from the package, top-k from
    torch.topk on distinct random saliences), gives the same CSR."""
    gen = torch.Generator().manual_seed(8)
    keys = torch.randn(640, 8, generator=gen)
    block_size, radius, sinks, topk = 32, 1, 2, 4
    n = 640 // block_size
    salience = ta.block_salience(ta.block_centroids(keys, block_size))
    chosen = set(torch.topk(salience, k=topk).indices.tolist())
    offsets, indices = [0], []
    for qb in range(n):
        allowed = set(range(min(sinks, n))) | set(range(max(0, qb - radius), qb + 1))
        allowed |= {b for b in chosen if b <= qb}
        indices.extend(sorted(b for b in allowed if b <= qb))
        offsets.append(len(indices))
    got_offsets, got_indices = build_topology_block_schedule(keys, block_size, radius, sinks, topk)
    assert got_offsets.tolist() == offsets and got_indices.tolist() == indices


def test_builder_keeps_pr22_divisibility_rule():
    with pytest.raises(ValueError, match="divisible by block_size"):
        build_topology_block_schedule(torch.randn(100, 4), 32, 1, 1, 1)
