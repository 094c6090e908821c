"""0-dimensional persistence of key-block centroids on the CPU, exactly: distances, the minimum spanning tree,
the elder-rule salience of #22 and the barcode. This is the definition the GPU kernels (:mod:`.gpu`) are tested
against; :mod:`.build` picks the path.

Edges are ordered strictly by ``(distance, i, j)`` with ``i < j``. Under a strict total order the minimum
spanning tree is unique, and Kruskal's algorithm over *all* pairs (what #22 runs) merges components exactly
along that tree's edges, in that order. So the salience can be computed from the ``n - 1`` tree edges
alone, which Prim's algorithm finds in ``O(n^2)`` time and ``O(n)`` memory beyond the distance matrix,
without sorting all pairs. ``scipy.sparse.csgraph.minimum_spanning_tree`` is not used: it breaks ties in
its own way and treats zero distances (duplicate centroids) as missing edges.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from scipy.spatial.distance import cdist

from .._checks import check_finite, check_int, check_tensor


def block_means(keys: torch.Tensor, block_size: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Mean of each key block, in torch on the keys' device. keys: ``[..., S, D]`` -> ``[..., n, D]`` with
    ``n = ceil(S / block_size)``; a partial last block averages its real rows. Summed in ``dtype`` without a
    converted copy of the keys. Raises ``TypeError``/``ValueError`` for a non-tensor, a bad block size or
    fewer than two dimensions."""
    keys = check_tensor("keys", keys)
    block_size = check_int("block_size", block_size, 1)
    if keys.ndim < 2:
        raise ValueError(f"keys must have shape [..., S, D], got shape {tuple(keys.shape)}")
    seq, dim = keys.shape[-2], keys.shape[-1]
    nb = -(-seq // block_size)
    pad = nb * block_size - seq
    x = torch.nn.functional.pad(keys, (0, 0, 0, pad)) if pad else keys
    # summed in dtype without a converted copy of the keys
    sums = x.reshape(*keys.shape[:-2], nb, block_size, dim).sum(dim=-2, dtype=dtype)
    sizes = torch.full((nb, 1), float(block_size), dtype=dtype, device=keys.device)
    sizes[-1] = block_size - pad
    return sums / sizes


def check_centroids(centroids: object, batched: bool) -> torch.Tensor:
    """Centroids ``[n, D]`` (``[..., n, D]`` when ``batched``), floating, at least one block, finite; else
    ``TypeError``/``ValueError`` naming ``centroids``."""
    centroids = check_tensor("centroids", centroids)
    if centroids.ndim < 2 or (not batched and centroids.ndim != 2):
        shape = "[..., n, D]" if batched else "[n, D]"
        raise ValueError(f"centroids must have shape {shape}, got shape {tuple(centroids.shape)}")
    if not centroids.is_floating_point():
        raise TypeError(f"centroids must be a floating-point tensor, got {centroids.dtype}")
    if centroids.shape[-2] == 0:
        raise ValueError("centroids must hold at least one block, got 0")
    check_finite("centroids", centroids)
    return centroids


def centroid_distances(centroids: torch.Tensor) -> np.ndarray:
    """Euclidean distances ``[n, n]`` (float64, numpy) between centroids ``[n, D]``, each computed as
    ``sqrt(sum((c_i - c_j)^2))`` (no Gram-matrix shortcut), exactly symmetric with a zero diagonal.

    Only the upper triangle is computed, in row bands spread over threads (scipy's ``cdist`` releases the
    GIL), and mirrored."""
    c = centroids.detach().to("cpu", torch.float64).numpy()
    n = c.shape[0]
    dist = np.empty((n, n))
    threads = min(os.cpu_count() or 1, 8)
    bands = 1 if n < 256 else 4 * threads
    # band edges with equal shares of the triangle: rows [lo, hi) against columns [lo, n)
    edges = np.unique(np.round(n - n * np.sqrt(1 - np.arange(bands + 1) / bands)).astype(int))

    def fill(lo: int, hi: int) -> None:
        band = cdist(c[lo:hi], c[lo:])
        corner = np.triu(band[:, :hi - lo], 1)
        dist[lo:hi, lo:hi] = corner + corner.T
        dist[lo:hi, hi:] = band[:, hi - lo:]
        dist[hi:, lo:hi] = band[:, hi - lo:].T

    if len(edges) <= 2:
        fill(0, n)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(fill, edges[:-1], edges[1:]))
    return dist


