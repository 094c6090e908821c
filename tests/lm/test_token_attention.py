"""Token-granularity block selection (topo_attn.lm.token_attention): the attention output against a float64
reference that loops over tokens with explicitly computed scores, equal budgets across selectors, no
look-ahead through a tiny random Llama (and sdpa's logits when every candidate fits the budget), argument
errors, and ``python -m topo_attn.lm evaluate --granularity token`` end to end."""

from __future__ import annotations

import contextlib
import io
import json
import math

import numpy as np
import pytest
import torch

from helpers import DEVICE  # in tests/: the GPU where the compiled kernel runs, else the CPU (interpreter)
from topo_attn.lm import study
from topo_attn.lm import token_attention as tok
from topo_attn.lm.research import prefix_trees
from topo_attn.selection import candidate_counts
from topo_attn.selection.topk import choose_blocks
from topo_attn.selection.topology import prefix_saliences

transformers = pytest.importorskip("transformers", minversion="5")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

BLOCK = 16
SELECTORS = tok.TOKEN_SELECTORS
SIZES = [  # (L, sinks, window, budget, chunk): partial last blocks, chunks that cut blocks
    (100, 1, 1, 2, 37),
    (131, 2, 0, 3, 64),
]


def qkv(length: int, seed: int = 0, heads: int = 4, kv_heads: int = 2, dim: int = 16):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, length, dim, generator=gen, dtype=torch.float64)
    k = torch.randn(2, kv_heads, length, dim, generator=gen, dtype=torch.float64)
    k[..., :dim // 2] += 2 * torch.randn(2, kv_heads, length, 1, generator=gen, dtype=torch.float64)  # uneven blocks
    return q, k, torch.randn(2, kv_heads, length, dim, generator=gen, dtype=torch.float64)


# ------------------------------------------------------------------------------------------- reference
def reference_scores(selector: str, q_t: torch.Tensor, keys: torch.Tensor, t: int, n: int, scale: float,
                     random_row: torch.Tensor) -> list[float]:
    """Score of each key block ``0..n-1`` for the query ``q_t [D]`` at position ``t``, written out per block."""
    blocks = [keys[kb * BLOCK:(kb + 1) * BLOCK] for kb in range(n)]
    if selector == "centroid":
        return [float(q_t @ b.mean(0)) for b in blocks]
    if selector == "quest":
        return [float(torch.maximum(q_t * b.amax(0), q_t * b.amin(0)).sum()) for b in blocks]
    if selector == "oracle":
        probs = torch.softmax(scale * (keys[:t + 1] @ q_t), dim=0)
        return [float(probs[kb * BLOCK:(kb + 1) * BLOCK].sum()) for kb in range(n)]
    if selector == "random":
        return [float(x) for x in random_row]
    b_t = t // BLOCK  # topology: the elder-rule salience in the prefix tree of the blocks before the token's own
    if b_t == 0:
        return [0.0] * n
    prefix = prefix_trees(torch.stack([b.mean(0) for b in blocks[:b_t]])[None]).salience[0, b_t - 1]
    return [float(prefix[kb]) if kb < b_t else 0.0 for kb in range(n)]


def reference_visible(scores: list[float], t: int, sinks: int, window: int, budget: int) -> set[int]:
    """The key blocks token ``t`` sees: sinks and window, plus the ``budget`` best candidates (lower first)."""
    b_t = t // BLOCK
    always = {kb for kb in range(b_t + 1) if kb < sinks or kb >= b_t - window}
    candidates = [kb for kb in range(b_t) if kb not in always]
    ranked = sorted(candidates, key=lambda kb: (-scores[kb], kb))
    return always | set(ranked[:budget])


def reference_attention(selector, q, k, v, sinks, window, budget, seed=0):
    """Per batch, query head and token: the visible keys by the rules, a float64 masked softmax."""
    batch, heads, length, dim = q.shape
    group, n, scale = heads // k.shape[1], math.ceil(length / BLOCK), 1 / math.sqrt(dim)
    rand = torch.rand(batch, heads, length, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    out = torch.empty_like(q)
    for b in range(batch):
        for h in range(heads):
            keys, values = k[b, h // group], v[b, h // group]
            for t in range(length):
                scores = reference_scores(selector, q[b, h, t], keys, t, n, scale, rand[b, h, t])
                visible = reference_visible(scores, t, sinks, window, budget)
                seen = [j for j in range(t + 1) if j // BLOCK in visible]
                probs = torch.softmax(scale * (keys[seen] @ q[b, h, t]), dim=0)
                out[b, h, t] = probs @ values[seen]
    return out


@pytest.mark.parametrize("selector", SELECTORS)
@pytest.mark.parametrize("length, sinks, window, budget, chunk", SIZES)
def test_output_equals_the_reference(selector, length, sinks, window, budget, chunk):
    q, k, v = qkv(length, seed=length)
    settings = tok.TokenSettings(selector, BLOCK, sinks, window, budget, seed=0, chunk=chunk)
    out, visited, causal = tok.token_selection_attention(q, k, v, settings)
    want = reference_attention(selector, q, k, v, sinks, window, budget)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    blocks = torch.arange(length) // BLOCK
    assert causal == 2 * 4 * int((blocks + 1).sum())
    assert visited == int(tok.token_block_choice(q, k, settings).sum())


def test_the_reference_sees_a_wrong_choice():
    """The comparison above is sharp: another selector's blocks, or one block more, give other outputs."""
    q, k, v = qkv(100, seed=100)
    want = reference_attention("oracle", q, k, v, 1, 1, 2)
    for selector, budget in (("centroid", 2), ("oracle", 3)):
        got = tok.token_selection_attention(q, k, v, tok.TokenSettings(selector, BLOCK, 1, 1, budget))[0]
        assert (got - want).abs().max() > 1e-3


# ------------------------------------------------------------------------------------------ equal budget
@pytest.mark.parametrize("length, sinks, window, budget, chunk", SIZES + [(150, 1, 2, 50, 512)])
def test_every_token_sees_min_budget_candidates_more(length, sinks, window, budget, chunk):
    q, k, _ = qkv(length, seed=1)
    n = math.ceil(length / BLOCK)
    rows = slice(0, length)
    always, candidates = tok.block_candidates(rows, n, BLOCK, sinks, window)
    extra = torch.minimum(candidates.sum(-1), torch.tensor(budget))
    # per token, as many extra blocks as its query block's row in the block selectors (candidate_counts)
    assert torch.equal(extra, torch.minimum(candidate_counts(n, sinks, window), torch.tensor(budget))[
        torch.arange(length) // BLOCK])
    counts = {}
    for selector in SELECTORS:
        visible = tok.token_block_choice(q, k, tok.TokenSettings(selector, BLOCK, sinks, window, budget,
                                                                 chunk=chunk))
        assert visible.shape == (2, 4, length, n) and visible.dtype == torch.bool
        assert torch.equal(visible & always, always.expand_as(visible))  # sinks and window always
        chosen = visible & ~always
        assert not bool((chosen & ~candidates).any())  # only complete causal blocks outside them
        assert torch.equal(chosen.sum(-1), extra.expand(2, 4, length))
        counts[selector] = chosen
    # the selectors choose differently at equal budget, unless every candidate fits it
    distinct = len({tuple(c.flatten().tolist()) for c in counts.values()})
    assert distinct == (1 if budget >= int(candidates.sum(-1).max()) else len(SELECTORS))


def test_prefix_saliences_are_those_of_the_blocks_before():
    _, k, _ = qkv(131, seed=2)
    got = prefix_saliences(k, BLOCK)
    centroids = torch.stack([k[..., i:i + BLOCK, :].mean(-2) for i in range(0, 131, BLOCK)], dim=-2)
    assert got.shape == (2, 2, 9, 9) and got.dtype == torch.float64
    trees = prefix_trees(centroids[..., :8, :]).salience  # row b - 1: the blocks 0..b-1
    for b in range(9):
        want = trees[..., b - 1, :b] if b else torch.zeros(2, 2, 0, dtype=torch.float64)
        torch.testing.assert_close(got[..., b, :b], want, rtol=1e-12, atol=1e-12)
        assert not bool(got[..., b, b:].any())
    # blocks after b (and b itself) do not matter to row b
    changed = k.clone()
    changed[..., 4 * BLOCK:, :] = torch.randn_like(changed[..., 4 * BLOCK:, :])
    assert torch.equal(prefix_saliences(changed, BLOCK)[..., :5, :], got[..., :5, :])


def test_ties_go_to_the_lower_block():
    scores = torch.tensor([[0.0, 1.0, 1.0, 1.0, 2.0]])
    candidates = torch.tensor([[True, True, True, True, False]])
    assert choose_blocks(scores, candidates, 2).tolist() == [[False, True, True, False, False]]
    minus_inf = torch.full((1, 5), float("-inf"))
    assert choose_blocks(minus_inf, candidates, 2).tolist() == [[True, True, False, False, False]]


def test_token_mask():
    visible = torch.tensor([[True, False, True], [False, True, True]])
    mask = tok.token_mask(visible, slice(4, 6), 6, 2)  # tokens 4 and 5 of block 2
    assert mask.tolist() == [[True, True, False, False, True, False], [False, False, True, True, True, True]]


# ------------------------------------------------------------------------------ through a tiny Llama
@pytest.fixture(scope="module")
def llama() -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                         initializer_range=0.1, attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(torch.float32).eval()


def logits(model, ids: torch.Tensor, attention: str) -> torch.Tensor:
    model.set_attn_implementation(attention)
    with torch.no_grad():
        return model(ids).logits


LENGTH = 160
POSITIONS = (20, 47, 48, 100, 141)  # inside blocks, a block's last and first token


@pytest.mark.parametrize("selector", ("centroid", "quest", "oracle", "topology"))
def test_no_look_ahead(llama, selector):
    name = tok.register_token_selection(selector, BLOCK, 1, 1, 2, name=f"token_test_{selector}")
    ids = torch.randint(0, 256, (2, LENGTH), generator=torch.Generator().manual_seed(3))
    base = logits(llama, ids, name)
    assert (base - logits(llama, ids, "sdpa")).abs().max() > 1e-3  # sparse: not the dense result
    for t in POSITIONS:
        changed = ids.clone()
        changed[:, t + 1:] = torch.randint(0, 256, (2, LENGTH - t - 1), generator=torch.Generator().manual_seed(t))
        after = logits(llama, changed, name)
        torch.testing.assert_close(after[:, :t + 1], base[:, :t + 1], rtol=1e-6, atol=1e-6)
        assert (after[:, t + 1:] - base[:, t + 1:]).abs().max() > 1e-2  # the change is seen later
    stats = tok.last_stats(name)
    assert sorted(stats) == [0, 1] and all(s.lanes == 8 and s.seq_len == LENGTH for s in stats.values())
    blocks = torch.arange(LENGTH) // BLOCK
    per_token = torch.minimum(blocks + 1, torch.tensor(3 + 2))  # sink, window, diagonal and the budget
    assert all(s.visited_blocks == 8 * int(per_token.sum()) and s.causal_blocks == 8 * int((blocks + 1).sum())
               and s.visited_fraction == s.visited_blocks / s.causal_blocks for s in stats.values())


def test_pooled_selection_would_fail_the_look_ahead_check(llama):
    """A control: choosing per query block from the block's mean query (the block backend's centroid, here
    through the same masked SDPA) changes earlier logits when later bytes change."""
    from transformers import AttentionInterface

    from topo_attn.selection import select

    def pooled(module, query, key, value, attention_mask, scaling=None, **kwargs):
        schedule = select("centroid", query, key, BLOCK, 1, 1, 2, per_query_head=True)
        block_mask = schedule.to_block_mask()  # [B, H, n, n]
        mask = block_mask.repeat_interleave(BLOCK, -2).repeat_interleave(BLOCK, -1)[..., :LENGTH, :LENGTH]
        mask &= torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril()
        group = query.shape[1] // key.shape[1]
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key.repeat_interleave(group, 1), value.repeat_interleave(group, 1), attn_mask=mask, scale=scaling)
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register("token_test_pooled", pooled)
    ids = torch.randint(0, 256, (2, LENGTH), generator=torch.Generator().manual_seed(3))
    base = logits(llama, ids, "token_test_pooled")
    worst = 0.0
    for t in POSITIONS:
        changed = ids.clone()
        changed[:, t + 1:] = torch.randint(0, 256, (2, LENGTH - t - 1), generator=torch.Generator().manual_seed(t))
        worst = max(worst, float((logits(llama, changed, "token_test_pooled")[:, :t + 1]
                                  - base[:, :t + 1]).abs().max()))
    assert worst > 1e-3


@pytest.mark.parametrize("selector", SELECTORS)
def test_a_budget_over_every_candidate_gives_sdpa(llama, selector):
    name = tok.register_token_selection(selector, BLOCK, 1, 1, LENGTH, name="token_test_all")
    ids = torch.randint(0, 256, (2, LENGTH), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(logits(llama, ids, name), logits(llama, ids, "sdpa"), rtol=1e-5, atol=1e-5)
    assert all(s.visited_fraction == 1.0 for s in tok.last_stats(name).values())


# ---------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("kwargs, error, match", [
    (dict(selector="window"), ValueError, "selector"),
    (dict(selector="cluster"), ValueError, "selector"),
    (dict(selector=3), TypeError, "selector"),
    (dict(block_size=0), ValueError, "block_size"),
    (dict(block_size=16.0), TypeError, "block_size"),
    (dict(sinks=-1), ValueError, "sinks"),
    (dict(window=True), TypeError, "window"),
    (dict(budget=-2), ValueError, "budget"),
    (dict(budget=1.5), TypeError, "budget"),
    (dict(seed=-1), ValueError, "seed"),
    (dict(chunk=0), ValueError, "chunk"),
    (dict(name="my_sdpa"), ValueError, "name"),
    (dict(name=7), TypeError, "name"),
])
def test_register_rejects_bad_arguments(kwargs, error, match):
    arguments = dict(selector="centroid", block_size=BLOCK, sinks=1, window=1, budget=2) | kwargs
    with pytest.raises(error, match=match):
        tok.register_token_selection(**arguments)


def test_unregistered_name():
    with pytest.raises(KeyError, match="never_registered"):
        tok.last_stats("never_registered")


def test_bad_inputs():
    q, k, v = qkv(40)
    settings = tok.TokenSettings("centroid", BLOCK, 1, 1, 2)
    with pytest.raises(ValueError, match="multiple"):
        tok.token_selection_attention(q, k[:, :1].expand(2, 3, 40, 16), v[:, :1].expand(2, 3, 40, 16), settings)
    with pytest.raises(ValueError, match=r"\[B, H, L, D\]"):
        tok.token_selection_attention(q[0, 0], k[0, 0], v[0, 0], settings)
    with pytest.raises(ValueError, match="scale"):
        tok.token_selection_attention(q, k, v, settings, scale=0.0)


def test_decode_steps_and_padding_are_rejected(llama):
    from topo_attn.integrations.cache import CACHE_ARGUMENT, cache_argument

    name = tok.register_token_selection("quest", BLOCK, 1, 1, 2, name="token_test_decode")
    llama.set_attn_implementation(name)
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        cache = getattr(llama(ids[:, :39], use_cache=True), CACHE_ARGUMENT)
        with pytest.raises(ValueError, match="q_len == kv_len"):
            llama(ids[:, 39:], **cache_argument(cache), use_cache=True)
        with pytest.raises(ValueError, match="padding"):
            llama(ids, attention_mask=torch.cat([torch.zeros(1, 3), torch.ones(1, 37)], 1).long())


# ------------------------------------------------------------------------------------- the study driver
def test_study_with_token_granularity(tmp_path):
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                         initializer_range=0.1, attn_implementation="sdpa")
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(tmp_path / "model")
    documents = np.random.default_rng(0).integers(32, 127, (1, LENGTH)).astype(np.uint8)
    np.savez_compressed(tmp_path / "docs.npz", documents=documents)
    out = tmp_path / "result.json"
    argv = ["--model", str(tmp_path / "model"), "--eval-set", str(tmp_path / "docs.npz"), "--length", str(LENGTH),
            "--block-size", str(BLOCK), "--budgets", "1", "--probes", "1", "--documents", "1", "--batch", "1",
            "--granularity", "token", "--selectors", "quest", "centroid", "--out", str(out), "--no-progress",
            "--device", DEVICE, "--dtype", "float32"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert study.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["granularity"] == "token" and result["strict"] is False
    assert "recall" not in result and "speed" not in result and result["notes"] == [study.TOKEN_SKIPPED]
    assert f"note: {study.TOKEN_SKIPPED}" in printed.getvalue()
    rows = result["perplexity"]
    assert [(r["attention"], r["budget"]) for r in rows] == [("sdpa", None), ("dense", None), ("centroid", 1),
                                                             ("quest", 1)]
    assert all(r["granularity"] == "token" for r in rows + result["retrieval"])
    by = {r["attention"]: r for r in rows}
    assert by["dense"]["bits_per_byte"]["all"] == pytest.approx(by["sdpa"]["bits_per_byte"]["all"], rel=1e-4)
    blocks = LENGTH // BLOCK  # sink + window + diagonal + 1 per token: the block backend's fraction
    fraction = sum(min(r + 1, 4) for r in range(blocks)) / (blocks * (blocks + 1) // 2)
    for selector in ("centroid", "quest"):
        assert by[selector]["visited_fraction"] == pytest.approx(fraction)
        assert abs(by[selector]["bits_per_byte"]["all"] - by["sdpa"]["bits_per_byte"]["all"]) > 1e-3


@pytest.mark.parametrize("extra, match", [(["--strict"], "--strict"), (["--per-query-head"], "--per-query-head"),
                                          (["--selectors", "window"], "window")])
def test_study_rejects_what_token_granularity_lacks(extra, match):
    from topo_attn.cli import UsageError

    with pytest.raises(UsageError, match=match):  # (the command line prints its message: tests/test_cli.py)
        study.main(["--granularity", "token", "--device", "cpu", *extra])
