"""The gudhi cross-check raises on any difference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import topo_attn as ta
from topo_attn.gudhi_check import BarcodeMismatchError, check_barcode_against_gudhi, compare_barcodes, gudhi_barcode
from topo_attn.samples import load_key_set


def test_sample_key_sets_agree_with_gudhi():
    for name, block_size in (("clustered", 64), ("outliers", 32), ("long", 64)):
        centroids = ta.block_centroids(load_key_set(name), block_size)
        ours, theirs = check_barcode_against_gudhi(centroids)
        assert ours.shape == theirs.shape == (centroids.shape[0], 2)
        assert np.isinf(theirs[-1, 1]) and np.all(np.diff(theirs[:-1, 1]) >= 0)  # sorted by death


def test_duplicate_centroids_keep_zero_length_bars():
    c = torch.tensor([[0.0, 0.0], [0.0, 0.0], [3.0, 4.0]], dtype=torch.float64)
    np.testing.assert_array_equal(gudhi_barcode(c), [[0, 0], [0, 5], [0, np.inf]])
    check_barcode_against_gudhi(c)


@pytest.mark.parametrize("change, match", [
    (lambda b: b[:-1], "bar counts differ"),
    (lambda b: np.where(np.isinf(b), 7.0, b), "infinite bars differ"),
    (lambda b: b + np.array([0.0, 1e-6]) * np.isfinite(b), "deaths differ"),
    (lambda b: b + np.array([1e-3, 0.0]), "births differ"),
])
def test_mismatch_raises(change, match):
    c = ta.block_centroids(load_key_set("outliers"), 64)
    ours = ta.persistence_barcode(c)
    with pytest.raises(BarcodeMismatchError, match=match):
        compare_barcodes(change(ours.copy()), gudhi_barcode(c))
    assert issubclass(BarcodeMismatchError, AssertionError)
