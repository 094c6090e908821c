"""KV-cache eviction (topo_attn.eviction): each policy against a brute-force reference written from its definition
(Python loops over lanes, blocks, queries and heads, float64, absolute positions), at the end of the prefill and
through updates as blocks complete; the budget rule (sinks and window kept, exactly ``keep`` blocks, ties to the
lower index); updates that are choices from scratch; evicted blocks never read again; the cache helpers; errors."""

from __future__ import annotations

import math

import pytest
import torch

from topo_attn.eviction import policy as eviction_policy
from topo_attn.eviction import POLICIES, Eviction, compact, evict, get, positions, token_mask, update

# --- the references, from the definitions ------------------------------------------------------------------


def ref_salience(points: list[torch.Tensor]) -> list[float]:
    """Elder rule: Kruskal over all pairs ordered by (distance, i, j); at each merge every block of the smaller
    component (equal sizes: the one holding i) takes the distance; a single block gets 1."""
    n = len(points)
    if n == 1:
        return [1.0]
    pairs = sorted((float(torch.linalg.vector_norm(points[i] - points[j])), i, j)
                   for i in range(n) for j in range(i + 1, n))
    owner = list(range(n))
    members = {i: [i] for i in range(n)}
    salience = [0.0] * n
    for d, i, j in pairs:
        ci, cj = owner[i], owner[j]
        if ci == cj:
            continue
        small, large = (ci, cj) if len(members[ci]) <= len(members[cj]) else (cj, ci)
        for x in members[small]:
            salience[x] = d
            owner[x] = large
        members[large] += members.pop(small)
    return salience


def ref_keep(cache: list[int], score: dict[int, float], n: int, keep: int, sinks: int, window: int) -> list[int]:
    """Sinks (index < sinks) and window (index >= n - window), all in the cache, then the best-scored others,
    ties to the lower index."""
    base = [b for b in cache if b < sinks or b >= n - window]
    assert set(range(sinks)) | set(range(n - window, n)) == set(base)
    others = sorted((b for b in cache if b not in base), key=lambda b: (-score[b], b))
    return sorted(base + others[:keep - len(base)])


