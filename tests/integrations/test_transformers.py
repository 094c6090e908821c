"""The transformers attention backend (topo_attn.integrations.transformers) on tiny Llama models with random
weights (nothing downloaded), the Triton kernels in the interpreter on the CPU: logits and gradients against
the same model's SDPA, sparse selectors against ``dense_masked_attention`` with the same schedules, generation
with a KV cache, the statistics, and every unsupported setting raising."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

import topo_attn as ta
from helpers import TOLERANCE, padded_copy
from topo_attn import selection

transformers = pytest.importorskip("transformers", minversion="5")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from topo_attn.integrations import transformers as tat  # noqa: E402
from topo_attn.integrations.cache import CACHE_ARGUMENT, cache_argument  # noqa: E402

BLOCK = 16
VOCAB = 96
REFERENCE = "topo_attn_test_reference"  # a test-only attention function: dense_masked_attention, float64


def tiny_llama(dtype, device, seed=0, **overrides) -> LlamaForCausalLM:
    """2 layers, hidden 64, 4 query heads and 2 key/value heads of dim 16 (GQA), random weights (initializer
    range 0.1, so that attention is far from uniform and a wrong block changes the logits), SDPA attention."""
    config = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                  initializer_range=0.1, attn_implementation="sdpa")
    config.update(overrides)
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**config)).to(device, dtype).eval()


def token_ids(batch, seq_len, device, seed=1):
    """Random token ids in ``1..VOCAB-1`` (0 is the pad token given to ``generate``)."""
    return torch.randint(1, VOCAB, (batch, seq_len), generator=torch.Generator().manual_seed(seed)).to(device)


def logits_with(model, name, ids, **kwargs):
    model.set_attn_implementation(name)
    with torch.no_grad():
        return model(ids, **kwargs).logits.float()


def assert_close(got, want, dtype, what=""):
    """``|got - want| <= TOLERANCE[dtype] * max(1, max |want|)``: a few units of the dtype's rounding."""
    bound = TOLERANCE[dtype] * max(1.0, want.abs().max().item())
    err = (got - want).abs().max().item()
    assert err <= bound, f"{what}: max error {err:.3e} > {bound:.3e}"
    return err


