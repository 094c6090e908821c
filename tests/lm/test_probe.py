"""The passkey probe's construction (the copy content of training windows: tests/lm/test_training_copies.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from topo_attn.lm import probe
from topo_attn.lm.train import probe_distances, probe_set

LINE = re.compile(rb'\n([a-z]{3,8}_[a-z]{3,8}) = "([0-9a-zA-Z]+)"\n')


def document(length: int, seed: int = 0) -> np.ndarray:
    """Random printable bytes without quotes or newlines, so that only inserted key lines match LINE."""
    rng = np.random.default_rng(seed)
    return rng.integers(ord("("), ord("~"), length).astype(np.uint8)


def test_key_line_shape_and_value_offset():
    rng = np.random.default_rng(0)
    for value_len in (1, 16, 24):
        line, at = probe.key_line(rng, value_len)
        match = LINE.fullmatch(line)
        assert match and len(match.group(2)) == value_len
        assert line[at:at + value_len] == match.group(2) and set(match.group(2)) <= set(probe.HEX)


@pytest.mark.parametrize("length, distance, tail", [(1024, 128, 32), (1024, 900, 32), (4096, 3000, 0), (512, 60, 5)])
def test_passkey_document_places_two_copies_at_the_distance(length, distance, tail):
    doc = document(length, seed=distance)
    key = probe.passkey_document(doc, distance, np.random.default_rng(distance), value_len=16, tail=tail)
    assert key.ids.dtype == np.uint8 and key.ids.shape == (length,) and key.distance == distance
    assert key.targets.dtype == np.int64 and len(key.targets) == 16
    assert np.array_equal(key.targets, np.arange(key.targets[0], key.targets[0] + 16))
    value = key.ids[key.targets]
    # the first copy of the value sits exactly `distance` bytes earlier
    assert np.array_equal(key.ids[key.targets - distance], value)
    lines = LINE.findall(key.ids.tobytes())
    assert len(lines) == 2 and lines[0] == lines[1] and lines[0][1] == value.tobytes()
    # the second line ends `tail` bytes before the end, and the document's own bytes fill the rest in order
    body = key.ids.tobytes()
    end = body.rindex(b'"\n') + 2
    assert length - end == tail
    line_len = len(LINE.search(body).group(0))
    assert LINE.sub(b"", body, count=2) == doc.tobytes()[: length - 2 * line_len]


def test_passkey_document_is_seeded():
    doc = document(1024)
    a = probe.passkey_document(doc, 300, np.random.default_rng(5))
    b = probe.passkey_document(doc, 300, np.random.default_rng(5))
    c = probe.passkey_document(doc, 300, np.random.default_rng(6))
    assert np.array_equal(a.ids, b.ids) and not np.array_equal(a.ids, c.ids)


def test_passkey_document_errors():
    doc = document(256)
    with pytest.raises(ValueError, match="does not fit"):
        probe.passkey_document(doc, 250, np.random.default_rng(0))
    with pytest.raises(ValueError, match="does not fit"):
        probe.passkey_document(doc, 10, np.random.default_rng(0))  # shorter than the line itself
    with pytest.raises(ValueError, match="distance must be >= 1"):
        probe.passkey_document(doc, 0, np.random.default_rng(0))
    with pytest.raises(TypeError, match="value_len must be an int"):
        probe.passkey_document(doc, 100, np.random.default_rng(0), value_len=2.5)


def test_probe_set_and_distances():
    assert probe_distances(8192) == [1024, 2048, 4096, 8064]
    assert probe_distances(2048) == [1024, 1920]
    docs = np.stack([document(2048, seed=s) for s in range(3)])
    probes = probe_set(docs, probe_distances(2048), 4, seed=0)
    assert [p.distance for p in probes] == [1024] * 4 + [1920] * 4
    again = probe_set(docs, probe_distances(2048), 4, seed=0)
    assert all(np.array_equal(a.ids, b.ids) for a, b in zip(probes, again))
    assert probe_set(docs, [5000], 2, seed=0) == []  # a distance that does not fit is left out