class RefLane:
    """One (batch, key/value head) lane of a policy, simulated over absolute positions."""

    def __init__(self, policy, keys, queries, b, g, cfg):
        self.policy, self.keys, self.queries, self.b, self.g, self.cfg = policy, keys, queries, b, g, cfg
        self.kept: list[int] = []
        self.length = 0
        self.accumulated: dict[int, float] = {}

    def mass(self, t: int, visible: list[int]) -> dict[int, float]:
        """Softmax mass of query position t (every head of the group) on the blocks of the visible positions."""
        bs, heads, kv_heads = self.cfg["block_size"], self.queries.shape[1], self.keys.shape[1]
        group = heads // kv_heads
        keys = self.keys[self.b, self.g, visible]
        out: dict[int, float] = {}
        for h in range(self.g * group, (self.g + 1) * group):
            logits = keys @ self.queries[self.b, h, t] * self.cfg["scale"]
            probs = torch.softmax(logits, dim=0)
            for p, w in zip(visible, probs.tolist()):
                out[p // bs] = out.get(p // bs, 0.0) + w
        return out

    def choose(self, length: int, given_queries: int, draws: torch.Tensor | None) -> tuple[list[int], list[float]]:
        cfg, bs = self.cfg, self.cfg["block_size"]
        n = -(-length // bs)
        previous = self.length
        old = [p for b in self.kept for p in range(b * bs, min((b + 1) * bs, previous))]
        cache = sorted(set(self.kept) | set(range(-(-previous // bs), n)))
        if self.policy == "salience":
            points = [self.keys[self.b, self.g, c * bs:min((c + 1) * bs, length)].mean(0) for c in cache]
            score = dict(zip(cache, ref_salience(points)))
        elif self.policy == "streaming":
            score = {c: float(c) for c in cache}
        elif self.policy == "h2o":
            score = {c: self.accumulated.get(c, 0.0) for c in cache}
            for t in range(previous, length):  # every query since the previous choice, over the cache then
                for c, w in self.mass(t, old + list(range(previous, t + 1))).items():
                    score[c] += w
        elif self.policy == "snapkv":
            mass = {c: 0.0 for c in cache}
            window = min(cfg["observation"], given_queries)
            for t in range(length - window, length):
                for c, w in self.mass(t, old + list(range(previous, t + 1))).items():
                    mass[c] += w
            score = {c: max(mass[d] for d in cache if abs(d - c) <= cfg["pool"]) for c in cache}
        else:
            score = dict(zip(cache, draws[self.b, self.g].tolist()))
        self.kept = ref_keep(cache, score, n, cfg["keep"], cfg["sinks"], cfg["window"])
        self.accumulated = {c: score[c] for c in self.kept}
        self.length = length
        return self.kept, [score[c] for c in cache]


def ref_run(policy, keys, queries, lengths, cfg, given=None):
    """The reference's kept blocks [B, H_kv, keep] and scores [B, H_kv, m] at each of ``lengths`` (the prefill's,
    then each update's); ``given[i]``: queries given at choice i (all new ones when None)."""
    batch, kv_heads = keys.shape[:2]
    lanes = [[RefLane(policy, keys, queries, b, g, cfg) for g in range(kv_heads)] for b in range(batch)]
    out, previous = [], 0
    for i, length in enumerate(lengths):
        m = None
        draws = None
        if policy == "random":
            bs = cfg["block_size"]
            m = len(set(lanes[0][0].kept) | set(range(-(-previous // bs), -(-length // bs))))
            draws = torch.rand(batch, kv_heads, m, generator=torch.Generator().manual_seed(cfg["seed"] + length),
                               dtype=torch.float64)
        count = length - previous if given is None or given[i] is None else given[i]
        found = [[lane.choose(length, count, draws) for lane in row] for row in lanes]
        out.append((torch.tensor([[k for k, _ in row] for row in found]),
                    torch.tensor([[s for _, s in row] for row in found], dtype=torch.float64)))
        previous = length
    return out


# --- the kit, through a chain of updates, evicted blocks poisoned ----------------------------------------------


def kit_run(policy, keys, queries, lengths, cfg, given=None, poison=True):
    """evict at lengths[0], then update at each later length from the compact cache; after each choice the evicted
    tokens of the cache it read are set to NaN before compacting (they are gone)."""
    options = {k: cfg[k] for k in ("sinks", "window", "scale", "observation", "pool", "seed")}
    out, cache, cache_pos, previous, evicted = [], keys[..., :lengths[0], :], None, 0, 0
    batch, kv_heads = keys.shape[:2]
    for i, length in enumerate(lengths):
        count = length - previous if given is None or given[i] is None else given[i]
        q = queries[..., length - count:length, :] if POLICIES[policy].query_aware else None
        if i == 0:
            choice = evict(policy, cache, cfg["block_size"], cfg["keep"], queries=q, **options)
            cache_pos = torch.arange(length).expand(batch, kv_heads, length)
        else:
            choice = update(choice, cache, queries=q)
        assert choice.length == length
        out.append((choice.kept, choice.scores))
        if poison:  # the tokens of the cache the choice read whose block it evicted
            gone = torch.stack([torch.stack([~torch.isin(cache_pos[b, g] // cfg["block_size"], choice.kept[b, g])
                                             for g in range(kv_heads)]) for b in range(batch)])
            evicted += int(gone.sum())
            cache = cache.masked_fill(gone[..., None], float("nan"))
        kept_cache = compact(cache, choice)
        assert torch.isfinite(kept_cache).all()
        pos = positions(choice)
        assert torch.equal(kept_cache, keys.gather(2, pos[..., None].expand(*pos.shape, keys.shape[-1])))
        if i + 1 < len(lengths):
            cache = torch.cat([kept_cache, keys[..., length:lengths[i + 1], :]], dim=2)
            cache_pos = torch.cat([pos, torch.arange(length, lengths[i + 1]).expand(batch, kv_heads, -1)], dim=2)
        previous = length
    assert evicted or not poison  # something was poisoned
    return out


def inputs(batch, heads, kv_heads, total, dim, seed):
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn(batch, kv_heads, total, dim, generator=gen, dtype=torch.float64)
    keys += 2.0 * torch.randn(batch, kv_heads, total // 8 + 1, 1, dim, generator=gen,
                              dtype=torch.float64).repeat_interleave(8, 2)[:, :, :total, 0]  # clustered
    queries = torch.randn(batch, heads, total, dim, generator=gen, dtype=torch.float64)
    return keys, queries


# (B, H, H_kv, D, block_size, keep, sinks, window, lengths: prefill then updates)
SHAPES = [
    (1, 2, 2, 8, 16, 4, 1, 1, [128, 144, 176]),          # aligned, one then two blocks per update
    (2, 4, 2, 8, 16, 5, 1, 2, [150, 160, 181, 208]),     # partial last block, GQA, a partial update
    (1, 6, 2, 4, 8, 7, 2, 1, [97, 100, 120, 129]),       # GQA 3, partial blocks throughout
    (2, 2, 1, 16, 4, 6, 0, 1, [62, 64, 71, 90]),         # MQA, no sink
    (1, 2, 2, 8, 16, 4, 1, 0, [96, 112, 144]),           # no window: block boundaries only
    (1, 1, 1, 8, 16, 3, 1, 2, [48, 64]),                 # the budget is the base only (keep = sinks + window)
]


def config(shape, pool=0, observation=5, seed=3):
    *_, dim, bs, keep, sinks, window, _ = shape
    return dict(block_size=bs, keep=keep, sinks=sinks, window=window, scale=1 / math.sqrt(dim),
                observation=observation, pool=pool, seed=seed)


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"B{s[0]}H{s[1]}kv{s[2]}bs{s[4]}k{s[5]}s{s[6]}w{s[7]}")
def test_policy_matches_its_reference_through_updates(policy, shape):
    batch, heads, kv_heads, dim, bs, keep, sinks, window, lengths = shape
    keys, queries = inputs(batch, heads, kv_heads, lengths[-1], dim, seed=len(policy) * 100 + lengths[0])
    cfg = config(shape)
    want = ref_run(policy, keys, queries, lengths, cfg)
    got = kit_run(policy, keys, queries, lengths, cfg)
    for length, (kept, scores), (ref_kept, ref_scores) in zip(lengths, got, want):
        n = -(-length // bs)
        assert kept.dtype == torch.int64 and kept.shape == (batch, kv_heads, keep)
        assert torch.equal(kept, ref_kept), (length, kept, ref_kept)
        torch.testing.assert_close(scores, ref_scores, rtol=1e-9, atol=1e-12)
        assert (kept.diff(dim=-1) > 0).all()
        for b in range(sinks):
            assert (kept == b).any(-1).all()
        for b in range(n - window, n):
            assert (kept == b).any(-1).all()


@pytest.mark.parametrize("policy", ["h2o", "snapkv"])
def test_attention_read_in_chunks_of_queries(policy, monkeypatch):
    """The attention mass is read a chunk of queries at a time; chunks of 7 give the reference's choices."""
    monkeypatch.setattr(eviction_policy, "MASS_CHUNK", 7)
    shape = SHAPES[1]
    batch, heads, kv_heads, dim, *_, lengths = shape
    keys, queries = inputs(batch, heads, kv_heads, lengths[-1], dim, seed=31)
    cfg = config(shape, observation=19)
    for (kept, scores), (ref_kept, ref_scores) in zip(kit_run(policy, keys, queries, lengths, cfg),
                                                      ref_run(policy, keys, queries, lengths, cfg)):
        assert torch.equal(kept, ref_kept)
        torch.testing.assert_close(scores, ref_scores, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("pool", [1, 2])
def test_snapkv_pools_over_neighbours_in_the_cache(pool):
    shape = SHAPES[1]
    batch, heads, kv_heads, dim, *_, lengths = shape
    keys, queries = inputs(batch, heads, kv_heads, lengths[-1], dim, seed=7 + pool)
    cfg = config(shape, pool=pool, observation=9)
    got = kit_run("snapkv", keys, queries, lengths, cfg)
    want = ref_run("snapkv", keys, queries, lengths, cfg)
    unpooled = kit_run("snapkv", keys, queries, lengths, config(shape, observation=9))
    for (kept, scores), (ref_kept, ref_scores) in zip(got, want):
        assert torch.equal(kept, ref_kept)
        torch.testing.assert_close(scores, ref_scores, rtol=1e-9, atol=1e-12)
    assert any(not torch.equal(a[1], b[1]) for a, b in zip(got, unpooled))  # pooling changed the scores


def test_snapkv_reads_only_the_queries_given():
    """Given only the last few queries of the prefill and of each update, the window is the last of those."""
    shape = SHAPES[2]
    batch, heads, kv_heads, dim, *_, lengths = shape
    keys, queries = inputs(batch, heads, kv_heads, lengths[-1], dim, seed=11)
    cfg = config(shape, observation=6)
    given = [4, 2, 20, 9]
    got = kit_run("snapkv", keys, queries, lengths, cfg, given=given)
    want = ref_run("snapkv", keys, queries, lengths, cfg, given=given)
    for (kept, scores), (ref_kept, ref_scores) in zip(got, want):
        assert torch.equal(kept, ref_kept)
        torch.testing.assert_close(scores, ref_scores, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("policy", ["salience", "streaming", "snapkv"])
def test_update_is_the_choice_from_scratch_over_the_cache(policy):
    """Salience, streaming and SnapKV (no pooling) carry nothing: an update chooses what a first choice over the
    compact cache chooses."""
    bs, keep, sinks, window = 8, 6, 1, 2
    keys, queries = inputs(2, 4, 2, 170, 8, seed=5)
    q = queries[..., :101, :] if policy == "snapkv" else None
    choice = evict(policy, keys[..., :101, :], bs, keep, sinks=sinks, window=window, queries=q, observation=7)
    for start, stop in [(101, 104), (104, 120), (120, 170)]:
        cache = torch.cat([compact_from(keys, choice), keys[..., start:stop, :]], 2)
        q = queries[..., start:stop, :] if policy == "snapkv" else None
        blocks = torch.cat([choice.kept, torch.arange(-(-start // bs), -(-stop // bs)).expand(2, 2, -1)], -1)
        choice = update(choice, cache, queries=q)
        scratch = evict(policy, cache, bs, keep, sinks=sinks, window=window, queries=q, observation=7)
        assert torch.equal(choice.rows, scratch.kept)
        if policy != "streaming":  # (its scores are the absolute indices)
            assert torch.equal(choice.scores, scratch.scores)
        assert torch.equal(choice.kept, blocks.gather(-1, scratch.kept))
        assert not torch.equal(choice.kept, choice.rows)  # the cache's blocks are not the absolute ones


def compact_from(keys, choice):
    """The compact cache of ``choice``, from the keys at absolute positions."""
    pos = positions(choice)
    return keys.gather(2, pos[..., None].expand(*pos.shape, keys.shape[-1]))


def test_h2o_update_adds_the_new_mass_to_the_carried_mass():
    """H2O's update scores: the mass the kept blocks carried plus the new queries' mass over the compact cache (what
    SnapKV reads with an observation window of all of them); a choice from scratch would forget the carry."""
    keys, queries = inputs(1, 2, 2, 96, 8, seed=9)
    choice = evict("h2o", keys[..., :64, :], 8, 4, window=1, queries=queries[..., :64, :])
    assert (choice.carry > 0).all()
    cache = torch.cat([compact_from(keys, choice), keys[..., 64:96, :]], 2)
    later = update(choice, cache, queries=queries[..., 64:, :])
    new_mass = evict("snapkv", cache, 8, 4, window=1, queries=queries[..., 64:, :], observation=32).scores
    carried = torch.nn.functional.pad(choice.carry, (0, 4))
    torch.testing.assert_close(later.scores, carried + new_mass, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(later.carry, later.scores.gather(-1, later.rows), rtol=0, atol=0)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_evicted_blocks_are_never_read(policy):
    """An update given a cache built from keys whose evicted blocks are NaN (and NaN-free compact caches) gives
    finite scores equal to those from clean keys."""
    keys, queries = inputs(2, 4, 2, 160, 8, seed=13)
    cfg = config((2, 4, 2, 8, 16, 5, 1, 1, None))
    lengths = [100, 112, 128, 160]
    clean = kit_run(policy, keys, queries, lengths, cfg, poison=False)
    poisoned = kit_run(policy, keys, queries, lengths, cfg, poison=True)
    for (kept, scores), (kept2, scores2) in zip(clean, poisoned):
        assert torch.isfinite(scores2).all()
        assert torch.equal(kept, kept2) and torch.equal(scores, scores2)


@pytest.mark.parametrize("policy", ["salience", "snapkv"])
def test_ties_go_to_the_lower_block_index(policy):
    """Equal keys make every salience 0; zero queries spread equal mass on every complete block before the
    observation window: the first candidates are kept."""
    bs, keep, sinks, window, S = 8, 6, 1, 2, 96
    keys = torch.ones(1, 2, S, 4, dtype=torch.float64)
    queries = torch.zeros(1, 2, S, 4, dtype=torch.float64)
    choice = evict(policy, keys, bs, keep, sinks=sinks, window=window, queries=queries, observation=bs)
    candidates = choice.scores[..., sinks:S // bs - window]
    assert (candidates == candidates[..., :1]).all()  # they do tie
    assert choice.kept.tolist() == [[[0, 1, 2, 3, 10, 11]] * 2]


def test_random_is_seeded_and_uniform():
    keys = torch.randn(1, 1, 12 * 8, 4)
    draws = [evict("random", keys, 8, 5, sinks=1, window=1, seed=s).kept[0, 0].tolist() for s in range(1500)]
    assert evict("random", keys, 8, 5, seed=3).kept.tolist() == [[draws[3]]]
    assert len({tuple(d) for d in draws[:20]}) > 10  # the seed changes the draw
    counts = torch.zeros(12)
    for d in draws:
        counts[d] += 1
    share = counts / len(draws)
    assert share[0] == 1 and share[11] == 1
    torch.testing.assert_close(share[1:11], torch.full((10,), 3 / 10), rtol=0, atol=0.05)


def test_every_policy_keeps_exactly_keep_blocks_with_sinks_and_window():
    gen = torch.Generator().manual_seed(17)
    for trial in range(12):
        bs = int(torch.randint(1, 9, (), generator=gen))
        S = int(torch.randint(bs, 120, (), generator=gen))
        n = -(-S // bs)
        sinks = int(torch.randint(0, 3, (), generator=gen))
        window = int(torch.randint(1, 3, (), generator=gen))
        if sinks + window > n:
            continue
        keep = int(torch.randint(sinks + window, n + 1, (), generator=gen))
        keys = torch.randn(2, 2, S, 4, generator=gen)
        queries = torch.randn(2, 4, S, 4, generator=gen)
        for policy in POLICIES:
            kept = evict(policy, keys, bs, keep, sinks=sinks, window=window, queries=queries).kept
            assert kept.shape == (2, 2, keep) and kept.dtype == torch.int64
            assert (kept.diff(dim=-1) > 0).all() and kept.min() >= 0 and kept.max() < n
            base = torch.tensor(list(range(sinks)) + list(range(n - window, n)))
            assert torch.isin(base, kept[0, 0]).all() and torch.isin(base, kept[1, 1]).all()


def test_cache_helpers():
    keys, queries = inputs(2, 2, 2, 75, 4, seed=21)
    values = torch.randn(2, 2, 75, 6, dtype=torch.float64)
    choice = evict("salience", keys, 8, 4, sinks=1, window=1)
    pos = positions(choice)
    assert choice.cached_tokens == 3 * 8 + 3 and pos.shape == (2, 2, 27)
    assert choice.cache_fraction == pytest.approx(27 / 75)
    for b in range(2):
        for g in range(2):
            want = [p for blk in choice.kept[b, g].tolist() for p in range(blk * 8, min(blk * 8 + 8, 75))]
            assert pos[b, g].tolist() == want
            assert torch.equal(compact(values, choice)[b, g], values[b, g, want])
            assert token_mask(choice)[b, g].nonzero().flatten().tolist() == want


# --- errors ------------------------------------------------------------------------------------------------


def _evict(policy="h2o", keys=None, block_size=8, keep=4, **options):
    keys = torch.randn(1, 2, 64, 8) if keys is None else keys
    options.setdefault("queries", torch.randn(1, 4, 64, 8))
    return evict(policy, keys, block_size, keep, **options)


@pytest.mark.parametrize("call, error, name", [
    (lambda: _evict(keep=9), ValueError, "keep"),                        # more than the 8 blocks
    (lambda: _evict(keep=2, sinks=2, window=1), ValueError, "keep"),     # fewer than sinks + window
    (lambda: _evict(keep=0), ValueError, "keep"),
    (lambda: _evict(keep=2.0), TypeError, "keep"),
    (lambda: _evict(block_size=-1), ValueError, "block_size"),
    (lambda: _evict(sinks=-1), ValueError, "sinks"),
    (lambda: _evict(window=-1), ValueError, "window"),
    (lambda: _evict(observation=0), ValueError, "observation"),
    (lambda: _evict(pool=-2), ValueError, "pool"),
    (lambda: _evict(seed=-1), ValueError, "seed"),
    (lambda: _evict(scale=0.0), ValueError, "scale"),
    (lambda: _evict(keys=torch.randn(2, 64, 8)), ValueError, "keys"),
    (lambda: _evict(keys=torch.ones(1, 2, 64, 8, dtype=torch.int64)), TypeError, "keys"),
    (lambda: _evict(keys=[[1.0]]), TypeError, "keys"),
    (lambda: _evict(keys=torch.full((1, 2, 64, 8), float("nan"))), ValueError, "keys"),
    (lambda: _evict(keys=torch.randn(1, 2, 60, 8), window=0), ValueError, "window"),  # a partial block
    (lambda: _evict(queries=None), ValueError, "queries"),
    (lambda: _evict(queries=torch.randn(2, 4, 64, 8)), ValueError, "queries"),  # batch
    (lambda: _evict(queries=torch.randn(1, 3, 64, 8)), ValueError, "queries"),  # heads
    (lambda: _evict(queries=torch.randn(1, 4, 64, 4)), ValueError, "queries"),  # head dimension
    (lambda: _evict(queries=torch.randn(1, 4, 32, 8)), ValueError, "queries"),  # h2o needs every query
    (lambda: _evict("snapkv", queries=torch.randn(1, 4, 65, 8)), ValueError, "queries"),
    (lambda: _evict("snapkv", queries=torch.full((1, 4, 8, 8), float("inf"))), ValueError, "queries"),
    (lambda: _evict("quest"), ValueError, "policy"),
    (lambda: _evict(3), TypeError, "policy"),
])
def test_bad_input_is_rejected(call, error, name):
    with pytest.raises(error, match=name):
        call()


def test_bad_update_and_cache_input_is_rejected():
    keys, queries = torch.randn(1, 2, 64, 8), torch.randn(1, 4, 80, 8)
    choice = _evict(queries=queries[..., :64, :])
    cache = torch.cat([compact(keys, choice), torch.randn(1, 2, 16, 8)], 2)
    assert update(choice, cache, queries=queries[..., 64:, :]).length == 80
    with pytest.raises(TypeError, match="eviction"):
        update("h2o", cache, queries=queries[..., 64:, :])
    with pytest.raises(ValueError, match="cache_keys"):  # no new token
        update(choice, compact(keys, choice), queries=queries[..., :0, :])
    with pytest.raises(ValueError, match="cache_keys"):  # another head count
        update(choice, cache[:, :1], queries=queries[..., 64:, :])
    with pytest.raises(ValueError, match="queries"):  # not every new query
        update(choice, cache, queries=queries[..., 72:, :])
    with pytest.raises(ValueError, match="queries"):  # other heads than before
        update(choice, cache, queries=torch.randn(1, 2, 16, 8))
    with pytest.raises(ValueError, match="cache"):  # not the cache the choice read
        compact(cache, choice)
    with pytest.raises(TypeError, match="eviction"):
        positions(None)
    assert isinstance(choice, Eviction) and get(choice.policy) is choice.policy