def register_reference(selector, sinks, window, budget, dense_layers, schedules: dict, options=None):
    """Register the test's reference under :data:`REFERENCE`: per layer the schedule straight from the
    selection harness (``selection.select``, or every causal block for a dense layer), the attention by
    ``dense_masked_attention`` in float64, GQA by the reference. Records each layer's schedule."""

    def reference(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        assert attention_mask is None and query.shape[-2] == key.shape[-2]
        seq_len = query.shape[-2]
        if selector == "dense" or module.layer_idx in dense_layers:
            schedule = ta.dense_causal_schedule(seq_len, BLOCK, query.device)
        else:
            schedule = selection.select(selector, query, key, BLOCK, sinks, window, budget, scale=scaling,
                                        **(options or {}))
        schedules[module.layer_idx] = schedule
        out = ta.dense_masked_attention(query.double(), key.double(), value.double(), schedule, scale=scaling)
        return out.to(query.dtype).transpose(1, 2).contiguous(), None

    transformers.AttentionInterface.register(REFERENCE, reference)


# ------------------------------------------------------------------------------------------- dense vs sdpa
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dense_logits_equal_sdpa(dtype, device):
    name = tat.register(selector="dense", block_size=BLOCK, name="topo_dense")
    model = tiny_llama(dtype, device)
    ids = token_ids(2, 77, device)  # 77 tokens: not a multiple of the block size
    want = logits_with(model, "sdpa", ids)
    got = logits_with(model, name, ids)
    assert_close(got, want, dtype, "dense vs sdpa")
    stats = tat.last_stats(name)
    assert sorted(stats) == [0, 1]
    assert all(s.visited_fraction == 1.0 and s.path == "kernel" and s.lanes == 2 * 4 and s.q_len == 77
               for s in stats.values())
    # the same comparison sees a sparse schedule: the bound is tight enough to fail
    sparse = tat.register(selector="window", block_size=BLOCK, sinks=0, window=0, name="topo_window")
    assert (logits_with(model, sparse, ids) - want).abs().max() > 10 * TOLERANCE[dtype] * max(1, want.abs().max())


def test_dense_layers_run_on_the_dense_tiles_and_count_the_backend_blocks(device, monkeypatch):
    """A dense layer runs every causal block in blocks of DENSE_BLOCK_SIZE (the same attention, faster tiles);
    its statistics count the backend's blocks, as a sparse layer's do, so totals over mixed layers add up."""
    seen = []
    real = tat.scheduled_attention
    monkeypatch.setattr(tat, "scheduled_attention", lambda q, k, v, schedule, **kw: seen.append(
        (schedule.block_size, schedule.lanes)) or real(q, k, v, schedule, **kw))
    name = tat.register(selector="centroid", block_size=BLOCK, sinks=1, window=1, budget=1, dense_layers=(0,),
                        name="topo_mixed")
    model = tiny_llama(torch.float32, device)
    ids = token_ids(2, 150, device)
    logits_with(model, name, ids)
    assert seen == [(max(BLOCK, tat.DENSE_BLOCK_SIZE), None), (BLOCK, (2, 2))]  # layer 0 dense, layer 1 centroid
    stats = tat.last_stats(name)
    nb = ta.num_blocks(150, BLOCK)
    assert stats[0].scheduled_blocks == stats[0].causal_blocks == 2 * 4 * nb * (nb + 1) // 2
    assert stats[1].causal_blocks == stats[0].causal_blocks and stats[1].visited_fraction < 1.0


def test_model_built_with_the_name_in_its_config(device):
    name = tat.register(selector="dense", block_size=BLOCK, name="topo_dense")
    model = tiny_llama(torch.float32, device, attn_implementation=name)
    assert model.config._attn_implementation == name
    ids = token_ids(1, 40, device)
    with torch.no_grad():
        got = model(ids).logits
    assert_close(got, logits_with(model, "sdpa", ids), torch.float32, "config attn_implementation")


# ------------------------------------------------------------------- sparse vs the reference, same schedules
@pytest.mark.parametrize("selector", sorted(selection.SELECTORS))
def test_sparse_logits_equal_the_reference_with_the_same_schedules(selector, device):
    dtype, sinks, window, budget = torch.float32, 1, 1, 1
    name = tat.register(selector=selector, block_size=BLOCK, sinks=sinks, window=window, budget=budget,
                        name="topo_sparse")
    schedules = {}
    register_reference(selector, sinks, window, budget, (), schedules)
    model = tiny_llama(dtype, device)
    ids = token_ids(2, 90, device)  # 6 blocks, the last one partial
    got = logits_with(model, name, ids)
    want = logits_with(model, REFERENCE, ids)
    assert_close(got, want, dtype, selector)
    stats = tat.last_stats(name)
    for layer, schedule in schedules.items():
        assert schedule.lanes == (2, 2)  # one row-set per (batch, key/value head): the group chooses together
        nb = ta.num_blocks(90, BLOCK)
        assert stats[layer].scheduled_blocks == 2 * schedule.nnz  # each row-set serves the group's 2 query heads
        assert stats[layer].causal_blocks == 2 * 4 * nb * (nb + 1) // 2
        assert stats[layer].visited_fraction < 1.0  # sparse indeed
    dense = logits_with(model, "sdpa", ids)
    assert (got - dense).abs().max() > 10 * TOLERANCE[dtype]  # the schedule changes the result


def test_sparse_bfloat16_with_a_dense_layer(device):
    dtype = torch.bfloat16
    name = tat.register(selector="centroid", block_size=BLOCK, sinks=1, window=1, budget=1, dense_layers=(1,),
                        name="topo_sparse")
    schedules = {}
    register_reference("centroid", 1, 1, 1, (1,), schedules)
    model = tiny_llama(dtype, device)
    ids = token_ids(1, 100, device)
    assert_close(logits_with(model, name, ids), logits_with(model, REFERENCE, ids), dtype, "bf16 centroid")
    stats = tat.last_stats(name)
    assert stats[0].visited_fraction < 1.0 and stats[1].visited_fraction == 1.0
    assert stats[0].scheduled_blocks == 2 * schedules[0].nnz  # 4 query heads over 2 key/value heads


def test_a_padded_schedule_runs_and_counts_its_entries_only(device, monkeypatch):
    """A layer whose schedule is padded (topology_22's on a GPU, its entry count left on the device) gives the
    logits and the statistics of the exact schedule: the count is read back when the statistics are asked for."""
    name = tat.register(selector="topology_22", block_size=BLOCK, sinks=1, window=1, budget=2, name="topo_padded")
    model = tiny_llama(torch.float32, device)
    ids = token_ids(2, 100, device)
    want = logits_with(model, name, ids)
    want_stats, want_totals = tat.last_stats(name), tat.visited_totals(name)
    real, built = tat.schedule_for, []

    def padded(*args, **kwargs):
        built.append(padded_copy(real(*args, **kwargs), 13))
        return built[-1]

    monkeypatch.setattr(tat, "schedule_for", padded)
    tat.register(selector="topology_22", block_size=BLOCK, sinks=1, window=1, budget=2, name="topo_padded")
    got = logits_with(model, name, ids)
    assert len(built) == 2 and all(s.padded for s in built)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert tat.last_stats(name) == want_stats and tat.visited_totals(name) == want_totals
    assert want_stats[0].visited_fraction < 1.0


def test_per_query_head_selection_is_an_option(device):
    name = tat.register(selector="quest", block_size=BLOCK, sinks=1, window=1, budget=1, name="topo_per_head",
                        options={"per_query_head": True})
    schedules = {}
    register_reference("quest", 1, 1, 1, (), schedules, options={"per_query_head": True})
    model = tiny_llama(torch.float32, device)
    ids = token_ids(1, 70, device)
    assert_close(logits_with(model, name, ids), logits_with(model, REFERENCE, ids), torch.float32, "per head")
    assert all(schedule.lanes == (1, 4) for schedule in schedules.values())
    assert tat.last_stats(name)[0].scheduled_blocks == schedules[0].nnz


def test_registering_again_replaces_the_settings(device):
    name = tat.register(selector="dense", block_size=BLOCK, name="topo_again")
    model = tiny_llama(torch.float32, device)
    ids = token_ids(1, 64, device)
    logits_with(model, name, ids)
    assert tat.last_stats(name)[0].visited_fraction == 1.0
    assert tat.register(selector="window", block_size=BLOCK, sinks=0, window=1, name="topo_again") == name
    settings = tat.registered(name)
    assert (settings.selector, settings.sinks, settings.window) == ("window", 0, 1)
    assert tat.last_stats(name) == {}  # cleared
    with torch.no_grad():
        model(ids)  # the model follows the new settings without being switched again
    assert tat.last_stats(name)[0].scheduled_blocks == 4 * (1 + 2 + 2 + 2)  # 4 heads, 4 blocks: diagonal + one left


# --------------------------------------------------------------------------------- KV cache and generation
def test_chunked_prefill_is_bottom_right_causal(device):
    """A second chunk of 30 queries over a cache of 80 keys: the logits of the full-sequence SDPA forward."""
    name = tat.register(selector="dense", block_size=BLOCK, name="topo_dense")
    model = tiny_llama(torch.float32, device)
    ids = token_ids(2, 80, device)
    want = logits_with(model, "sdpa", ids)
    model.set_attn_implementation(name)
    with torch.no_grad():
        first = model(ids[:, :50], use_cache=True)
        second = model(ids[:, 50:], **cache_argument(getattr(first, CACHE_ARGUMENT)), use_cache=True)
    assert_close(first.logits, want[:, :50], torch.float32, "first chunk")
    assert_close(second.logits, want[:, 50:], torch.float32, "second chunk")
    stats = tat.last_stats(name)[1]
    assert (stats.path, stats.q_len, stats.kv_len, stats.visited_fraction) == ("kernel", 30, 80, 1.0)


def test_generate_dense_gives_the_tokens_of_sdpa(device):
    name = tat.register(selector="dense", block_size=BLOCK, name="topo_dense")
    model = tiny_llama(torch.float32, device)
    ids = token_ids(2, 40, device)
    kwargs = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    model.set_attn_implementation("sdpa")
    want = model.generate(ids, **kwargs)
    model.set_attn_implementation(name)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tat.DenseDecodeWarning)
        got = model.generate(ids, **kwargs)
    assert want.shape == (2, 52)
    assert torch.equal(got, want)
    stats = tat.last_stats(name)[0]
    assert (stats.path, stats.q_len, stats.kv_len, stats.visited_fraction) == ("decode kernel", 1, 51, 1.0)


