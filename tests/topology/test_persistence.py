"""Tests of topo_attn.topology.persistence: centroids, the elder-rule salience of #22 (against a slow all-pairs
reference), the minimum spanning tree (against scipy and an all-pairs Kruskal), and the barcode (against
gudhi)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse.csgraph
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import all_pairs_salience, kruskal_merges
from topo_attn import (block_centroids, block_salience, centroid_distances, minimum_spanning_tree,
                       persistence_barcode)
from topo_attn.gudhi_check import gudhi_barcode

SETTINGS = settings(max_examples=40, deadline=None)


def reference_salience(centroids: torch.Tensor) -> np.ndarray:
    """The all-pairs elder-rule reference on the package's distances."""
    return all_pairs_salience(centroid_distances(centroids))


def salience_np(centroids: torch.Tensor) -> np.ndarray:
    """The package's salience as a numpy array (checking dtype and shape on the way)."""
    out = block_salience(centroids)
    assert out.dtype == torch.float64
    assert out.shape == centroids.shape[:-1]
    return out.numpy()


def shuffled(points: np.ndarray, seed: int) -> torch.Tensor:
    """Points in a random order, as a float64 tensor (so ties are not all in index order)."""
    rng = np.random.default_rng(seed)
    return torch.from_numpy(points[rng.permutation(len(points))].astype(np.float64))


# ----------------------------------------------------------------------------------------- tie configs
def grid_points(seed: int) -> np.ndarray:
    """Integer grid 5 x 4 (many equal distances), scaled and shifted by integers."""
    rng = np.random.default_rng(seed)
    pts = np.array(list(itertools.product(range(5), range(4))), dtype=np.float64)
    return pts * rng.integers(1, 4) + rng.integers(-5, 6, size=2)


def tetrahedron_points(seed: int) -> np.ndarray:
    """Two regular tetrahedra (integer coordinates, all six edges equal), far apart."""
    rng = np.random.default_rng(seed)
    tet = np.array([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1]], dtype=np.float64)
    return np.concatenate([tet, tet * 2 + rng.integers(10, 20, size=3)])


def cross_polytope_points(seed: int) -> np.ndarray:
    """The 2D vertices +-e_k in D = 5: every non-antipodal pair at sqrt 2, plus the centre."""
    del seed
    eye = np.eye(5)
    return np.concatenate([eye, -eye, np.zeros((1, 5))])


def square_points(seed: int) -> np.ndarray:
    """Three squares of side 3 (integer coordinates), equal-size merges at equal distances."""
    rng = np.random.default_rng(seed)
    sq = np.array([[0, 0], [3, 0], [3, 3], [0, 3]], dtype=np.float64)
    return np.concatenate([sq, sq + [10, 0], sq + [0, 10]]) + rng.integers(-3, 4, size=2)


def duplicate_points(seed: int) -> np.ndarray:
    """Random points, each repeated 1 to 4 times (zero distances)."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((7, 3))
    return np.repeat(base, rng.integers(1, 5, size=7), axis=0)


def collinear_points(seed: int) -> np.ndarray:
    """Equally spaced points on a line (integer direction): all neighbour distances equal."""
    rng = np.random.default_rng(seed)
    return np.arange(12, dtype=np.float64)[:, None] * rng.integers(1, 4, size=4)


def identical_points(seed: int) -> np.ndarray:
    """One random point repeated: every distance is 0."""
    rng = np.random.default_rng(seed)
    return np.repeat(rng.standard_normal((1, 6)), 9, axis=0)


TIE_CONFIGS = [grid_points, tetrahedron_points, cross_polytope_points, square_points, duplicate_points,
               collinear_points, identical_points]


# --------------------------------------------------------------------------------------- block_centroids
@pytest.mark.parametrize("seq, block_size", [(97, 16), (64, 16), (5, 8), (33, 1), (200, 32), (333, 64)])
def test_block_centroids_match_direct_means(seq: int, block_size: int) -> None:
    """Each centroid is the float64 mean of its block's rows, the partial last block included."""
    gen = torch.Generator().manual_seed(seq * 100 + block_size)
    keys = torch.randn(seq, 24, generator=gen, dtype=torch.float32) * 3 + 1
    got = block_centroids(keys, block_size)
    nb = -(-seq // block_size)
    assert got.shape == (nb, 24) and got.dtype == torch.float64
    want = torch.stack([keys[b * block_size:(b + 1) * block_size].double().mean(dim=0) for b in range(nb)])
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)


