"""The kit's backend over a static cache (topo_attn.integrations.static_cache.TopoStaticCache) on tiny Llama
models with random weights, the Triton kernels in the interpreter on the CPU: greedy generation gives the
tokens of SDPA (dense) and of the dynamic-cache path (sparse), a decode step traces whole under
torch.compile and serves every length, and what is not supported raises."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5")
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, StaticCache  # noqa: E402

from topo_attn.integrations import transformers as tat  # noqa: E402
from topo_attn.integrations.cache import TopoCache, cache_argument  # noqa: E402
from topo_attn.integrations.static_cache import TopoStaticCache  # noqa: E402

BLOCK = 16
VOCAB = 96


def tiny_llama(device, seed=0, **overrides) -> LlamaForCausalLM:
    """2 layers, hidden 64, 4 query and 2 key/value heads of dim 16, random weights (initializer range 0.1),
    float32."""
    config = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                  initializer_range=0.1, attn_implementation="sdpa")
    config.update(overrides)
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**config)).to(device).eval()


def token_ids(batch, seq_len, device, seed=1):
    return torch.randint(1, VOCAB, (batch, seq_len), generator=torch.Generator().manual_seed(seed)).to(device)


def greedy(model, ids, cache, new_tokens=12, **kwargs):
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                  return_dict_in_generate=True, output_logits=True, **kwargs)
    return model.generate(ids, **cache_argument(cache), **kwargs)


def test_dense_static_generation_gives_the_tokens_of_sdpa(device):
    model = tiny_llama(device)
    ids = token_ids(2, 37, device)
    want = greedy(model, ids, DynamicCache())
    model.set_attn_implementation(tat.register(selector="dense", block_size=BLOCK, name="topo_static_dense"))
    got = greedy(model, ids, TopoStaticCache(model.config, max_cache_len=64))
    assert torch.equal(got.sequences, want.sequences)
    for step, (a, b) in enumerate(zip(got.logits, want.logits)):
        assert (a - b).abs().max().item() <= 1e-4 * max(1.0, b.abs().max().item()), f"step {step}"


@pytest.mark.parametrize("selector,budget", [("quest", 1), ("centroid", 2)])
def test_sparse_static_generation_equals_the_dynamic_cache_path(selector, budget, device):
    """The fixed-shape step (static block statistics, the block table, static_decode) chooses and computes
    what the dynamic-cache step does (select_for_queries, the split-K decode), step by step."""
    model = tiny_llama(device)
    ids = token_ids(1, 70, device)
    model.set_attn_implementation(tat.register(selector=selector, block_size=BLOCK, budget=budget,
                                               name="topo_static_sparse"))
    want = greedy(model, ids, TopoCache(), new_tokens=16)
    assert tat.last_stats("topo_static_sparse")[0].visited_fraction < 1.0  # the steps were sparse
    got = greedy(model, ids, TopoStaticCache(model.config, max_cache_len=96), new_tokens=16)
    assert torch.equal(got.sequences, want.sequences)
    for step, (a, b) in enumerate(zip(got.logits, want.logits)):
        assert (a - b).abs().max().item() <= 1e-4 * max(1.0, b.abs().max().item()), f"step {step}"


def test_the_block_statistics_follow_the_cache(device):
    """After a prefill and steps, the kept statistics of every complete block are those of the cached keys."""
    from topo_attn.selection.stats import key_block_bounds
    from topo_attn.topology import block_centroids

    model = tiny_llama(device)
    model.set_attn_implementation(tat.register(selector="quest", block_size=BLOCK, budget=1,
                                               name="topo_static_sparse"))
    cache = TopoStaticCache(model.config, max_cache_len=80)
    greedy(model, token_ids(1, 40, device), cache, new_tokens=9)  # 48 tokens: 3 complete blocks
    for layer in cache.layers:
        state = getattr(layer.keys, tat.STATIC_STATE_ATTRIBUTE)
        assert int(state.length) == 48
        stats = state.block_stats(layer.keys, BLOCK)
        keys = layer.keys[:, :, :48].double()
        lo, hi = key_block_bounds(keys, BLOCK)
        torch.testing.assert_close(stats.centroids[:, :, :3].double(), block_centroids(keys, BLOCK, torch.float64),
                                   rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(stats.lo[:, :, :3].double(), lo, rtol=0, atol=1e-6)
        torch.testing.assert_close(stats.hi[:, :, :3].double(), hi, rtol=0, atol=1e-6)


@pytest.mark.parametrize("selector", ["quest", "topology"])
def test_every_statistics_buffer_is_a_static_address(selector, device):
    """Every tensor the statistics hold (the centroids, bounds, salience, the split counters, topology's kept
    rows) is marked as a static address: a compiled step mutates them, and CUDA graphs (``generate()``'s
    compiled step) are skipped for a mutated input that is not static."""
    model = tiny_llama(device)
    model.set_attn_implementation(tat.register(selector=selector, block_size=BLOCK, budget=1,
                                               name=f"topo_static_{selector}"))
    cache = TopoStaticCache(model.config, max_cache_len=64)
    greedy(model, token_ids(1, 40, device), cache, new_tokens=2)
    for layer in cache.layers:
        stats = getattr(layer.keys, tat.STATIC_STATE_ATTRIBUTE).stats[BLOCK]
        buffers = {name: value for name, value in vars(stats).items() if isinstance(value, torch.Tensor)}
        buffers.update({f"kept_tables{key}[{i}]": t for key, pair in stats.kept_tables.items()
                        for i, t in enumerate(pair)})
        assert {"centroids", "lo", "hi", "counters"} <= set(buffers) and (selector != "topology" or any(
            name.startswith("kept_tables") for name in buffers))
        for name, buffer in buffers.items():
            assert getattr(buffer, "_dynamo_static_input_type", None) is not None, f"{name} is not static"


def test_topology_steps_inside_generate_use_their_kept_rows(device, monkeypatch):
    """Through the backend and ``generate()``, each ``topology`` step runs the one-launch kernel with the kept rows
    the prefill made (forced on the CPU, where the kernel runs in Triton's interpreter): after the generation
    every lane's kept row was written at the last length, and the tokens are those of the torch path."""
    from topo_attn.selection import static_step

    if device == "cpu" and not static_step_kernel_interpreted():
        pytest.skip("the kernel runs on the CPU in Triton's interpreter only")
    model = tiny_llama(device)
    name = tat.register(selector="topology", block_size=BLOCK, budget=1, name="topo_static_kept")
    model.set_attn_implementation(name)
    ids = token_ids(1, 40, device)
    want = greedy(model, ids, TopoStaticCache(model.config, max_cache_len=80), new_tokens=20)  # the torch path
    monkeypatch.setattr(static_step, "_takes_kernel", lambda selector, stats, fused: fused is not False)
    cache = TopoStaticCache(model.config, max_cache_len=80)
    got = greedy(model, ids, cache, new_tokens=20)
    assert torch.equal(got.sequences, want.sequences)
    for layer in cache.layers:
        state = getattr(layer.keys, tat.STATIC_STATE_ATTRIBUTE)
        (kept, last), = state.stats[BLOCK].kept_tables.values()
        assert (last == int(state.length)).all(), (last, int(state.length))


def static_step_kernel_interpreted() -> bool:
    from topo_attn.selection.static_step_kernel import INTERPRETED

    return INTERPRETED


@pytest.mark.parametrize("selector", ["dense", "quest"])
def test_a_decode_step_compiles_whole_and_serves_every_length(selector, device):
    """torch.compile(fullgraph=True) of the model's one-token forward over a TopoStaticCache: no graph break,
    the logits of the eager step, and the next steps (other lengths) reuse the one graph."""
    from torch._dynamo.testing import CompileCounter

    model = tiny_llama(device)
    name = tat.register(selector=selector, block_size=BLOCK, budget=1, name=f"topo_static_{selector}")
    model.set_attn_implementation(name)
    ids = token_ids(1, 40, device)
    eager_cache = TopoStaticCache(model.config, max_cache_len=64)
    cache = TopoStaticCache(model.config, max_cache_len=64)
    with torch.no_grad():
        model(ids, **cache_argument(eager_cache))
        model(ids, **cache_argument(cache))  # the prefill, eager
        counter = CompileCounter()
        torch._dynamo.reset()
        step = torch.compile(model.forward, backend=counter, fullgraph=True)
        for position in range(40, 46):
            token = token_ids(1, 1, device, seed=position)
            want = model(token, **cache_argument(eager_cache)).logits
            got = step(token, **cache_argument(cache)).logits
            assert (got - want).abs().max().item() <= 1e-4 * max(1.0, want.abs().max().item()), position
    assert counter.frame_count == 1
    torch._dynamo.reset()


@pytest.mark.cuda
@pytest.mark.parametrize("selector", ["dense", "quest", "centroid", "topology"])
def test_a_compiled_sparse_step_makes_no_host_sync(selector, device):
    """The compiled one-token step over a TopoStaticCache (the static statistics' update and table in one
    launch, topology's kept rows, static_decode) runs under ``set_sync_debug_mode("error")``: no host sync at
    any length, block boundaries and completions included, and its logits equal the eager step's."""
    model = tiny_llama(device)
    name = tat.register(selector=selector, block_size=BLOCK, budget=1, name=f"topo_sync_free_{selector}")
    model.set_attn_implementation(name)
    ids = token_ids(1, 40, device)
    eager_cache = TopoStaticCache(model.config, max_cache_len=96)
    cache = TopoStaticCache(model.config, max_cache_len=96)
    torch._dynamo.reset()
    step = torch.compile(model.forward, fullgraph=True)
    with torch.no_grad():
        model(ids, **cache_argument(eager_cache))
        model(ids, **cache_argument(cache))  # the prefill, eager
        for position in range(40, 42):  # compile and warm up outside the check
            token, positions = token_ids(1, 1, device, seed=position), torch.tensor([[position]], device=device)
            model(token, position_ids=positions, **cache_argument(eager_cache))
            step(token, position_ids=positions, **cache_argument(cache))
        torch.cuda.synchronize()
        for position in range(42, 70):  # crosses the boundaries at 48 and 64
            token = token_ids(1, 1, device, seed=position)
            positions = torch.tensor([[position]], device=device)  # as generate() passes them, made before
            want = model(token, position_ids=positions, **cache_argument(eager_cache)).logits
            torch.cuda.set_sync_debug_mode("error")
            try:
                got = step(token, position_ids=positions, **cache_argument(cache)).logits
            finally:
                torch.cuda.set_sync_debug_mode("default")
            assert (got - want).abs().max().item() <= 1e-3 * max(1.0, want.abs().max().item()), position
    torch._dynamo.reset()


def test_a_plain_static_cache_raises(device):
    model = tiny_llama(device)
    model.set_attn_implementation(tat.register(selector="quest", block_size=BLOCK, budget=1,
                                               name="topo_static_sparse"))
    with pytest.raises(ValueError, match="TopoStaticCache"):
        model(token_ids(1, 20, device), **cache_argument(StaticCache(model.config, max_cache_len=32)))


def test_padding_into_a_static_cache_raises(device):
    model = tiny_llama(device)
    model.set_attn_implementation(tat.register(selector="dense", block_size=BLOCK, name="topo_static_dense"))
    ids = token_ids(1, 20, device)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with pytest.raises(ValueError, match="padding"):
        model(ids, attention_mask=mask, **cache_argument(TopoStaticCache(model.config, max_cache_len=32)))


def test_beam_search_and_batch_selection_raise(device):
    cache = TopoStaticCache(tiny_llama(device).config, max_cache_len=32)
    with pytest.raises(ValueError, match="beam"):
        cache.reorder_cache(torch.tensor([0]))
    with pytest.raises(ValueError, match="batch"):
        cache.batch_select_indices(torch.tensor([0]))


def reference_step(q, k, v, length, table, block_size, scale):
    """Float64 attention of ``q [B, H, L, D]`` at the end of the first ``length`` keys of ``k, v [B, H_kv, S, D]``,
    over the blocks of ``table [B, G, W]`` (``-1``: empty; None: every block), bottom-right causal."""
    batch, heads, q_len, dim = q.shape
    n = int(length)
    k, v = k[:, :, :n].double(), v[:, :, :n].double()
    group = heads // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    allowed = torch.ones(batch, heads, n, dtype=torch.bool)
    if table is not None:
        blocks = torch.arange(n) // block_size
        rows = table.long().cpu().repeat_interleave(heads // table.shape[1], 1)  # [B, H, W]
        allowed = (blocks[None, None, :, None] == rows[:, :, None, :]).any(-1)
    causal = torch.arange(n)[None, :] <= (n - q_len + torch.arange(q_len))[:, None]  # [L, n]
    mask = allowed[:, :, None, :].to(q.device) & causal.to(q.device)
    scores = (q.double() @ k.transpose(-1, -2)) * scale
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ v


@pytest.mark.parametrize("selector,budget", [("dense", 0), ("quest", 1), ("centroid", 2), ("topology", 1)])
def test_every_static_step_equals_the_float64_reference_with_its_blocks(selector, budget, device, monkeypatch):
    """Each one-token step of a greedy generation with a TopoStaticCache: the kernel's output equals float64
    attention over the blocks of that step's table (every block for dense)."""
    from topo_attn.attention import static_decode as module

    kernel, checked = module.static_decode, []

    def checking(q, k, v, length, table=None, block_size=64, scale=None, **kwargs):
        out = kernel(q, k, v, length, table, block_size, scale, **kwargs)
        want = reference_step(q, k, v, length, table, block_size, scale)
        assert (out.double() - want).abs().max().item() <= 1e-4 * max(1.0, want.abs().max().item())
        if table is not None:
            checked.append(int((table >= 0).sum(-1).max()))
        else:
            checked.append(None)
        return out

    monkeypatch.setattr(module, "static_decode", checking)
    model = tiny_llama(device)
    model.set_attn_implementation(tat.register(selector=selector, block_size=BLOCK, budget=budget,
                                               name="topo_static_checked"))
    greedy(model, token_ids(1, 100, device), TopoStaticCache(model.config, max_cache_len=128), new_tokens=8)
    assert len(checked) == 2 * 7  # every decode step (the prefill gives the first token) of both layers
    if selector != "dense":
        assert max(checked) == 1 + 1 + 1 + budget < 100 // BLOCK  # sink, window, own block, budget: sparse
