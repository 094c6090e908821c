"""Cross-check of :func:`~topo_attn.persistence_barcode` against gudhi's Rips persistence (gudhi, an optional
dependency, is imported here only)."""

from __future__ import annotations

import numpy as np
import torch

from .topology import persistence_barcode


class BarcodeMismatchError(AssertionError):
    """Our barcode and gudhi's differ."""


def gudhi_barcode(centroids: torch.Tensor) -> np.ndarray:
    """gudhi's dimension-0 persistence of the Rips filtration on centroids ``[n, D]``: ``[n, 2]`` float64
    rows (birth, death) sorted by death, the infinite bar last; zero-length bars are kept."""
    import gudhi

    points = centroids.detach().to("cpu", torch.float64).numpy()
    tree = gudhi.RipsComplex(points=points).create_simplex_tree(max_dimension=1)
    bars = np.array([pair for dim, pair in tree.persistence(min_persistence=-1) if dim == 0],
                    dtype=np.float64).reshape(-1, 2)
    return bars[np.lexsort((bars[:, 0], bars[:, 1]))]


def compare_barcodes(ours: np.ndarray, theirs: np.ndarray, rtol: float = 1e-9, atol: float = 1e-12) -> None:
    """Raise :class:`BarcodeMismatchError` unless the two H0 barcodes ``[n, 2]`` hold the same bars: equal
    counts, equal numbers of infinite bars, and births and finite deaths equal (sorted by death) within
    ``rtol``/``atol``."""
    ours, theirs = (np.asarray(b, dtype=np.float64).reshape(-1, 2) for b in (ours, theirs))
    if ours.shape != theirs.shape:
        raise BarcodeMismatchError(f"bar counts differ: ours {len(ours)}, gudhi {len(theirs)}")
    ours, theirs = (b[np.lexsort((b[:, 0], b[:, 1]))] for b in (ours, theirs))
    inf_ours, inf_theirs = np.isinf(ours[:, 1]), np.isinf(theirs[:, 1])
    if not np.array_equal(inf_ours, inf_theirs):
        raise BarcodeMismatchError(f"infinite bars differ: ours {inf_ours.sum()}, gudhi {inf_theirs.sum()}")
    finite = ~inf_ours
    for what, a, b in (("births", ours[:, 0], theirs[:, 0]), ("deaths", ours[finite, 1], theirs[finite, 1])):
        close = np.isclose(a, b, rtol=rtol, atol=atol)
        if not close.all():
            i = int(np.flatnonzero(~close)[0])
            raise BarcodeMismatchError(f"{what} differ at sorted bar {i}: ours {a[i]!r}, gudhi {b[i]!r} "
                                       f"({int((~close).sum())} of {len(a)} differ; rtol={rtol}, atol={atol})")


def check_barcode_against_gudhi(centroids: torch.Tensor, rtol: float = 1e-9,
                                atol: float = 1e-12) -> tuple[np.ndarray, np.ndarray]:
    """Our barcode and gudhi's for centroids ``[n, D]``, both ``[n, 2]`` sorted by death; raises
    :class:`BarcodeMismatchError` when they differ (see :func:`compare_barcodes`)."""
    ours, theirs = persistence_barcode(centroids), gudhi_barcode(centroids)
    compare_barcodes(ours, theirs, rtol, atol)
    return ours, theirs