def register_step_reference(settings: tat.Settings, schedules: list):
    """A test-only backend under :data:`REFERENCE`: the schedules the kit's backend would build (the selection
    harness for whole sequences, :func:`tat.step_schedule` for steps with fewer queries than keys), the
    attention by ``dense_masked_attention`` in float64. Records each step's schedule."""

    def reference(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if query.shape[-2] == key.shape[-2]:
            schedule = tat.schedule_for(settings, module.layer_idx, query, key, scaling)
        else:
            schedule = tat.step_schedule(settings, module.layer_idx, query, key)
        schedules.append(schedule)
        out = ta.dense_masked_attention(query.double(), key.double(), value.double(), schedule, scale=scaling)
        return out.to(query.dtype).transpose(1, 2).contiguous(), None

    transformers.AttentionInterface.register(REFERENCE, reference)
    from transformers.masking_utils import AttentionMaskInterface
    from functools import partial
    AttentionMaskInterface.register(REFERENCE, partial(tat.plain_causal_mask, REFERENCE))


@pytest.mark.parametrize("selector,budget", [("quest", 1), ("topology", 1), ("centroid", 2)])
def test_generate_sparse_steps_equal_the_reference(selector, budget, device):
    """Greedy generation with a TopoCache: every step's logits equal the float64 reference run with that
    step's schedule (one row-set per key/value head), and no step falls back to dense attention."""
    from topo_attn.integrations.cache import TopoCache, cache_argument

    name = tat.register(selector=selector, block_size=BLOCK, budget=budget, name="topo_generate")
    model = tiny_llama(torch.float32, device)
    ids = token_ids(1, 70, device)
    kwargs = dict(max_new_tokens=16, do_sample=False, pad_token_id=0, output_logits=True,
                  return_dict_in_generate=True)
    model.set_attn_implementation(name)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tat.DenseDecodeWarning)
        got = model.generate(ids, **cache_argument(TopoCache()), **kwargs)
    stats = tat.last_stats(name)[0]
    assert (stats.path, stats.kv_len) == ("decode kernel", 85) and stats.visited_fraction < 1.0
    assert stats.blocks_read == (1 if 85 % BLOCK == 0 else 0)  # the cache kept the earlier blocks' statistics
    schedules = []
    register_step_reference(tat.registered(name), schedules)
    model.set_attn_implementation(REFERENCE)
    want = model.generate(ids, **kwargs)
    assert torch.equal(got.sequences, want.sequences)
    for step, (a, b) in enumerate(zip(got.logits, want.logits)):
        assert_close(a.float(), b.float(), torch.float32, f"step {step}")
    steps = [s for s in schedules if s.q_len == 1]
    assert len(steps) == 15 * 2 and all(s.lanes == (1, 2) for s in steps)
    assert any(s.nnz < s.counts().causal_blocks for s in steps)


