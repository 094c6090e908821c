"""KV-cache eviction on a model (topo_attn.lm.evicted_model) and ``python -m topo_attn.lm eviction``
(topo_attn.lm.eviction_runner), on tiny random Llamas on the CPU: the restricted attention against a float64
brute force over exactly the kept tokens and those written since (alone, and through the whole model, with every
chunk's kept set replayed from the eviction API on the model's own keys and queries); memory at the budget as
blocks complete; no look-ahead; ``dense`` equal to the plain model; the JSON, its loader and one-line usage
errors."""

from __future__ import annotations

import contextlib
import io
import json
import math
from functools import partial

import numpy as np
import pytest
import torch

from helpers import write_corpus
from topo_attn import eviction
from topo_attn.eviction import POLICIES
from topo_attn.lm import eviction_runner
from topo_attn.lm.evaluate import token_losses
from topo_attn.lm.evicted_model import EvictedModel, kept_attention
from topo_attn.lm.results import LM_EVICTION_CELL_KEYS, LM_EVICTION_ROW_KEYS, load_lm_eviction
from topo_attn.lm.retrieval import TASKS

transformers = pytest.importorskip("transformers", minversion="5")
from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface  # noqa: E402

from topo_attn.integrations.transformers import plain_causal_mask  # noqa: E402

POLICY_NAMES = list(POLICIES)
LENGTH, BLOCK, PROBES = 1024, 64, 1  # the runner's run: 16 blocks, keep 4 and 2, prefix 512


def tiny_llama(layers: int = 2, seed: int = 0) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=2048,
                         initializer_range=0.1, attn_implementation="sdpa")
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).to(torch.float32).eval()


def random_ids(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(seed))


# --- the restricted attention, alone --------------------------------------------------------------------------


