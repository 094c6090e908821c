"""Copy content for training windows: the retrieval tasks of :mod:`.retrieval`, in their **training** formats
only, built into real training text so that the model learns to copy and retrieve across distance.

A window with copy content (:func:`copy_window`) is cut into 1 to ``copies`` consecutive segments of at least
:data:`MIN_SEGMENT` bytes (fewer when the window is short). Each segment is one probe of
:data:`~topo_attn.lm.retrieval.TASKS` (``single_needle``, ``plain_needle``, ``multi_key``, ``multi_value``,
``variable_tracking``), drawn uniformly or by the weights given (:func:`task_weights`), in one of the task's
training formats (:func:`~topo_attn.lm.retrieval.training_formats`, drawn uniformly; a held-out format is never
used), with the task's counts drawn by :func:`training_options` and a distance drawn uniformly from ``[MIN_DISTANCE,
len(segment) - MIN_DISTANCE]``, built by the task's own generator into the segment's part of the filler: key-value
lines, multi-key blocks, repeated keys and assignment chains, then the question and its answer at the segment's
end, the answer's bytes a copy of a value ``distance`` bytes earlier (``multi_value``: its first value). A draw
that does not fit the segment (a ``ValueError`` of the generator: distance, lines or filler) is drawn again, at
most :data:`DRAWS` times; a segment whose draws all fail stays plain filler (reported: it is not in
``CopyWindow.probes``). Everything is drawn from the ``rng`` given, so a seeded generator gives the same window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._checks import check_int
from .retrieval import TASKS, RetrievalProbe, training_formats

MIN_SEGMENT = 256
"""The shortest segment a window is cut into when it holds more than one (a window shorter than this is one
segment)."""

MIN_DISTANCE = 16
"""The shortest distance drawn, and the least room left after it in the segment."""

DRAWS = 8
"""Draws of task, format, counts and distance per segment before it is left plain."""

BYTES_PER_LINE = 256
"""Room per inserted line: a segment of ``L`` bytes gets at most ``max(1, L // BYTES_PER_LINE)`` lines of each
kind that :func:`training_options` counts."""


@dataclass(frozen=True)
class CopyWindow:
    """A training window with copy content.

    Attributes:
        ids: ``uint8 [length]``: the segments, in order.
        probes: the probe of each segment that holds one (its ``ids``, ``targets``, ``needles`` and ``decoys`` in
            the segment's own coordinates), in order.
        offsets: ``int64 [len(probes)]``: where each probe's segment starts in ``ids`` (so its answer is
            ``ids[offset + probe.targets]``).
    """

    ids: np.ndarray
    probes: tuple[RetrievalProbe, ...]
    offsets: np.ndarray

    @property
    def lookup_positions(self) -> np.ndarray:
        """``int64``: the positions in ``ids`` of every probe's lookup bytes (the answer bytes that start a value,
        which the model must find by its key: :attr:`~topo_attn.lm.probe.Passkey.lookups`), in order."""
        parts = [offset + probe.targets[probe.lookups] for probe, offset in zip(self.probes, self.offsets.tolist())]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


def training_options(task: str, length: int, rng: np.random.Generator) -> dict:
    """The counts of one training probe of ``task`` in a segment of ``length`` bytes, drawn uniformly up to the
    evaluation's defaults (:mod:`.retrieval`) and at most ``max(1, length // BYTES_PER_LINE)`` lines:
    ``single_needle`` 1 to 32 decoys with ``budget = decoys - 1`` and blocks of up to 64 bytes between them,
    ``plain_needle`` 0 to 4 decoys, ``multi_key`` 2 to 16 keys, ``multi_value`` 2 to 4 values and 0 to 8 decoys,
    ``variable_tracking`` 1 to 4 hops and 0 or 1 decoy chain; hex values of 4 to 12 digits where the task takes
    ``value_len``. Raises ``ValueError`` for a task outside :data:`~topo_attn.lm.retrieval.TASKS`."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {list(TASKS)}, got {task!r}")
    lines = max(1, check_int("length", length, 1) // BYTES_PER_LINE)

    def upto(low: int, high: int) -> int:
        return int(rng.integers(low, max(low, min(high, lines)) + 1))

    if task == "single_needle":
        decoys = upto(1, 32)
        return dict(decoys=decoys, budget=decoys - 1, block_size=max(1, min(64, length // (4 * (decoys + 1)))),
                    value_len=int(rng.integers(4, 13)))
    if task == "plain_needle":
        return dict(decoys=upto(0, 4))
    if task == "multi_key":
        return dict(keys=upto(2, 16), value_len=int(rng.integers(4, 13)))
    if task == "multi_value":
        return dict(values=upto(2, 4), decoys=upto(0, 8), value_len=int(rng.integers(4, 13)))
    return dict(hops=upto(1, 4), decoy_chains=int(rng.integers(0, 2)))


def task_weights(spec: str | None, name: str = "weights") -> np.ndarray | None:
    """The probabilities of the tasks of :data:`~topo_attn.lm.retrieval.TASKS` (in its order) that ``spec``
    asks for: ``"TASK=WEIGHT,TASK=WEIGHT"``, a finite weight >= 0 per named task, 1 for each task it does not
    name (``"multi_value=3"``: ``multi_value`` three times as often as each other task); None for None (every
    task equally often). Raises ``TypeError`` / ``ValueError`` naming ``name`` for a ``spec`` that is not a
    string of that form, names a task twice or one outside ``TASKS``, or leaves every weight 0."""
    if spec is None:
        return None
    form = f"TASK=WEIGHT pairs joined by commas, TASK one of {', '.join(TASKS)}, WEIGHT a finite number >= 0"
    if not isinstance(spec, str):
        raise TypeError(f"{name} must be a string of {form}, got {type(spec).__name__}")
    weights = dict.fromkeys(TASKS, 1.0)
    named = set()
    for pair in spec.split(","):
        task, sep, value = (part.strip() for part in pair.partition("="))
        try:
            weight = float(value)
        except ValueError:
            weight = math.nan
        if not sep or task not in TASKS or task in named or not 0 <= weight < math.inf:
            raise ValueError(f"{name} must be {form}, got {spec!r}")
        weights[task] = weight
        named.add(task)
    total = sum(weights.values())
    if total == 0:
        raise ValueError(f"{name} must leave some task a weight above 0, got {spec!r}")
    return np.array([weights[task] / total for task in TASKS])


def segment_lengths(length: int, copies: int, rng: np.random.Generator) -> np.ndarray:
    """``int64 [n]``: ``length`` cut into ``n = min(copies, max(1, length // MIN_SEGMENT))`` consecutive
    segments of at least ``MIN_SEGMENT`` bytes each (when ``n > 1``), the rest spread by uniform cuts."""
    n = min(copies, max(1, length // MIN_SEGMENT))
    if n == 1:
        return np.array([length], np.int64)
    spare = length - n * MIN_SEGMENT
    cuts = np.sort(rng.integers(0, spare + 1, n - 1))
    return np.diff(np.concatenate([[0], cuts, [spare]])).astype(np.int64) + MIN_SEGMENT


def copy_window(filler: np.ndarray, length: int, rng: np.random.Generator, copies: int = 1,
                weights: np.ndarray | None = None) -> CopyWindow:
    """A window of ``length`` bytes with copy content (see the module docstring) built into ``filler``.

    Parameters
    ----------
    filler : numpy.ndarray
        ``uint8 [F]``, ``F >= length`` (``2 * length`` leaves the generators room to pick their windows): the
        training text. Segment ``i`` (bytes ``[o, o + l)`` of the window) is built into
        ``filler[o * F // length:(o + l) * F // length]``, so segments never share filler bytes.
    length : int
        ``len(ids)``, at least 1.
    rng : numpy.random.Generator
        Draws everything (segments, tasks, formats, counts, distances, and what the generators draw).
    copies : int
        The most segments (probes) in the window, at least 1.
    weights : numpy.ndarray, optional
        The probability of each task of :data:`~topo_attn.lm.retrieval.TASKS`, in its order, as
        :func:`task_weights` returns them; None (the default) draws every task equally often.

    Returns
    -------
    CopyWindow

    Raises
    ------
    TypeError
        ``filler`` not a uint8 numpy array, or a count not an int.
    ValueError
        ``filler`` not one-dimensional or shorter than ``length``, or a count below 1.
    """
    if not isinstance(filler, np.ndarray) or filler.dtype != np.uint8:
        raise TypeError(f"filler must be a uint8 numpy array, got {getattr(filler, 'dtype', type(filler).__name__)}")
    length, copies = check_int("length", length, 1), check_int("copies", copies, 1)
    if filler.ndim != 1 or len(filler) < length:
        raise ValueError(f"filler must be one-dimensional with at least length={length} bytes, got shape "
                         f"{filler.shape}")
    tasks = list(TASKS)
    pieces, probes, offsets, offset = [], [], [], 0
    for size in segment_lengths(length, copies, rng).tolist():
        part = filler[offset * len(filler) // length:(offset + size) * len(filler) // length]
        probe = None
        for _ in range(DRAWS):
            task = tasks[int(rng.integers(len(tasks)) if weights is None else rng.choice(len(tasks), p=weights))]
            formats = training_formats(task)
            fmt = formats[int(rng.integers(len(formats)))]
            options = training_options(task, size, rng)
            distance = int(rng.integers(MIN_DISTANCE, max(MIN_DISTANCE, size - MIN_DISTANCE) + 1))
            try:
                probe = TASKS[task](part, distance, size, rng, fmt, **options)
                break
            except ValueError:  # does not fit this segment (FillerError included): draw again
                continue
        if probe is None:
            pieces.append(part[:size])
        else:
            pieces.append(probe.ids)
            probes.append(probe)
            offsets.append(offset)
        offset += size
    return CopyWindow(np.concatenate(pieces), tuple(probes), np.asarray(offsets, np.int64))