def test_generate_without_topo_cache_reads_every_block(device):
    """With transformers' DynamicCache the same schedules come from statistics of every cached block."""
    name = tat.register(selector="quest", block_size=BLOCK, budget=1, name="topo_generate")
    model = tiny_llama(torch.float32, device)
    ids = token_ids(1, 70, device)
    model.set_attn_implementation(name)
    model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert tat.last_stats(name)[0].blocks_read == 72 // BLOCK


def test_generate_without_incremental_form_warns_once(device):
    name = tat.register(selector="oracle", block_size=BLOCK, budget=1, name="topo_generate")
    model = tiny_llama(torch.float32, device)
    ids = token_ids(1, 48, device)
    model.set_attn_implementation(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
        again = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    ours = [w for w in caught if issubclass(w.category, tat.DenseDecodeWarning)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert "densely" in str(ours[0].message) and "'oracle'" in str(ours[0].message)
    assert out.shape == (1, 54) and torch.equal(again, out[:, :51])
    assert tat.last_stats(name)[0].path == "dense decode"
    with pytest.warns(tat.DenseDecodeWarning):  # registering again arms the warning again
        tat.register(selector="oracle", block_size=BLOCK, budget=1, name="topo_generate")
        model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0)


def test_topo_cache_forgets_on_crop_and_reorder(device):
    from topo_attn.integrations.cache import TopoCache

    cache = TopoCache()
    keys = torch.randn(2, 2, 40, 16)
    got, _ = cache.update(keys, keys, 0)
    stats = getattr(got, tat.BLOCK_STATS_ATTRIBUTE)(BLOCK).update(got)
    assert stats is cache.stats(0, BLOCK) and stats.complete == 2
    cache.reorder_cache(torch.tensor([1, 0]))
    assert stats.complete == 0 and stats.centroids is None
    stats.update(cache.layers[0].keys)
    cache.crop(-20)  # drop 20 tokens (the form both transformers 5.17 and 5.25 take)
    assert stats.complete == 0


# ------------------------------------------------------------------------------------------------ backward
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dense_gradients_equal_sdpa(dtype, device):
    name = tat.register(selector="dense", block_size=BLOCK, name="topo_dense")
    model = tiny_llama(dtype, device).train()
    ids = token_ids(2, 50, device)

    def grads(implementation):
        model.set_attn_implementation(implementation)
        model.zero_grad(set_to_none=True)
        model(ids, labels=ids).loss.backward()
        return {n: p.grad.float().clone() for n, p in model.named_parameters()}

    want, got = grads("sdpa"), grads(name)
    assert want.keys() == got.keys()
    attention = [n for n in want if "self_attn" in n]
    assert len(attention) == 2 * 4 and all(want[n].abs().max() > 0 for n in attention)
    for n in want:  # every weight, relative to its largest gradient entry
        assert_close(got[n] / want[n].abs().max(), want[n] / want[n].abs().max(), dtype, n)


def test_training_under_autocast_follows_sdpa(device):
    """A float32 model trained under bfloat16 autocast, as ``lm train`` runs (q and k float32 after the rotary
    embedding, v bfloat16): the kit's dense backend runs like SDPA (in bfloat16), and loss and gradients are
    SDPA's up to bfloat16 rounding."""
    name = tat.register(selector="dense", block_size=BLOCK, name="topo_dense_autocast")
    model = tiny_llama(torch.float32, device).train()
    ids = token_ids(2, 50, device)

    def run(implementation):
        model.set_attn_implementation(implementation)
        model.zero_grad(set_to_none=True)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            loss = model(ids, labels=ids).loss
        loss.backward()
        return loss.float(), {n: p.grad.float().clone() for n, p in model.named_parameters()}

    (want_loss, want), (got_loss, got) = run("sdpa"), run(name)
    assert_close(got_loss, want_loss, torch.bfloat16, "loss")
    for n in (n for n in want if "self_attn" in n):
        assert_close(got[n] / want[n].abs().max(), want[n] / want[n].abs().max(), torch.bfloat16, n)


def test_under_autocast_the_selection_reads_what_the_kernel_runs(device, monkeypatch):
    """Under bfloat16 autocast a float32 model's q and k reach the attention in float32 (the rotary embedding)
    and v in bfloat16: the selector is handed the bfloat16 q and k that the kernel then runs (not float32 ones,
    which Quest's kernel scores in IEEE float32)."""
    name = tat.register(selector="quest", block_size=BLOCK, budget=1, name="topo_quest_autocast")
    model = tiny_llama(torch.float32, device).train()
    model.set_attn_implementation(name)
    ids = token_ids(2, 50, device)
    seen, select = [], tat.select

    def spy(selector, q, k, *args, **kwargs):
        seen.append((q.dtype, k.dtype))
        return select(selector, q, k, *args, **kwargs)

    monkeypatch.setattr(tat, "select", spy)
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        loss = model(ids, labels=ids).loss
    assert seen == [(torch.bfloat16, torch.bfloat16)] * 2  # one selection per layer
    loss.backward()
    assert bool(torch.isfinite(loss)) and all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())