def test_block_centroids_batched() -> None:
    """[B, H, S, D] keys give [B, H, n, D] centroids equal to the per-lane ones."""
    gen = torch.Generator().manual_seed(7)
    keys = torch.randn(2, 3, 50, 8, generator=gen)
    got = block_centroids(keys, 16)
    assert got.shape == (2, 3, 4, 8)
    for b, h in itertools.product(range(2), range(3)):
        assert torch.equal(got[b, h], block_centroids(keys[b, h], 16))
    # the last block holds 2 rows (48, 49)
    torch.testing.assert_close(got[1, 2, 3], keys[1, 2, 48:].double().mean(dim=0), rtol=1e-14, atol=1e-14)


# ------------------------------------------------------------------------------- salience: hand examples
def test_salience_hand_worked_examples() -> None:
    """Small cases worked out by hand from the rule (checks the reference as well as the package)."""
    # 0, 1, 3: (0,1)@1 writes block 0 (equal sizes: i's side); (1,2)@2 writes block 2 (smaller side)
    line = torch.tensor([[0.0], [1.0], [3.0]], dtype=torch.float64)
    # 0, 1, 10, 11: (0,1)@1 -> 0; (2,3)@1 -> 2; (1,2)@9 joins equal sizes -> {0, 1} overwritten with 9
    pairs = torch.tensor([[0.0], [1.0], [10.0], [11.0]], dtype=torch.float64)
    # 11, 10, 1, 0 (reversed): (0,1)@1 -> 0; (2,3)@1 -> 2; (1,2)@9 -> {0, 1}
    reverse = pairs.flip(0)
    for c, want in ((line, [1, 0, 2]), (pairs, [9, 9, 1, 0]), (reverse, [9, 9, 1, 0])):
        assert np.array_equal(reference_salience(c), np.array(want, dtype=np.float64))
        assert np.array_equal(salience_np(c), np.array(want, dtype=np.float64))


def test_single_block_salience_is_one() -> None:
    """n == 1 gives [1.0], batched too."""
    gen = torch.Generator().manual_seed(1)
    c = torch.randn(1, 5, generator=gen, dtype=torch.float64)
    assert salience_np(c).tolist() == [1.0]
    assert block_salience(torch.randn(3, 1, 4, generator=gen)).tolist() == [[1.0], [1.0], [1.0]]


# --------------------------------------------------------------------------- salience: random vs reference
@pytest.mark.parametrize("n, dim", [(1, 3), (2, 1), (3, 2), (5, 128), (17, 1), (64, 16), (64, 128), (200, 7),
                                    (200, 64)])
def test_salience_matches_all_pairs_reference_random(n: int, dim: int) -> None:
    """Fresh random centroids: the MST-based salience equals the all-pairs elder rule exactly."""
    gen = torch.Generator().manual_seed(1000 * n + dim)
    for _ in range(2):
        c = torch.randn(n, dim, generator=gen, dtype=torch.float64) * torch.rand(1, generator=gen, dtype=torch.float64) * 5
        assert np.array_equal(salience_np(c), reference_salience(c))


def test_salience_float32_centroids() -> None:
    """float32 centroids: distances are still computed in float64, identically for both."""
    gen = torch.Generator().manual_seed(3)
    c = torch.randn(40, 12, generator=gen, dtype=torch.float32)
    assert np.array_equal(salience_np(c), reference_salience(c))


