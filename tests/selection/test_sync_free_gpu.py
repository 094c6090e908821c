"""On a GPU, the sparse path waits for no host sync: selection over a whole sequence and the kernels it feeds
(``torch.cuda.set_sync_debug_mode("error")``), and a whole transformers model no more than with SDPA. The
float32 scores of the GPU path choose blocks as good as the float64 reference's, to float32 rounding."""

from __future__ import annotations

import pytest
import torch

import topo_attn as ta
from topo_attn import selection
from topo_attn.rule import base_block_mask
from topo_attn.schedule import CHECK_ENV

SYNC_FREE = selection.names("block", sync_free=True)


def _inputs(seed: int, seq: int = 2048, heads: int = 8, kv_heads: int = 2, dim: int = 64):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, seq, dim, generator=gen).to("cuda", torch.bfloat16)
    k = torch.randn(1, kv_heads, seq, dim, generator=gen).to("cuda", torch.bfloat16)
    v = torch.randn(1, kv_heads, seq, dim, generator=gen).to("cuda", torch.bfloat16)
    return q, k, v


@pytest.mark.cuda
@pytest.mark.parametrize("name", SYNC_FREE)
def test_selection_and_attention_wait_for_no_host_sync(name, monkeypatch):
    monkeypatch.setenv(CHECK_ENV, "0")  # validation reads the schedule back: off, as for a user
    q, k, v = _inputs(1)
    for strict in (False, True) if selection.SELECTORS[name].block_scores is not None else (False,):
        run = lambda: ta.scheduled_attention(q, k, v, selection.select(name, q, k, 64, 1, 1, 8, strict=strict))
        expected = run()  # compiles the kernels
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = run()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert torch.equal(out, expected)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["centroid", "quest", "topology", "topology_22", "random"])
def test_a_model_forward_syncs_no_more_than_with_sdpa(name, monkeypatch):
    from transformers import LlamaConfig, LlamaForCausalLM

    from topo_attn.prefill_speed import host_syncs
    from topo_attn.integrations import transformers as tat

    monkeypatch.setenv(CHECK_ENV, "0")
    config = LlamaConfig(vocab_size=128, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    ids = torch.randint(0, 128, (1, 4096), device="cuda")

    def forward():
        with torch.no_grad():
            return model(ids, logits_to_keep=1, use_cache=False).logits

    model.set_attn_implementation("sdpa")
    forward()
    own = host_syncs(forward)  # what the model does by itself
    model.set_attn_implementation(tat.register(name, block_size=64, budget=8, name=f"sync_{name}"))
    forward()
    assert host_syncs(forward) <= own
    assert tat.last_stats(f"sync_{name}")[0].visited_fraction < 0.5


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["centroid", "quest"])
def test_float32_scores_choose_as_well_as_float64(name):
    """Each row's chosen candidates score, in float64, within float32 rounding of the best ``budget`` ones."""
    q, k, _ = _inputs(2, seq=1024)
    budget, nb = 6, 16
    chosen = selection.select(name, q, k, 64, 1, 1, budget).to_block_mask().cpu()  # [1, 2, n, n]
    exact = selection.block_scores(name, q.cpu().double(), k.cpu().double(), 64)  # float64, per key/value head
    base = base_block_mask(nb, 1, 1)
    candidates = torch.ones(nb, nb, dtype=torch.bool).tril() & ~base
    scale = exact.abs().amax()
    for lane in range(2):
        for row in range(nb):
            pool = exact[0, lane, row][candidates[row]]
            if pool.numel() == 0:
                continue
            best = pool.topk(min(budget, pool.numel())).values.sum()
            got = exact[0, lane, row][chosen[0, lane, row] & candidates[row]].sum()
            assert float(best - got) <= 1e-3 * float(scale), (lane, row)


@pytest.mark.cuda
def test_quest_kernel_compiled_matches_float64():
    from topo_attn.selection.quest_kernel import quest_block_scores
    from topo_attn.selection.stats import key_block_bounds

    q, k, _ = _inputs(3, seq=1000)
    lo, hi = key_block_bounds(k, 64, torch.float32)
    out = quest_block_scores(q, lo, hi, 64, window=1)
    exact = selection.block_scores("quest", q.cpu().double(), k.cpu().double(), 64)
    nb = lo.shape[2]
    scored = torch.arange(nb)[None, :] < torch.arange(nb)[:, None] - 1
    torch.testing.assert_close(out.cpu().double()[..., scored], exact[..., scored], rtol=2e-3, atol=2e-2)
