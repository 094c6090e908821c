"""0-dimensional persistence of key-block centroids: distances, the minimum spanning tree, the elder-rule
salience of #22 and the barcode.

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

from .validation import check_finite, check_int, check_tensor

MAX_GPU_BLOCKS = 4096
"""Most key blocks per lane that the GPU kernels take (Prim's per-block state lives in registers); CUDA inputs
with more blocks are computed on the CPU."""


def block_centroids(keys: torch.Tensor, block_size: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Mean of each key block. keys: ``[..., S, D]`` -> ``[..., n, D]`` with ``n = ceil(S / block_size)``;
    a partial last block averages its real rows. Computed in ``dtype`` (float64 by default).

    Floating-point keys on a CUDA device with a float32 or float64 ``dtype`` go through a Triton kernel
    (:mod:`topo_attn.kernels.centroids`) that reads the keys once in their own dtype and strides. Its sums
    run in another order than torch's, so they can differ in the last bits, except where they are exact:
    float64 sums of float16 keys, or of bfloat16 keys of ordinary range, equal the CPU result bit for bit."""
    keys = check_tensor("keys", keys)
    block_size = check_int("block_size", block_size, 1)
    if keys.ndim < 2:
        raise ValueError(f"keys must have shape [..., S, D], got shape {tuple(keys.shape)}")
    seq, dim = keys.shape[-2], keys.shape[-1]
    if keys.is_cuda and keys.is_floating_point() and dtype in (torch.float32, torch.float64):
        from .kernels.centroids import block_centroids_kernel  # triton is imported on first use

        out = block_centroids_kernel(keys.reshape(keys.shape[:-2].numel(), seq, dim), block_size, dtype)
        return out.reshape(*keys.shape[:-2], out.shape[-2], dim)
    nb = -(-seq // block_size)
    pad = nb * block_size - seq
    x = torch.nn.functional.pad(keys, (0, 0, 0, pad)) if pad else keys
    # summed in dtype without a converted copy of the keys
    sums = x.reshape(*keys.shape[:-2], nb, block_size, dim).sum(dim=-2, dtype=dtype)
    sizes = torch.full((nb, 1), float(block_size), dtype=dtype, device=keys.device)
    sizes[-1] = block_size - pad
    return sums / sizes


def _check_centroids(centroids: torch.Tensor, batched: bool) -> torch.Tensor:
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


def _prim(dist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def _merge_order(edges: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Order in which Kruskal merges along the tree edges: by (length, i, j)."""
    return np.lexsort((edges[:, 1], edges[:, 0], lengths))


def minimum_spanning_tree(centroids: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Tree edges ``[n - 1, 2]`` (int64, ``i < j``) and lengths ``[n - 1]`` (float64) of the minimum
    spanning tree of centroids ``[n, D]`` under the strict order ``(distance, i, j)``, in merge order."""
    centroids = _check_centroids(centroids, batched=False)
    edges, lengths = _prim(centroid_distances(centroids))
    order = _merge_order(edges, lengths)
    return edges[order], lengths[order]


def _elder_salience(n: int, edges: np.ndarray, lengths: np.ndarray) -> np.ndarray:
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


def block_salience(centroids: torch.Tensor) -> torch.Tensor:
    """#22's elder-rule salience of each block. centroids: ``[..., n, D]`` -> ``[..., n]``, on the
    centroids' device.

    Kruskal over pairs ordered by ``(distance, i, j)``; when an edge joins two components, every block of
    the smaller one (equal sizes: the one holding ``i``) takes that distance, overwriting earlier values.
    A block that is never on the smaller side keeps 0; a single block gets 1.

    On the CPU: float64 distances, Prim and the union-find in numpy, one lane after another; the result is
    float64. On a CUDA device (``n <=`` :data:`MAX_GPU_BLOCKS`): Triton kernels, all lanes at once
    (:mod:`topo_attn.kernels.salience`), computed and returned in the centroids' dtype. float64 centroids
    give the CPU path's trees and saliences (distances may differ in the last bit: the sum of squares is
    rounded in another order, which changes a schedule only if two distances agree to about 1e-16). With
    float32 centroids, distances within about ``1e-7 * sqrt(D)`` of each other can swap places, which may
    change the tree, the saliences and so the schedule where keys nearly tie; random keys do not."""
    return _salience(_check_centroids(centroids, batched=True))


def _salience(centroids: torch.Tensor) -> torch.Tensor:
    """:func:`block_salience` of already checked centroids."""
    n = centroids.shape[-2]
    flat = centroids.reshape(-1, n, centroids.shape[-1])
    if centroids.is_cuda and n <= MAX_GPU_BLOCKS:
        from .kernels.salience import salience_kernels  # triton is imported on first use

        if flat.dtype not in (torch.float32, torch.float64):
            flat = flat.to(torch.float32)
        return salience_kernels(flat.contiguous()).reshape(centroids.shape[:-1])
    out = np.empty((flat.shape[0], n))
    for lane in range(flat.shape[0]):
        edges, lengths = _prim(centroid_distances(flat[lane]))
        order = _merge_order(edges, lengths)
        out[lane] = _elder_salience(n, edges[order], lengths[order])
    return torch.from_numpy(out).reshape(centroids.shape[:-1]).to(centroids.device)


def persistence_barcode(centroids: torch.Tensor) -> np.ndarray:
    """The 0-dimensional persistence barcode of the Rips filtration on centroids ``[n, D]``: ``[n, 2]``
    float64 rows ``(birth, death)``, births 0, deaths the ``n - 1`` minimum-spanning-tree edge lengths in
    increasing order, then one infinite bar.

    This is not the multiset of per-block saliences: the barcode has one finite bar per merge, while the
    salience writes a merge distance to *every* block of the smaller component and later merges overwrite
    earlier ones, so saliences repeat values and can skip bars entirely."""
    centroids = _check_centroids(centroids, batched=False)
    _, lengths = _prim(centroid_distances(centroids))
    deaths = np.append(np.sort(lengths), np.inf)
    return np.stack([np.zeros_like(deaths), deaths], axis=1)


def top_salient_blocks(salience: torch.Tensor, topk: int) -> torch.Tensor:
    """Indices ``[..., min(topk, n)]`` (int64) of the ``topk`` most salient blocks, highest first; ties go
    to the lower block index."""
    topk = check_int("topk", topk, 0)
    order = torch.sort(salience, dim=-1, descending=True, stable=True).indices
    return order[..., :topk]
