"""The passkey retrieval probe: a line that can only be predicted by copying from far back.

A **key line** is ``\\n<identifier> = "<value>"\\n`` with a random identifier (``[a-z]{3,8}_[a-z]{3,8}``) and a
random value of hex digits. Its value is unpredictable the first time; the second time the line appears, the
value is a copy. The probe places the line once early in a held-out document and again near its end, at a
given distance, and scores the bytes of the repeated value. (The copy content of training windows is
:mod:`.training_copies`: the retrieval tasks of :mod:`.retrieval` in their training formats, of which this line is
``single_needle``'s ``assign``.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._checks import check_int

HEX = b"0123456789abcdef"
LETTERS = b"abcdefghijklmnopqrstuvwxyz"


def _word(rng: np.random.Generator, low: int = 3, high: int = 8) -> bytes:
    return bytes(rng.choice(np.frombuffer(LETTERS, np.uint8), int(rng.integers(low, high + 1))))


def key_line(rng: np.random.Generator, value_len: int, alphabet: bytes = HEX) -> tuple[bytes, int]:
    """A random key line ``\\n<identifier> = "<value>"\\n`` and where its value starts in it."""
    ident = _word(rng) + b"_" + _word(rng)
    value = bytes(rng.choice(np.frombuffer(alphabet, np.uint8), value_len))
    head = b"\n" + ident + b' = "'
    return head + value + b'"\n', len(head)


@dataclass(frozen=True)
class Passkey:
    """A probe document: ``ids`` (``uint8 [length]``), the positions of the repeated value's bytes
    (``targets``, ``int64 [value_len]``: predicted from the logits one position earlier) and the distance in
    bytes between the two copies of the value."""

    ids: np.ndarray
    targets: np.ndarray
    distance: int

    @property
    def lookups(self) -> np.ndarray:
        """``int64``: the answer bytes (indices into ``targets``) that start a value, which the model must find
        by its key rather than continue from the byte before: the first byte of each alphanumeric run of the
        answer (the value's first byte here; each value's in ``multi_value``). The others are copies."""
        answer = self.ids[self.targets]
        word = np.isin(answer, np.frombuffer(b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_",
                                             np.uint8))
        starts = word & ~np.concatenate([[False], word[:-1]])
        return np.flatnonzero(starts if starts.any() else np.arange(len(answer)) == 0).astype(np.int64)


def passkey_document(document: np.ndarray, distance: int, rng: np.random.Generator, value_len: int = 16,
                     tail: int = 32) -> Passkey:
    """``document`` (``uint8 [L]``) with a key line inserted so that its second copy ends ``tail`` bytes before
    the end and the first copy starts ``distance`` bytes earlier; the document's own bytes fill the rest, cut to
    ``L``.

    Raises:
        ValueError: the two lines and the tail do not fit into ``L`` at that distance, or a size is not positive.
    """
    length = len(document)
    distance, value_len, tail = check_int("distance", distance, 1), check_int("value_len", value_len, 1), \
        check_int("tail", tail, 0)
    line, at = key_line(rng, value_len)
    second = length - tail - len(line)
    first = second - distance
    if first < 0 or distance < len(line):
        raise ValueError(f"distance {distance} does not fit a {length}-byte document with a {len(line)}-byte key "
                         f"line and a {tail}-byte tail (expected {len(line)} <= distance <= {second})")
    body = document.tobytes()
    gap = second - first - len(line)
    ids = body[:first] + line + body[first:first + gap] + line + body[first + gap:]
    ids = np.frombuffer(ids[:length], dtype=np.uint8).copy()
    return Passkey(ids, np.arange(second + at, second + at + value_len, dtype=np.int64), distance)

