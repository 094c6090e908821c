"""The research selectors (:mod:`topo_attn.lm.research`): causal prefix trees equal to the package's salience
of each prefix, superlevel persistence on a tree equal to gudhi's, equal-budget causal schedules, recall equal to
the metric's, lambda tuning on training documents only, and the driver end to end on a tiny model."""

from __future__ import annotations

import json
from functools import partial

import numpy as np
import pytest
import torch

from topo_attn.attention import dense_masked_attention
from topo_attn.lm import research
from topo_attn.lm.corpus import is_validation
from topo_attn.rule import base_block_mask
from topo_attn.selection import block_attention_mass, full_attention, schedule_from_scores, schedule_quality
from topo_attn.topology import block_centroids, minimum_spanning_tree
from topo_attn.topology.persistence import lane_saliences

SETTINGS = research.Settings(length=200, block_size=16, budgets=(1, 3), tune_budget=2)


def qk(seed: int, seq: int = 200, heads: int = 4, kv_heads: int = 2, dim: int = 16):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, seq, dim, generator=gen, dtype=torch.float64)
    k = torch.randn(1, kv_heads, seq, dim, generator=gen, dtype=torch.float64)
    return q, k


# ------------------------------------------------------------------------------------------ prefix trees
def test_prefix_salience_and_trees_are_those_of_each_prefix():
    centroids = torch.randn(1, 2, 13, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    trees = research.prefix_trees(centroids)
    assert trees.salience.shape == (1, 2, 13, 13) and trees.adjacency.shape == (1, 2, 13, 13, 13)
    for qb in range(13):
        prefix = centroids[..., :qb + 1, :]
        assert torch.equal(trees.salience[..., qb, :qb + 1], lane_saliences(prefix))
        assert not trees.salience[..., qb, qb + 1:].any()
        for head in range(2):
            adj = trees.adjacency[0, head, qb]
            edges, _ = minimum_spanning_tree(prefix[0, head])
            expected = torch.zeros_like(adj)
            expected[edges[:, 0], edges[:, 1]] = expected[edges[:, 1], edges[:, 0]] = True
            assert torch.equal(adj, expected)


def test_topology_causal_is_shared_by_the_query_heads_of_a_group():
    q, k = qk(1)
    scores = research.topology_causal_scores(q, k, 16)
    sal = research.prefix_trees(block_centroids(k, 16)).salience
    assert scores.dtype == torch.float64 and scores.shape == (1, 4, 13, 13)
    assert torch.equal(scores[:, :2], sal[:, :1].expand(1, 2, 13, 13))
    assert torch.equal(scores[:, 2:], sal[:, 1:].expand(1, 2, 13, 13))
    with pytest.raises(ValueError, match="trees must be"):
        research.topology_causal_scores(q, k, 32, trees=research.key_prefix_trees(k, 16))


# ------------------------------------------------------------------------------- superlevel persistence
def random_tree(rng: np.random.Generator, m: int) -> list[tuple[int, int]]:
    perm = rng.permutation(m)
    return [(int(perm[i]), int(perm[rng.integers(i)])) for i in range(1, m)]


def adjacency_of(edges, m: int) -> torch.Tensor:
    adj = torch.zeros(m, m, dtype=torch.bool)
    for i, j in edges:
        adj[i, j] = adj[j, i] = True
    return adj


def gudhi_bars(values: np.ndarray, edges) -> np.ndarray:
    """Per vertex, the bar gudhi gives the component born at it (vertex filtration -value, edges at the larger
    of their vertices' filtrations; the infinite bar: the highest value minus the lowest)."""
    import gudhi  # imported here: machines without gudhi run the other tests

    st = gudhi.SimplexTree()
    for v, f in enumerate(values):
        st.insert([v], filtration=-f)
    for i, j in edges:
        st.insert([i, j], filtration=max(-values[i], -values[j]))
    st.compute_persistence()
    bars = np.zeros(len(values))
    for birth, death in st.persistence_pairs():
        if len(birth) == 1:
            bars[birth[0]] = values.max() - values.min() if not death else st.filtration(death) - st.filtration(birth)
    return bars


def test_tree_superlevel_persistence_equals_gudhi_on_random_trees_in_one_padded_batch():
    rng = np.random.default_rng(0)
    m = 17
    sizes = [1, 2, 3, 5, 9, 17] + [int(s) for s in rng.integers(1, m + 1, 30)]
    values = torch.full((len(sizes), m), 123.0, dtype=torch.float64)  # padding values are never read
    adjacency = torch.zeros(len(sizes), m, m, dtype=torch.bool)
    real = torch.zeros(len(sizes), m, dtype=torch.bool)
    expected = np.zeros((len(sizes), m))
    for p, size in enumerate(sizes):
        vals, edges = rng.normal(size=size), random_tree(rng, size)
        values[p, :size], adjacency[p, :size, :size], real[p, :size] = torch.from_numpy(vals), adjacency_of(
            edges, size), True
        expected[p, :size] = gudhi_bars(vals, edges)
    bars = research.tree_superlevel_persistence(values, adjacency, real)
    np.testing.assert_allclose(bars.numpy(), expected, rtol=0, atol=1e-12)
    assert (bars[:, 1:] > 0).sum() > 10  # local maxima other than the global one were found


def path_bars(values: np.ndarray, edges) -> np.ndarray:
    """The definition with ties: ``v`` dies at the largest, over ``u`` higher (value, then lower index), of the
    lowest value on the tree path; the global maximum at the lowest value."""
    m = len(values)
    neighbours = {v: [] for v in range(m)}
    for i, j in edges:
        neighbours[i].append(j)
        neighbours[j].append(i)
    bars = np.zeros(m)
    for v in range(m):
        low = {v: values[v]}
        stack = [v]
        while stack:
            x = stack.pop()
            for y in neighbours[x]:
                if y not in low:
                    low[y] = min(low[x], values[y])
                    stack.append(y)
        higher = [low[u] for u in range(m) if (values[u], -u) > (values[v], -v)]
        bars[v] = values[v] - (max(higher) if higher else values.min())
    return bars


def test_tree_superlevel_persistence_with_tied_values_follows_the_definition():
    rng = np.random.default_rng(1)
    for _ in range(60):
        size = int(rng.integers(1, 14))
        vals, edges = rng.integers(0, 4, size).astype(float), random_tree(rng, size)
        bars = research.tree_superlevel_persistence(torch.from_numpy(vals)[None], adjacency_of(edges, size)[None],
                                                    torch.ones(1, size, dtype=torch.bool))
        np.testing.assert_array_equal(bars[0].numpy(), path_bars(vals, edges))


def test_tree_superlevel_persistence_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="expected values"):
        research.tree_superlevel_persistence(torch.zeros(2, 3), torch.zeros(2, 3, 4, dtype=torch.bool),
                                             torch.ones(2, 3, dtype=torch.bool))