# ------------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("kwargs,argument", [
    (dict(selector="nope"), "selector"),
    (dict(selector="Dense"), "selector"),
    (dict(block_size=24), "block_size"),
    (dict(block_size=8), "block_size"),
    (dict(block_size=0), "block_size"),
    (dict(sinks=-1), "sinks"),
    (dict(window=-2), "window"),
    (dict(budget=-1), "budget"),
    (dict(dense_layers=(0, -1)), "dense_layers"),
    (dict(name="my_flash_attention"), "name"),
    (dict(name="sdpa_sparse"), "name"),
    (dict(name="flex_attention"), "name"),
    (dict(name="org/kernel"), "name"),
    (dict(name="paged|topo"), "name"),
    (dict(name="eager"), "name"),
    (dict(name=""), "name"),
    (dict(decode_merge="fused"), "decode_merge"),
])
def test_bad_settings_raise_naming_the_argument(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        tat.register(**{"block_size": BLOCK, **kwargs})


def test_bad_types_raise_type_errors():
    for kwargs in (dict(block_size=16.0), dict(budget="8"), dict(selector=None), dict(name=3),
                   dict(dense_layers=1), dict(options=[("seed", 1)]), dict(decode_merge=None)):
        with pytest.raises(TypeError):
            tat.register(**kwargs)
    with pytest.raises(KeyError, match="never_registered"):
        tat.last_stats("never_registered")


@pytest.fixture
def sparse_model(device):
    name = tat.register(selector="centroid", block_size=BLOCK, budget=1, name="topo_errors")
    return tiny_llama(torch.float32, device), name


def test_padding_mask_raises(sparse_model, device):
    model, name = sparse_model
    ids = token_ids(2, 40, device)
    mask = torch.ones_like(ids)
    logits_with(model, name, ids, attention_mask=mask)  # no padding: fine
    mask[1, :5] = 0
    with pytest.raises(ValueError, match="padding"):
        logits_with(model, name, ids, attention_mask=mask)


def test_a_4d_mask_raises(sparse_model, device):
    model, name = sparse_model
    ids = token_ids(1, 32, device)
    mask = torch.ones(1, 1, 32, 32, dtype=torch.bool, device=device).tril()
    with pytest.raises(ValueError, match="mask"):
        logits_with(model, name, ids, attention_mask=mask)


def test_packed_sequences_raise(sparse_model, device):
    model, name = sparse_model
    ids = token_ids(1, 40, device)
    position_ids = torch.cat([torch.arange(20), torch.arange(20)])[None].to(device)
    with pytest.raises(ValueError, match="packed"):  # (transformers looks for packing only without a cache)
        logits_with(model, name, ids, position_ids=position_ids, use_cache=False)


def test_dropout_in_training_raises(device):
    name = tat.register(selector="dense", block_size=BLOCK, name="topo_dense")
    model = tiny_llama(torch.float32, device, attention_dropout=0.1)
    ids = token_ids(1, 32, device)
    logits_with(model, name, ids)  # eval: no dropout, fine
    model.train()
    with pytest.raises(ValueError, match="dropout"):
        model(ids)


def test_static_cache_raises(sparse_model, device):
    model, name = sparse_model
    model.set_attn_implementation(name)
    with pytest.raises(ValueError, match="static"):
        model.generate(token_ids(1, 32, device), max_new_tokens=2, do_sample=False, pad_token_id=0,
                       cache_implementation="static")


def test_sliding_window_config_raises(device):
    from transformers import MistralConfig, MistralForCausalLM

    name = tat.register(selector="dense", block_size=BLOCK, name="topo_dense")
    config = MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=24,
                           attn_implementation=name)
    model = MistralForCausalLM(config).to(device).eval()
    with pytest.raises(ValueError, match="sliding"):
        with torch.no_grad():
            model(token_ids(1, 40, device))


