"""Which value a model looks up in multi_value (topo_attn.lm.value_confusion): the mass matrix against a plain
per-probe reference, with stand-in models whose answer is known (one that knows every next byte, one that repeats
the first value, one with a fixed distribution), and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from topo_attn.lm import retrieval
from topo_attn.lm.value_confusion import confusion_markdown, value_confusion


def filler(seed: int, lines: int = 600) -> bytes:
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "value", "total", "index", "count"]
    out = [" " * int(rng.choice([0, 4])) + f"{rng.choice(words)}_{i} = {int(rng.integers(1000, 99999))}"
           for i in range(lines)]
    return ("\n".join(out) + "\n").encode()


@pytest.fixture(scope="module")
def probes():
    data = filler(3)
    return [retrieval.multi_value(data, 700, 1536, seed, fmt, values=4, decoys=3)
            for seed, fmt in enumerate(["dict", "arrow", "yaml", "json"] * 3)]


class Fixed(torch.nn.Module):
    """The same next-byte logits at every position."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = torch.nn.Parameter(logits)

    def forward(self, ids):
        return type("Out", (), {"logits": self.logits.expand(*ids.shape, 256)})()


class OneHot(torch.nn.Module):
    """Certain of one byte per position: the true next byte (``first=None``) or, everywhere, the byte ``first``
    (the first byte of a probe's first value)."""

    def __init__(self, first: int | None = None):
        super().__init__()
        self.w, self.first = torch.nn.Parameter(torch.zeros(1)), first

    def forward(self, ids):
        nxt = torch.roll(ids, -1, dims=1) if self.first is None else torch.full_like(ids, self.first)
        return type("Out", (), {"logits": 50.0 * torch.nn.functional.one_hot(nxt, 256).double()})()


def firsts(probe) -> list[int]:
    fmt = retrieval.FORMATS["multi_value"][probe.format]
    return [v[0] for v in probe.answer.split(fmt.sep.encode())]


def reference(prob_of, probes) -> np.ndarray:
    """Row k, column j: the mean over the probes where value j's first byte differs from value k's (or j = k)
    of prob_of(probe, k)[that byte]; the last column: 1 - the mass on the key's distinct first bytes."""
    cells = [[[] for _ in range(5)] for _ in range(4)]
    for probe in probes:
        f = firsts(probe)
        for k in range(4):
            p = prob_of(probe, k)
            for j in range(4):
                if j == k or f[j] != f[k]:
                    cells[k][j].append(p[f[j]])
            cells[k][4].append(1 - sum(p[b] for b in set(f)))
    return np.array([[np.mean(c) if c else np.nan for c in row] for row in cells])


def test_fixed_distribution_matches_the_reference(probes):
    assert any(len(set(firsts(p))) < 4 for p in probes)  # some probes have values that start alike
    torch.manual_seed(0)
    logits = torch.randn(256, dtype=torch.float64) * 3
    found = value_confusion(Fixed(logits), probes)
    p = torch.softmax(logits, -1).numpy()
    np.testing.assert_allclose(found["mass"], reference(lambda probe, k: p, probes), rtol=1e-9, atol=1e-12)
    assert (found["probes"].diagonal() == len(probes)).all()


def test_a_model_that_knows_every_byte_looks_up_the_right_value(probes):
    found = value_confusion(OneHot(), probes)
    np.testing.assert_allclose(np.diag(found["mass"][:, :4]), 1.0)
    off = found["mass"][:, :4][~np.eye(4, dtype=bool)]
    np.testing.assert_allclose(off[~np.isnan(off)], 0.0, atol=1e-12)
    np.testing.assert_allclose(found["mass"][:, 4], 0.0, atol=1e-12)


def test_a_model_that_repeats_the_first_value_fills_column_zero(probes):
    rows = []
    for probe in probes:  # one probe at a time: the stand-in knows its probe's first value
        rows.append(value_confusion(OneHot(firsts(probe)[0]), [probe]))
    mass = np.nanmean([r["mass"] for r in rows], axis=0)
    np.testing.assert_allclose(mass[:, 0], 1.0)
    f = [firsts(p) for p in probes]
    # value k (k >= 1) is right only on probes whose values k and 0 start alike (those leave column 0 out)
    for k in range(1, 4):
        alike = np.mean([g[k] == g[0] for g in f])
        assert mass[k, k] == pytest.approx(alike)
    np.testing.assert_allclose(mass[:, 4], 0.0, atol=1e-12)


def test_markdown_has_a_row_per_value_and_marks_missing_cells(probes):
    found = value_confusion(OneHot(), probes[:2])
    found["mass"][1, 2] = np.nan
    table = confusion_markdown(found)
    assert table.splitlines()[0] == "| lookup of | value 0 | value 1 | value 2 | value 3 | no value of the key |"
    assert table.splitlines()[3].startswith("| value 1 | ") and " - " in table.splitlines()[3]
    assert len(table.splitlines()) == 6


def test_refusals(probes):
    data = filler(4)
    with pytest.raises(ValueError, match="at least one multi_value probe"):
        value_confusion(OneHot(), [])
    other = retrieval.multi_key(data, 700, 1536, 0, "dict")
    with pytest.raises(ValueError, match=r"all be multi_value probes, got tasks \['multi_key'\]"):
        value_confusion(OneHot(), [probes[0], other])
    three = retrieval.multi_value(data, 700, 1536, 1, "dict", values=3)
    with pytest.raises(ValueError, match=r"same number of values, got \[3, 4\]"):
        value_confusion(OneHot(), [probes[0], three])