@pytest.mark.parametrize("make", TIE_CONFIGS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_salience_matches_reference_with_ties(make, seed: int) -> None:
    """Exact ties (integer grids, regular polytopes, duplicates, collinear, identical) in random order."""
    c = shuffled(make(seed), seed)
    dist = centroid_distances(c)
    upper = dist[np.triu_indices(len(c), 1)]
    assert len(np.unique(upper)) < len(upper)  # the configuration really has tied distances
    assert np.array_equal(salience_np(c), all_pairs_salience(dist))


def test_salience_huge_coordinates_overflowing_distances() -> None:
    """Finite centroids whose distances overflow to inf still follow the rule (inf sorts last)."""
    c = torch.tensor([[0.0], [1e200], [2e200], [3.0], [-1e200]], dtype=torch.float64)
    dist = centroid_distances(c)
    assert np.isinf(dist).any()
    assert np.array_equal(salience_np(c), all_pairs_salience(dist))
    edges, _ = minimum_spanning_tree(c)
    assert (edges[:, 0] < edges[:, 1]).all()


@SETTINGS
@given(n=st.integers(1, 14), dim=st.integers(1, 4), integer=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_salience_matches_reference_hypothesis(n: int, dim: int, integer: bool, seed: int) -> None:
    """Random small point sets; integer coordinates in [-2, 2] give many ties and duplicates."""
    gen = torch.Generator().manual_seed(seed)
    if integer:
        c = torch.randint(-2, 3, (n, dim), generator=gen).double()
    else:
        c = torch.randn(n, dim, generator=gen, dtype=torch.float64)
    assert np.array_equal(salience_np(c), reference_salience(c))


def test_salience_batched_equals_per_lane() -> None:
    """[L, n, D] and [B, H, n, D] inputs give each lane's own salience."""
    gen = torch.Generator().manual_seed(11)
    c = torch.randn(5, 30, 8, generator=gen, dtype=torch.float64)
    c[3] = torch.randint(-1, 2, (30, 8), generator=gen).double()  # a lane with ties
    got = block_salience(c)
    assert got.shape == (5, 30)
    lanes = [salience_np(c[lane]) for lane in range(5)]
    for lane in range(5):
        assert np.array_equal(got[lane].numpy(), lanes[lane])
        assert np.array_equal(lanes[lane], reference_salience(c[lane]))
    assert not np.array_equal(lanes[0], lanes[1])
    four = block_salience(c[:4].reshape(2, 2, 30, 8))
    assert four.shape == (2, 2, 30)
    assert torch.equal(four.reshape(4, 30), got[:4])


# --------------------------------------------------------------------------------- minimum spanning tree
@pytest.mark.parametrize("n, dim", [(2, 3), (10, 2), (64, 16), (150, 128)])
def test_mst_matches_scipy_total(n: int, dim: int) -> None:
    """n - 1 edges with i < j, spanning, total length equal to scipy's, lengths in merge order."""
    gen = torch.Generator().manual_seed(n + 7 * dim)
    c = torch.randn(n, dim, generator=gen, dtype=torch.float64)
    edges, lengths = minimum_spanning_tree(c)
    assert edges.shape == (n - 1, 2) and lengths.shape == (n - 1,)
    assert edges.dtype == np.int64 and lengths.dtype == np.float64
    assert (edges[:, 0] < edges[:, 1]).all()
    dist = centroid_distances(c)
    assert np.array_equal(lengths, dist[edges[:, 0], edges[:, 1]])
    assert (np.diff(lengths) >= 0).all()
    scipy_total = scipy.sparse.csgraph.minimum_spanning_tree(dist).sum()
    np.testing.assert_allclose(lengths.sum(), scipy_total, rtol=1e-12)
    # spanning: the edges connect every vertex
    adjacency = np.zeros((n, n))
    adjacency[edges[:, 0], edges[:, 1]] = 1
    assert scipy.sparse.csgraph.connected_components(adjacency, directed=False)[0] == 1


@pytest.mark.parametrize("make", TIE_CONFIGS, ids=lambda f: f.__name__)
def test_mst_edges_are_the_all_pairs_kruskal_merges(make) -> None:
    """Under ties, the tree edges (in order) are exactly where all-pairs Kruskal by (d, i, j) merges."""
    c = shuffled(make(5), 5)
    dist = centroid_distances(c)
    edges, lengths = minimum_spanning_tree(c)
    merges = kruskal_merges(dist)
    assert [(int(i), int(j), float(d)) for (i, j), d in zip(edges, lengths)] == merges


def test_mst_single_block() -> None:
    """One centroid: no edges."""
    edges, lengths = minimum_spanning_tree(torch.tensor([[0.5, -2.0]], dtype=torch.float64))
    assert edges.shape == (0, 2) and lengths.shape == (0,)


# --------------------------------------------------------------------------------------------- barcode
def check_barcode(c: torch.Tensor) -> None:
    """Shape, births, infinite bar, deaths = sorted MST lengths, and gudhi's diagram."""
    n = len(c)
    bars = persistence_barcode(c)
    assert bars.shape == (n, 2) and bars.dtype == np.float64
    assert (bars[:, 0] == 0).all()
    assert np.isinf(bars[-1, 1]) and np.isfinite(bars[:-1, 1]).all()
    _, lengths = minimum_spanning_tree(c)
    assert np.array_equal(bars[:-1, 1], np.sort(lengths))
    ref = gudhi_barcode(c)
    assert ref.shape == (n, 2)
    assert np.isinf(ref[:, 1]).sum() == 1
    assert (ref[:, 0] == 0).all()
    np.testing.assert_allclose(np.sort(bars[:-1, 1]), np.sort(ref[np.isfinite(ref[:, 1]), 1]), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("n, dim", [(2, 1), (3, 2), (20, 3), (60, 16), (120, 64)])
def test_barcode_matches_gudhi_random(n: int, dim: int) -> None:
    """Random centroids: our dimension-0 barcode equals gudhi's Rips persistence."""
    gen = torch.Generator().manual_seed(31 * n + dim)
    check_barcode(torch.randn(n, dim, generator=gen, dtype=torch.float64) * 2)


@pytest.mark.parametrize("make", TIE_CONFIGS, ids=lambda f: f.__name__)
def test_barcode_matches_gudhi_ties(make) -> None:
    """Ties and duplicates (zero-length bars) against gudhi."""
    check_barcode(shuffled(make(2), 2))


def test_barcode_single_block() -> None:
    """One centroid: a single infinite bar."""
    bars = persistence_barcode(torch.tensor([[1.0, 2.0]], dtype=torch.float64))
    assert bars.tolist() == [[0.0, float("inf")]]


def test_barcode_is_not_the_salience_multiset() -> None:
    """The barcode has one finite bar per merge (plus one infinite bar); the salience writes a merge's
    distance to *every* block of the smaller component and later merges overwrite earlier writes, so it
    repeats values, drops bars and leaves the elder block at 0. For 0, 1, 10, 11: bars {1, 1, 9, inf},
    saliences {9, 9, 1, 0} (the second bar of length 1 was overwritten by 9)."""
    c = torch.tensor([[0.0], [1.0], [10.0], [11.0]], dtype=torch.float64)
    deaths = persistence_barcode(c)[:, 1]
    sal = salience_np(c)
    assert deaths.tolist() == [1.0, 1.0, 9.0, float("inf")]
    assert sorted(sal.tolist()) == [0.0, 1.0, 9.0, 9.0]
    assert sorted(deaths.tolist()) != sorted(sal.tolist())
    # even the finite parts differ, not only the 0 / inf entries
    assert sorted(deaths[:-1].tolist()) != sorted(s for s in sal.tolist() if s > 0)


# ------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("fn", [block_salience, minimum_spanning_tree, persistence_barcode])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_centroids_rejected(fn, bad: float) -> None:
    """NaN or Inf anywhere -> ValueError naming centroids."""
    gen = torch.Generator().manual_seed(0)
    c = torch.randn(6, 3, generator=gen, dtype=torch.float64)
    c[4, 1] = bad
    with pytest.raises(ValueError, match="centroids"):
        fn(c)


@pytest.mark.parametrize("fn, shape", [(block_salience, (5,)), (minimum_spanning_tree, (2, 5, 3)),
                                       (persistence_barcode, (2, 5, 3)), (minimum_spanning_tree, (5,))])
def test_wrong_rank_centroids_rejected(fn, shape: tuple[int, ...]) -> None:
    """[n, D] (or [..., n, D] for block_salience) is required -> ValueError."""
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="centroids must have shape"):
        fn(torch.randn(shape, generator=gen, dtype=torch.float64))


@pytest.mark.parametrize("fn", [block_salience, minimum_spanning_tree, persistence_barcode])
def test_integer_centroids_rejected(fn) -> None:
    """Integer centroids -> TypeError."""
    with pytest.raises(TypeError, match="centroids must be a floating-point tensor"):
        fn(torch.arange(12).reshape(4, 3))


def test_empty_centroids_rejected() -> None:
    """Zero blocks -> ValueError."""
    with pytest.raises(ValueError, match="at least one block"):
        block_salience(torch.empty(0, 3, dtype=torch.float64))