def test_the_attention_function_checks_its_call(device):
    """The checks of the attention function itself, for models that call it without the mask function."""
    name = tat.register(selector="dense", block_size=BLOCK, name="topo_dense")
    fn = transformers.AttentionInterface()[name]
    q = torch.randn(1, 4, 32, 16, device=device)
    k = v = torch.randn(1, 2, 32, 16, device=device)

    class Module(torch.nn.Module):
        layer_idx, is_causal = 0, True

    for kwargs, match in ((dict(sliding_window=8), "sliding"), (dict(softcap=30.0), "softcap"),
                          (dict(dropout=0.1), "dropout")):
        with pytest.raises(ValueError, match=match):
            fn(Module(), q, k, v, None, **kwargs)
    bidirectional = Module()
    bidirectional.is_causal = False
    with pytest.raises(ValueError, match="causal"):
        fn(bidirectional, q, k, v, None)
    with pytest.raises(ValueError, match="more queries"):
        fn(Module(), q, k[..., :16, :], v[..., :16, :], None)
    out, weights = fn(Module(), q, k, v, None, scaling=0.3)
    assert weights is None and out.shape == (1, 32, 4, 16) and out.is_contiguous()
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)
    assert_close(out, want.transpose(1, 2), torch.float32, "direct call")


def test_import_topo_attn_does_not_import_transformers():
    code = ("import sys, topo_attn, topo_attn.integrations; "
            "assert 'transformers' not in sys.modules, 'transformers imported'; "
            "from topo_attn.integrations import transformers as tat; print('transformers' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"  # transformers loads on register(), not on import


@pytest.mark.cuda
def test_record_timings_gives_one_timing_per_layer_call():
    """On a GPU: record_timings then timings give one LayerTiming per layer of a forward, with positive host,
    schedule and kernel times, and the same logits as an untimed forward (the timed call only waits and records);
    timings starts over after it is read."""
    model = tiny_llama(torch.float16, "cuda")
    ids = token_ids(1, 8 * BLOCK, "cuda")
    name = tat.register(selector="centroid", block_size=BLOCK, sinks=1, window=1, budget=2, name="timed_centroid")
    untimed = logits_with(model, name, ids)
    tat.record_timings(name)
    timed = logits_with(model, name, ids)
    found = tat.timings(name)
    tat.record_timings(name, enabled=False)
    assert torch.equal(timed, untimed)
    assert [t.layer for t in found] == [0, 1]
    assert all(t.host_ms > 0 and t.select_ms > 0 and t.kernel_ms > 0 for t in found), found
    with pytest.raises(ValueError, match="not recorded"):
        tat.timings(name)