# ----------------------------------------------------------------------------------- scores and schedules
def test_causal_zscore_standardises_causal_blocks_only():
    scores = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    z = research.causal_zscore(scores)
    for qb in range(1, 6):
        row = scores[..., qb, :qb + 1]
        expected = (row - row.mean(-1, keepdim=True)) / row.std(-1, unbiased=False, keepdim=True)
        torch.testing.assert_close(z[..., qb, :qb + 1], expected)
        assert not z[..., qb, qb + 1:].any()
    assert not z[..., 0, :].any()  # one causal block: a constant row


def test_quest_mst_neighbour_term_is_the_mean_over_tree_neighbours():
    q, k = qk(3, seq=120)
    trees = research.key_prefix_trees(k, 16)
    quest, near = research.quest_mst_terms(q, k, 16, trees)
    torch.testing.assert_close(quest, research.head_scores("quest", q, k, 16))
    for head in range(4):
        for qb in (0, 3, 7):
            adj = trees.adjacency[0, head // 2, qb]
            for kb in range(qb + 1):
                nbrs = adj[kb].nonzero()[:, 0]
                expected = quest[0, head, qb, nbrs].mean() if len(nbrs) else torch.tensor(0.0, dtype=torch.float64)
                torch.testing.assert_close(near[0, head, qb, kb], expected)


def test_score_persistence_term_is_gudhis_tree_persistence_of_each_row():
    q, k = qk(4, seq=100)
    trees = research.key_prefix_trees(k, 16)
    base, extra = research.score_persistence_terms(q, k, 16, trees, chunk=5)
    scores = research.head_scores("centroid", q, k, 16)
    torch.testing.assert_close(base, research.causal_zscore(scores))
    bars = torch.zeros_like(scores)
    for head in range(4):
        for qb in range(7):
            edges = trees.adjacency[0, head // 2, qb].nonzero().tolist()
            bars[0, head, qb, :qb + 1] = torch.from_numpy(gudhi_bars(scores[0, head, qb, :qb + 1].numpy(), edges))
    torch.testing.assert_close(extra, research.causal_zscore(bars))


@pytest.mark.parametrize("name", research.BASELINES + research.IDEAS)
def test_every_schedule_is_causal_with_sinks_and_window_and_visits_as_many_blocks_as_centroid(name):
    q, k = qk(5)
    nb, budget = 13, 4
    fn = (partial(research.head_scores, name) if name in research.BASELINES
          else research.RESEARCH_SELECTORS[name])
    scores = fn(q, k, 16, lam=0.5)
    assert scores.shape == (1, 4, nb, nb) and scores.dtype == torch.float64
    causal = torch.ones(nb, nb, dtype=torch.bool).tril()
    poisoned = scores.masked_fill(~causal, 1e300)  # non-causal blocks must be ignored however they score
    reference = schedule_from_scores(research.head_scores("centroid", q, k, 16), 16, 200, 2, 1, budget).to_block_mask()
    for s in (scores, poisoned):
        mask = schedule_from_scores(s, 16, 200, 2, 1, budget).to_block_mask()
        assert not (mask & ~causal).any()
        assert (mask | ~base_block_mask(nb, 2, 1)).all()
        assert torch.equal(mask.sum(-1), reference.sum(-1))


def test_lam_zero_gives_the_base_selectors_schedule():
    q, k = qk(6)
    for name, base in (("centroid_salience", "centroid"), ("quest_mst", "quest"), ("score_persistence", "centroid")):
        ours = schedule_from_scores(research.RESEARCH_SELECTORS[name](q, k, 16, lam=0.0), 16, 200, 1, 1, 3)
        theirs = schedule_from_scores(research.head_scores(base, q, k, 16), 16, 200, 1, 1, 3)
        assert torch.equal(ours.to_block_mask(), theirs.to_block_mask()), name


# --------------------------------------------------------------------------------------------- recall
def test_mean_recall_is_the_metrics_recall_for_all_and_late_rows():
    q, k = qk(7, seq=100)
    v = torch.randn(k.shape, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    mass = block_attention_mass(q, k, 16)
    schedule = schedule_from_scores(research.head_scores("centroid", q, k, 16), 16, 100, 1, 1, 2)
    mask = schedule.to_block_mask()
    recall = research.mean_recall(mass, mask, 16, 100)
    torch.testing.assert_close(recall.reshape(-1), schedule_quality(q, k, v, schedule).recall)
    # late rows: queries of the blocks from position 50 on (blocks 4.., positions 64..99)
    late = research.mean_recall(mass, mask, 16, 100, start=50)
    full = full_attention(q, k, v, 16)
    _, lse = dense_masked_attention(q, k, v, schedule, return_lse=True, rows=slice(64, 100))
    torch.testing.assert_close(late, torch.exp(lse - full.lse[..., 64:]).mean(-1))
    with pytest.raises(ValueError, match="start"):
        research.mean_recall(mass, mask, 16, 100, start=100)


# --------------------------------------------------------------------------------------------- tuning
def synthetic_parts(seed: int, count: int = 2) -> list[research.LayerParts]:
    """Parts whose true mass is what ``extra`` scores, while ``base`` is mostly noise: a larger ``lam`` wins."""
    gen = torch.Generator().manual_seed(seed)
    parts = []
    for _ in range(count):
        mass = torch.rand(1, 2, 13, 13, generator=gen, dtype=torch.float64).tril() ** 4
        noise = torch.randn(1, 2, 13, 13, generator=gen, dtype=torch.float64)
        parts.append(research.LayerParts(mass, terms={"quest_mst": (noise + 0.3 * mass, mass)}))
    return parts


def test_tune_lambda_picks_the_grid_value_with_the_best_tuning_recall():
    settings = research.Settings(length=200, block_size=16, tune_budget=3, lambdas=(0.0, -0.25, 0.5, 2.0, 10.0))
    parts = synthetic_parts(9)
    best, recall = research.tune_lambda(parts, "quest_mst", settings)
    expected = {}
    for lam in settings.lambdas:
        masks = [schedule_from_scores(p.terms["quest_mst"][0] + lam * p.terms["quest_mst"][1], 16, 200, 1, 1, 3)
                 .to_block_mask() for p in parts]
        expected[lam] = float(torch.cat([research.mean_recall(p.mass, m, 16, 200).reshape(-1)
                                         for p, m in zip(parts, masks)]).mean())
    assert recall == pytest.approx(expected, rel=1e-12)
    assert best == max(expected, key=expected.get) and best != 0.0
    assert recall[best] > recall[0.0]
    # ties go to the first value of the grid
    flat = [research.LayerParts(p.mass, terms={"quest_mst": (p.terms["quest_mst"][0], torch.zeros_like(p.mass))})
            for p in parts]
    assert research.tune_lambda(flat, "quest_mst", settings)[0] == 0.0


def test_training_documents_come_from_the_training_split_only(tmp_path):
    root = tmp_path / "lib"
    names = []
    for i in range(200):
        path = root / f"m{i}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"# file {i:04d}\n" * 8)
        names.append((f"stdlib/m{i}.py", i))
    train = [i for name, i in names if not is_validation(name)]
    held = [i for name, i in names if is_validation(name)]
    assert held  # the split holds validation files to leave out
    size = 8 * len("# file 0000\n") + 2
    docs = research.training_documents(len(train) * size // 100, 100, seed=3, roots=[("stdlib", root)])
    text = docs.tobytes().decode()
    assert docs.dtype == np.uint8 and docs.shape[1] == 100
    assert not any(f"# file {i:04d}" in text for i in held)
    assert sum(f"# file {i:04d}" in text for i in train) > 0.9 * len(train)


# --------------------------------------------------------------------------------------------- driver
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama (2 layers, 4/2 heads of 16), evaluation and training documents of 256 bytes."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
    LlamaForCausalLM(config).save_pretrained(folder)
    rng = np.random.default_rng(0)
    np.savez(folder / "eval_set.npz", documents=rng.integers(0, 256, (3, 300), dtype=np.uint8))
    np.savez(folder / "other_eval.npz", documents=rng.integers(0, 256, (3, 300), dtype=np.uint8))
    return folder, rng.integers(0, 256, (2, 256), dtype=np.uint8)


ARGS = ["--length", "256", "--block-size", "16", "--budgets", "1", "4", "--tune-budget", "2", "--eval-documents",
        "2", "--device", "cpu", "--no-progress"]


def test_main_writes_every_selector_and_budget(tiny, tmp_path, capsys):
    folder, train = tiny
    out = tmp_path / "research.json"
    assert research.main(["--model", str(folder), "--out", str(out), *ARGS], train_documents=train) == 0
    result = json.loads(out.read_text())
    assert result["suite"] == "lm_research" and result["gpu"] == "cpu"
    for key in ("torch", "triton", "command", "date", "commit", "settings", "rows", "lambdas", "seconds"):
        assert key in result
    assert result["settings"]["eval_documents"] == 2 and result["settings"]["train_documents"] == 2
    rows = {(r["selector"], r["budget"]): r for r in result["rows"]}
    assert set(rows) == {(s, b) for s in research.BASELINES + research.IDEAS for b in (1, 4)}
    for (name, budget), row in rows.items():
        assert 0 < row["recall"] <= 1 and 0 < row["late_recall"] <= 1 and len(row["recall_per_layer"]) == 2
        assert row["recall"] <= rows[("oracle", budget)]["recall"] + 1e-12
        assert row["blocks_per_row"] == rows[("centroid", budget)]["blocks_per_row"]
    assert all(len(result["lambdas"][n]) == 2 and set(result["lambdas"][n]) <= set(research.LAMBDAS)
               for n in research.TUNED)
    printed = capsys.readouterr().out
    assert "| topology_causal |" in printed and "| oracle |" in printed


def test_tuning_reads_training_documents_only_and_before_the_evaluation_set(tiny, tmp_path, monkeypatch):
    folder, train = tiny
    events = []
    document_parts, tune_lambdas, load_documents = (research.document_parts, research.tune_lambdas,
                                                    research.load_documents)

    def parts(model, doc, settings):
        events.append(("parts", doc.tobytes()))
        return document_parts(model, doc, settings)

    def tune(train_parts, settings):
        events.append(("tune", len(train_parts)))
        return tune_lambdas(train_parts, settings)

    def load(*args, **kwargs):
        events.append(("load", None))
        return load_documents(*args, **kwargs)

    monkeypatch.setattr(research, "document_parts", parts)
    monkeypatch.setattr(research, "tune_lambdas", tune)
    monkeypatch.setattr(research, "load_documents", load)
    lambdas = []
    for eval_set in ("eval_set.npz", "other_eval.npz"):
        events.clear()
        result = research.research(research_args(folder, eval_set), [], train)
        lambdas.append(result["lambdas"])
        tuned = events.index(("tune", 2))
        assert [e for e in events[:tuned]] == [("parts", d.tobytes()) for d in train]
        assert events[tuned + 1] == ("load", None)
        evaluated = np.load(folder / eval_set)["documents"][:2, :256]
        assert events[tuned + 2:] == [("parts", d.tobytes()) for d in evaluated]
    assert lambdas[0] == lambdas[1]  # the tuning does not depend on the evaluation set


def research_args(folder, eval_set: str):
    import argparse

    parser = argparse.ArgumentParser()
    research.add_arguments(parser)
    return parser.parse_args(["--model", str(folder), "--eval-set", str(folder / eval_set), *ARGS])


def test_the_cli_dispatches_research(monkeypatch):
    from topo_attn.lm import __main__ as cli

    seen = []
    monkeypatch.setattr(research, "main", lambda argv: seen.append(argv) or 0)
    assert cli.main(["research", "--length", "256"]) == 0
    assert seen == [["--length", "256"]]