def prim_tree(dist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Minimum spanning tree of the complete graph ``dist [n, n]`` under the strict order
    ``(d, min(i, j), max(i, j))``. Returns edges ``[n - 1, 2]`` (``i < j``) and lengths ``[n - 1]``."""
    n = dist.shape[0]
    outside = np.ones(n, dtype=bool)
    outside[0] = False
    best = dist[0].copy()  # best[u]: length of the lightest edge from the tree to u
    source = np.zeros(n, dtype=np.int64)  # its tree endpoint
    best[0] = np.inf
    edges = np.empty((max(n - 1, 0), 2), dtype=np.int64)
    lengths = np.empty(max(n - 1, 0), dtype=np.float64)
    for step in range(n - 1):
        # the lightest edge leaving the tree; ties by the (low, high) endpoint pair. Tree vertices hold inf,
        # so they tie only when distances overflow to inf: the slow path masks them out.
        v = int(best.argmin())
        d = best[v]
        if np.count_nonzero(best == d) > 1:
            ties = np.flatnonzero(outside & (best == d))
            lo, hi = np.minimum(ties, source[ties]), np.maximum(ties, source[ties])
            v = int(ties[np.lexsort((hi, lo))[0]])
        u = int(source[v])
        edges[step] = (min(u, v), max(u, v))
        lengths[step] = d
        outside[v] = False
        best[v] = np.inf
        # edges from v may now be the lightest way to reach the vertices still outside
        row = dist[v]
        closer = outside & (row < best)
        equal = row == best
        if equal.any():
            equal = np.flatnonzero(outside & equal)
            old_lo, old_hi = np.minimum(equal, source[equal]), np.maximum(equal, source[equal])
            new_lo, new_hi = np.minimum(equal, v), np.maximum(equal, v)
            closer[equal] = (new_lo < old_lo) | ((new_lo == old_lo) & (new_hi < old_hi))
        best[closer] = row[closer]
        source[closer] = v
    return edges, lengths


def merge_order(edges: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Order in which Kruskal merges along the tree edges: by (length, i, j)."""
    return np.lexsort((edges[:, 1], edges[:, 0], lengths))


def minimum_spanning_tree(centroids: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Tree edges ``[n - 1, 2]`` (int64, ``i < j``) and lengths ``[n - 1]`` (float64) of the minimum
    spanning tree of centroids ``[n, D]`` under the strict order ``(distance, i, j)``, in merge order."""
    centroids = check_centroids(centroids, batched=False)
    edges, lengths = prim_tree(centroid_distances(centroids))
    order = merge_order(edges, lengths)
    return edges[order], lengths[order]


def elder_salience(n: int, edges: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Union-find over the tree edges in merge order: at each merge every block of the smaller component
    (on equal sizes, the component of the lower endpoint) takes the merge distance."""
    if n == 1:
        return np.ones(1)
    salience = np.zeros(n)
    component = np.arange(n)
    members: list[list[int] | None] = [[i] for i in range(n)]
    for (i, j), d in zip(edges.tolist(), lengths.tolist()):
        ci, cj = component[i], component[j]
        small, large = (ci, cj) if len(members[ci]) <= len(members[cj]) else (cj, ci)
        moved = members[small]
        salience[moved] = d
        component[moved] = large
        members[large].extend(moved)
        members[small] = None
    return salience


def lane_saliences(centroids: torch.Tensor) -> torch.Tensor:
    """#22's elder-rule salience of checked centroids ``[..., n, D]`` (see :func:`~topo_attn.block_salience`)
    -> float64 ``[..., n]`` on the centroids' device: float64 distances, Prim and the union-find in numpy,
    one lane after another."""
    n = centroids.shape[-2]
    flat = centroids.reshape(-1, n, centroids.shape[-1])
    out = np.empty((flat.shape[0], n))
    for lane in range(flat.shape[0]):
        edges, lengths = prim_tree(centroid_distances(flat[lane]))
        order = merge_order(edges, lengths)
        out[lane] = elder_salience(n, edges[order], lengths[order])
    return torch.from_numpy(out).reshape(centroids.shape[:-1]).to(centroids.device)


def persistence_barcode(centroids: torch.Tensor) -> np.ndarray:
    """The 0-dimensional persistence barcode of the Rips filtration on centroids ``[n, D]``: ``[n, 2]``
    float64 rows ``(birth, death)``, births 0, deaths the ``n - 1`` minimum-spanning-tree edge lengths in
    increasing order, then one infinite bar.

    This is not the multiset of per-block saliences: the barcode has one finite bar per merge, while the
    salience writes a merge distance to *every* block of the smaller component and later merges overwrite
    earlier ones, so saliences repeat values and can skip bars entirely."""
    centroids = check_centroids(centroids, batched=False)
    _, lengths = prim_tree(centroid_distances(centroids))
    deaths = np.append(np.sort(lengths), np.inf)
    return np.stack([np.zeros_like(deaths), deaths], axis=1)


def top_salient_blocks(salience: torch.Tensor, topk: int) -> torch.Tensor:
    """Indices ``[..., min(topk, n)]`` (int64) of the ``topk`` most salient blocks, highest first; ties go
    to the lower block index."""
    topk = check_int("topk", topk, 0)
    order = torch.sort(salience, dim=-1, descending=True, stable=True).indices
    return order[..., :topk]