def brute_attention(q, k, v, visible, scale) -> torch.Tensor:
    """float64, a loop over lanes and queries: ``out[b, h, i]`` the softmax over the keys ``visible[b, h][i]``
    (absolute positions of ``k``, ``v``; query head ``h`` reads key/value head ``h // group``)."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i, keys in enumerate(visible[b][h]):
                keys = torch.tensor(keys)
                weights = torch.softmax(k[b, h // group, keys] @ q[b, h, i] * scale, dim=0)
                out[b, h, i] = weights @ v[b, h // group, keys]
    return out


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("written, new", [(97, 15), (96, 32), (130, 1)])
def test_kept_attention_equals_a_brute_force_over_the_kept_tokens(policy, written, new):
    """Fresh random keys: a policy's first choice over ``written`` tokens, the cache compacted, then ``new``
    tokens: each new query attends exactly to the kept tokens and the new ones up to itself."""
    gen = torch.Generator().manual_seed(written * 7 + new)
    batch, heads, kv_heads, dim, bs = 2, 4, 2, 8, 16
    k = torch.randn(batch, kv_heads, written + new, dim, generator=gen)
    v = torch.randn(batch, kv_heads, written + new, dim, generator=gen)
    q = torch.randn(batch, heads, written + new, dim, generator=gen)
    scale = dim ** -0.5
    choice = eviction.evict(policy, k[:, :, :written], bs, 3, sinks=1, window=1, queries=q[:, :, :written],
                            scale=scale, seed=3)
    got = kept_attention(q[:, :, written:], eviction.compact(k[:, :, :written], choice),
                         eviction.compact(v[:, :, :written], choice), k[:, :, written:], v[:, :, written:], scale)
    kept = eviction.positions(choice)  # [B, H_kv, cached]
    visible = [[[kept[b, h // 2].tolist() + list(range(written, written + i + 1)) for i in range(new)]
                for h in range(heads)] for b in range(batch)]
    want = brute_attention(q[:, :, written:], k, v, visible, scale)
    assert len(visible[0][0][0]) == choice.cached_tokens + 1 < written + 1  # something was evicted
    torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=2e-6)


def test_kept_attention_with_an_empty_cache_is_causal_attention():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 37, 8, generator=gen) for _ in range(3))
    got = kept_attention(q, k[..., :0, :], v[..., :0, :], k, v, 0.3)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    torch.testing.assert_close(got, want)


# --- through the model ---------------------------------------------------------------------------------------


def reference_forward(model, ids: torch.Tensor, prefix: int, visible: dict) -> tuple[torch.Tensor, dict]:
    """The model over all of ``ids`` at once, each layer's attention a float64 brute force: a prefix query sees
    the keys up to itself; a continuation query of chunk ``(start, end, kept)`` (of ``visible[layer]``) sees the
    positions ``kept`` marks before ``start`` and the chunk's up to itself. Returns the logits and, per layer,
    the (post-rotary) queries and keys."""
    length = ids.shape[1]
    captured = {}

    def attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        layer = module.layer_idx
        captured[layer] = (query, key)
        group = query.shape[1] // key.shape[1]
        mask = torch.ones(length, length, dtype=torch.bool).tril().expand(*key.shape[:2], length, length).clone()
        for start, end, kept in visible[layer]:
            mask[:, :, start:end, :start] = kept[:, :, None, :]
        mask = mask.repeat_interleave(group, dim=1)
        logits = query.double() @ key.double().repeat_interleave(group, 1).transpose(-1, -2) * scaling
        weights = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
        out = weights @ value.double().repeat_interleave(group, 1)
        return out.to(query.dtype).transpose(1, 2).contiguous(), None

    AttentionInterface.register("eviction_reference", attend)
    AttentionMaskInterface.register("eviction_reference", partial(plain_causal_mask, "eviction_reference"))
    model.set_attn_implementation("eviction_reference")
    try:
        with torch.no_grad():
            logits = model(ids).logits
    finally:
        model.set_attn_implementation("sdpa")
    return logits, captured


def replayed_masks(policy: str, captured: dict, prefix: int, length: int, keep: int, bs: int) -> dict:
    """Per layer, the kept positions before each continuation chunk, from the eviction API alone on the layer's
    keys and queries: the first choice over the prefix, then after each chunk the choice again over the compact
    cache followed by the chunk (h2o: all the chunk's queries; snapkv: the last 32 of them)."""
    ends = list(range((prefix // bs + 1) * bs, length, bs)) + [length]
    masks = {}
    for layer, (q, k) in captured.items():
        choice = eviction.evict(policy, k[:, :, :prefix], bs, keep, sinks=1, window=1, queries=q[:, :, :prefix],
                                scale=k.shape[-1] ** -0.5, seed=0)
        cache, start, masks[layer] = eviction.compact(k[:, :, :prefix], choice), prefix, []
        for end in ends:
            masks[layer].append(eviction.token_mask(choice))
            cache = torch.cat([cache, k[:, :, start:end]], dim=-2)
            if end < length:
                choice = eviction.update(choice, cache, q[:, :, start:end])
                cache = eviction.compact(cache, choice)
            start = end
    return masks


@pytest.mark.parametrize("policy", [None, *POLICY_NAMES])
@pytest.mark.parametrize("prefix", [96, 100])
def test_the_evicted_model_equals_a_brute_force_over_the_kept_tokens(policy, prefix):
    """Every layer, every chunk: the model's logits equal the model run with a float64 attention over exactly the
    tokens each chunk saw, and those are the eviction API's choices on the model's own keys and queries."""
    model, bs, keep, length = tiny_llama(), 16, 3, 200
    ids = random_ids(2, length, seed=prefix)
    evicted = EvictedModel(model, prefix, policy, keep, block_size=bs, trace=True)
    got = evicted(ids).logits
    assert model.config._attn_implementation == "sdpa"  # restored
    want, captured = reference_forward(model, ids, prefix, evicted.visible)
    torch.testing.assert_close(got, want, atol=5e-5, rtol=1e-4)
    if policy is None:
        assert all(bool(kept.all()) for chunks in evicted.visible.values() for _, _, kept in chunks)
        return
    replayed = replayed_masks(policy, captured, prefix, length, keep, bs)
    for layer, chunks in evicted.visible.items():
        assert len(chunks) == len(replayed[layer])
        for (start, _, kept), mask in zip(chunks, replayed[layer]):
            assert torch.equal(kept, mask), (layer, start)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_each_choice_reads_the_keys_and_queries_written_so_far(policy, monkeypatch):
    """What the model hands the eviction API: at the first choice the prefix's keys; at each later one the kept
    tokens' keys followed by the chunk's; queries only for the query-aware policies (h2o: every query since the
    previous choice, snapkv: the last ``observation`` of them), none for the query-blind ones."""
    calls = []
    evict, update = eviction.evict, eviction.update
    monkeypatch.setattr(eviction, "evict", lambda p, keys, *a, queries=None, **o: calls.append((keys, queries))
                        or evict(p, keys, *a, queries=queries, **o))
    monkeypatch.setattr(eviction, "update", lambda choice, keys, queries=None: calls.append((keys, queries))
                        or update(choice, keys, queries))
    model, bs, keep, prefix, length, observation = tiny_llama(1), 16, 3, 100, 200, 8
    ids = random_ids(2, length, seed=4)
    evicted = EvictedModel(model, prefix, policy, keep, block_size=bs, observation=observation, trace=True)
    evicted(ids)
    _, captured = reference_forward(model, ids, prefix, evicted.visible)
    q, k = captured[0]
    chunks = evicted.visible[0]
    assert len(calls) == len(chunks)  # the first choice, then one after every chunk but the last
    spans = [(0, prefix)] + [(start, end) for start, end, _ in chunks[:-1]]
    for (keys, queries), (start, end), (_, _, kept) in zip(calls, spans, [(0, 0, None)] + chunks):
        before = torch.empty(*k.shape[:2], 0, k.shape[-1]) if kept is None else torch.stack(
            [torch.stack([k[b, g, :start][kept[b, g]] for g in range(k.shape[1])]) for b in range(k.shape[0])])
        torch.testing.assert_close(keys, torch.cat([before, k[:, :, start:end]], dim=-2), atol=1e-5, rtol=1e-5)
        if not POLICIES[policy].query_aware:
            assert queries is None
        else:
            first = start if POLICIES[policy].all_queries else max(start, end - observation)
            torch.testing.assert_close(queries, q[:, :, first:end], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("prefix", [64, 70])
def test_memory_stays_at_the_budget_as_blocks_complete(policy, prefix):
    """After every choice each lane of each layer holds ``keep`` blocks (the last one partial right after an
    unaligned prefill), a choice follows every completed block, and a cache never holds more than ``keep + 1``
    blocks."""
    bs, keep, length = 16, 3, 160
    evicted = EvictedModel(tiny_llama(), prefix, policy, keep, block_size=bs, trace=True)
    evicted(random_ids(2, length, seed=5))
    first_end = (prefix // bs + 1) * bs
    for chunks in evicted.visible.values():
        assert [(s, e) for s, e, _ in chunks] == list(zip([prefix, *range(first_end, length, bs)],
                                                          [*range(first_end, length, bs), length]))
        held = [kept.sum(-1) for _, _, kept in chunks]
        assert torch.all(held[0] == keep * bs - (-prefix) % bs)  # the partial block being written
        assert all(torch.all(h == keep * bs) for h in held[1:])
        for start, _, kept in chunks:  # the sink and the window (the block of the last token written) are kept
            assert kept[..., :bs].all() and kept[..., (start - 1) // bs * bs:].all()
    assert evicted.peak_tokens == (keep + 1) * bs


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_no_prediction_depends_on_a_later_byte(policy):
    """Changing the byte at ``t`` (in the continuation) leaves every logit before ``t`` as it was, and changes
    some after it: the choices read no future key or query."""
    model, bs, keep, prefix = tiny_llama(), 16, 3, 64
    ids = random_ids(2, 176, seed=9)
    changed = ids.clone()
    t = 130
    changed[:, t] = (changed[:, t] + 1) % 256
    a = EvictedModel(model, prefix, policy, keep, block_size=bs)(ids).logits
    b = EvictedModel(model, prefix, policy, keep, block_size=bs)(changed).logits
    assert torch.equal(a[:, :t], b[:, :t])
    assert not torch.allclose(a[:, t:], b[:, t:])


def test_dense_equals_the_plain_model():
    model = tiny_llama()
    ids = random_ids(3, 150, seed=2)
    plain = token_losses(model, ids, batch=3)
    evicted = EvictedModel(model, 70, None, block_size=16)
    got = token_losses(evicted, ids, batch=3)
    torch.testing.assert_close(got, plain, atol=1e-5, rtol=1e-5)
    assert evicted.peak_tokens == 150


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(policy="lru", keep=3), ValueError, "policy must be one of"),
    (dict(policy=3, keep=3), TypeError, "policy must be a str"),
    (dict(policy="salience", keep=None), ValueError, "keep is required"),
    (dict(policy="salience", keep=9), ValueError, "keep must be <= the number of blocks"),
    (dict(policy="salience", keep=1), ValueError, "keep must be >= sinks \\+ window"),
    (dict(policy="streaming", keep=3, window=0), ValueError, "window must be >= 1"),
    (dict(policy="salience", keep=3, observation=0), ValueError, "observation must be >= 1"),
    (dict(policy=None, prefix=0), ValueError, "prefix must be >= 1"),
    (dict(policy=None, block_size=0), ValueError, "block_size must be >= 1"),
    (dict(policy="h2o", keep=3, seed=-1), ValueError, "seed must be >= 0"),
])
def test_evicted_model_argument_errors(kwargs, error, match):
    options = dict(prefix=100, block_size=16) | kwargs
    with pytest.raises(error, match=match) as raised:
        EvictedModel(tiny_llama(1), **options)
    assert "\n" not in str(raised.value)


def test_input_ids_must_be_longer_than_the_prefix():
    with pytest.raises(ValueError, match=r"L > prefix \(100\)"):
        EvictedModel(tiny_llama(1), 100, "salience", 3, block_size=16)(random_ids(1, 100, seed=0))


# --- the runner ---------------------------------------------------------------------------------------------


def documents(root, count: int) -> np.ndarray:
    """``count`` documents ``uint8 [count, LENGTH]``: windows of Python-like files (tests/helpers.write_corpus)."""
    write_corpus(root / "corpus", 40)
    text = b"\n".join(p.read_bytes() for p in sorted((root / "corpus").rglob("*.py")))
    return np.frombuffer(text[:count * LENGTH], np.uint8).reshape(count, LENGTH).copy()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("eviction")
    tiny_llama(1).save_pretrained(root / "model")
    np.savez_compressed(root / "docs.npz", documents=documents(root, 2))
    return root


def argv(root, out, *extra) -> list[str]:
    return ["--model", str(root / "model"), "--eval-set", str(root / "docs.npz"), "--documents", "2",
            "--block-size", str(BLOCK), "--probes", str(PROBES), "--device", "cpu", "--dtype", "float32",
            "--batch", "5", "--no-progress", "--out", str(out), *extra]


def run_main(args: list[str]) -> str:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert eviction_runner.main(args) == 0
    return printed.getvalue()


@pytest.fixture(scope="module")
def run(setup):
    out = setup / "result.json"
    printed = run_main(argv(setup, out))
    return dict(printed=printed, result=json.loads(out.read_text()), path=out)


def test_header_and_rows(run):
    result = run["result"]
    assert result["suite"] == "lm_eviction" and result["gpu"] == "cpu" and result["dtype"] == "float32"
    assert result["command"].startswith("python -m topo_attn.lm eviction --model ")
    assert "commit" in result and "commit_source" in result and result["seconds"] > 0 and result["complete"]
    assert result["torch"] == torch.__version__ and result["transformers"] == transformers.__version__
    assert (result["length"], result["prefix"], result["block_size"], result["context_blocks"]) == (1024, 512, 64, 16)
    assert result["policies"] == POLICY_NAMES and result["cache_fractions"] == [0.25, 0.125]
    assert result["tasks"] == list(TASKS) and result["distances"] == [1024 - 256]
    rows = result["rows"]
    assert [(r["policy"], r["cache_fraction"], r["keep_blocks"]) for r in rows] == [("dense", 1.0, 16)] + [
        (p, f, k) for p in POLICY_NAMES for f, k in ((0.25, 4), (0.125, 2))]
    per_token = 2 * 1 * 2 * 8 * 4  # K and V, one layer, two key/value heads of 8 float32
    for r in rows:
        assert set(LM_EVICTION_ROW_KEYS) <= set(r)
        assert r["n_bytes"] == 2 * (LENGTH - 512 - 1) and math.isfinite(r["bits_per_byte"])
        peak = LENGTH if r["policy"] == "dense" else (r["keep_blocks"] + 1) * BLOCK
        assert r["peak_tokens"] == peak and r["memory_fraction"] == peak / LENGTH
        assert r["kv_bytes"] == peak * per_token and r["full_kv_bytes"] == LENGTH * per_token
        assert r["query_blind"] == (None if r["policy"] == "dense" else r["policy"] not in ("h2o", "snapkv"))
        assert r["bits_per_byte_minus_dense"] == pytest.approx(r["bits_per_byte"] - rows[0]["bits_per_byte"])
        assert list(r["retrieval"]) == list(TASKS)
        for cell in r["retrieval"].values():
            assert set(LM_EVICTION_CELL_KEYS) <= set(cell) and cell["n"] == PROBES
            assert cell["ci_low"] <= cell["accuracy"] <= cell["ci_high"]
            assert cell["wilson_low"] <= cell["accuracy"] <= cell["wilson_high"]
            assert ("minus_dense" in cell) == (r["policy"] != "dense")
    assert run["printed"].splitlines()[0].startswith("| policy | cache | keep | memory | bits/byte |")
    assert len(run["printed"].splitlines()) == 2 + len(rows)


def test_the_dense_row_is_the_plain_model(run, setup):
    from topo_attn.lm.study import load_model

    model = load_model(setup / "model", "cpu", torch.float32)
    ids = torch.from_numpy(np.load(setup / "docs.npz")["documents"][:2].astype(np.int64))
    losses = token_losses(model, ids)[:, 512:]
    assert run["result"]["rows"][0]["bits_per_byte"] == pytest.approx(float(losses.mean()) / math.log(2), rel=1e-5)


def test_loader(run, tmp_path):
    assert load_lm_eviction(run["path"])["rows"] == run["result"]["rows"]
    rows = run["result"]["rows"]
    for broken, match in [([{k: v for k, v in r.items() if k != "memory_fraction"} for r in rows], "memory_fraction"),
                          ([dict(r, retrieval=[]) for r in rows], "retrieval must be a dict"),
                          ([dict(r, retrieval={"multi_key": {"accuracy": 1}}) for r in rows], "multi_key")]:
        (tmp_path / "broken.json").write_text(json.dumps(dict(run["result"], rows=broken)))
        with pytest.raises(ValueError, match=match):
            load_lm_eviction(tmp_path / "broken.json")
    (tmp_path / "other.json").write_text(json.dumps(dict(suite="lm_retrieval", rows=[])))
    with pytest.raises(ValueError, match="KV-cache eviction"):
        load_lm_eviction(tmp_path / "other.json")


def test_retrieval_cells_pair_each_policy_with_dense(setup, monkeypatch):
    """A scorer that answers right under dense only: dense 1, every policy 0, each 1 below dense on the same
    probes; every probe scored once per configuration, through the evicted model."""
    calls = []

    def dense_only(model, probes, batch=1):
        assert isinstance(model, EvictedModel)
        calls.append((model.policy, len(probes)))
        return [dict(distance=p.distance, loss=0.0, exact=model.policy is None) for p in probes]

    monkeypatch.setattr(eviction_runner, "passkey_scores", dense_only)
    out = setup / "paired.json"
    run_main(argv(setup, out, "--policies", "salience", "streaming", "--cache-fractions", "0.25", "--tasks",
                  "multi_key", "plain_needle", "--probes", "2"))
    rows = json.loads(out.read_text())["rows"]
    assert [c[1] for c in calls] == [4, 4, 4] and calls[0][0] is None
    assert [c[0].name for c in calls[1:]] == ["salience", "streaming"]
    for r in rows:
        for cell in r["retrieval"].values():
            assert cell["n"] == 2 and cell["accuracy"] == (1 if r["policy"] == "dense" else 0)
            assert cell.get("minus_dense", -1) == -1


def test_a_run_cut_short_keeps_its_rows(setup, monkeypatch):
    scored = []

    def fail_second(model, ids, batch=1):
        scored.append(model.policy)
        if len(scored) == 2:
            raise RuntimeError("out of time")
        return token_losses(model, ids, batch)

    monkeypatch.setattr(eviction_runner, "token_losses", fail_second)
    out = setup / "partial.json"
    with pytest.raises(RuntimeError, match="out of time"):
        run_main(argv(setup, out, "--policies", "streaming", "--no-retrieval"))
    result = json.loads(out.read_text())
    assert result["complete"] is False and [r["policy"] for r in result["rows"]] == ["dense"]


def test_no_retrieval(setup):
    out = setup / "perplexity.json"
    run_main(argv(setup, out, "--policies", "random", "--cache-fractions", "0.5", "--no-retrieval"))
    result = json.loads(out.read_text())
    assert result["tasks"] == [] and all(r["retrieval"] == {} for r in result["rows"])
    assert [r["keep_blocks"] for r in result["rows"]] == [16, 8]
    assert load_lm_eviction(out)["rows"] == result["rows"]


@pytest.mark.parametrize("extra, option", [
    (["--cache-fractions", "0"], "--cache-fractions"),
    (["--cache-fractions", "1.5"], "--cache-fractions"),
    (["--cache-fractions", "0.0625"], "--cache-fractions"),  # 1 block: less than the sink and the window
    (["--cache-fractions", "0.75"], "--cache-fractions"),  # 12 blocks: more than the prefix's 8
    (["--prefix", "0"], "--prefix"),
    (["--prefix", "1024"], "--prefix"),
    (["--length", "4096"], "--length"),
    (["--distances", "400"], "--distances"),  # the needle would be in the continuation
    (["--observation", "0"], "--observation"),
    (["--batch", "0"], "--batch"),
    (["--documents", "0"], "--documents"),
    (["--policies", "lru"], "--policies"),
    (["--tasks", "nosuchtask"], "--tasks"),
    (["--window", "0", "--prefix", "500"], "--cache-fractions"),  # a partial block with no window
    (["--model", "/nonexistent/model"], "--model"),
    (["--out", "/nonexistent/folder/result.json"], "--out"),
])
def test_bad_arguments_give_a_one_line_usage_error(setup, extra, option, capsys):
    """In process, as ``python -m topo_attn.lm`` runs it (topo_attn.cli.run): exit 2, one error line naming the
    argument (argparse's own errors add a 'see --help' line), no traceback, before anything loads."""
    from topo_attn import cli
    from topo_attn.lm.__main__ import PROG, main

    args = ["eviction", "--model", str(setup / "model"), "--eval-set", str(setup / "docs.npz"), "--device", "cpu",
            *extra]
    try:
        code = cli.run(main, args, prog=PROG)
    except SystemExit as done:  # argparse's errors
        code = done.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert lines[0].startswith("python -m topo_attn.lm") and ": error: " in lines[0] and option in lines[0], lines
    assert len(lines) <= 2 and "Traceback" not in err


def test_registered_as_a_subcommand():
    from topo_attn.lm.__main__ import SUBCOMMANDS, build_parser

    assert SUBCOMMANDS["eviction"] == "eviction_runner"
    assert "eviction" in build_parser().format_help()
    args = build_parser().parse_args(["eviction", "--policies", "salience", "--cache-fractions", "0.5"])
    assert args.policies == ["salience"] and args.cache_fractions == [0.5] and args.documents == 8
