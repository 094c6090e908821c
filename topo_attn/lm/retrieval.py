"""A retrieval suite in the style of RULER: probes whose answer can only be read from a line far back, built into
real code.

Every probe is a :class:`RetrievalProbe`, the :class:`~topo_attn.lm.probe.Passkey` of :mod:`.probe` with the
task, the format and where the needles and decoys were put: ``ids`` (``uint8 [length]``) is filler with lines
inserted, then a question and its answer at the very end; ``targets`` (``int64 [len(answer)]``, contiguous) are
the positions of the answer's bytes, so :func:`~topo_attn.lm.evaluate.passkey_scores` (teacher forcing) and
:func:`~topo_attn.lm.generation.generate_value` (the decode path, prompt ``ids[:targets[0]]``) score it as they
score the passkey.

Layout of a probe of ``length`` bytes::

    filler ... needle ... decoys and later needles ... filler  "\\n" question answer end "\\n"
                 ^--------------------- distance ---------------------^
                 first byte of the needle's value                      first byte of the answer

- ``distance`` is counted as in the passkey: from the first byte of the (first) needle's value to the first
  byte of the answer, which is how far back the model must reach to copy it (``ids[targets[0] - distance:]``
  starts with that value).
- Every inserted line is whole: it starts at a line start of the filler and ends with ``"\\n"``. The question
  starts a line of its own.
- The filler is one contiguous window of the ``filler`` argument, kept in order around the inserted lines.
- No leak: no key and no value of the probe occurs in the filler window, and none is a substring of another, so
  the answer's text occurs exactly where it was placed (window, keys and values are drawn again until it holds).

Tasks (:data:`TASKS`, each ``generator(filler, distance, length, seed, format, **options) -> RetrievalProbe``):

- ``single_needle``: one key-value line; ``decoys`` (default ``budget + 1``) lines of the same format with other
  keys and values, each in blocks of its own (at least ``block_size`` filler bytes between any two of them and
  the needle), so that a ``budget`` of blocks cannot hold them all. Question: the needle's key.
- ``plain_needle``: an ordinary assignment inside code (``timeout_seconds = 4817``, with a key of common code
  words and the indentation of the line it is put before) and ``decoys`` (default 4) more such assignments;
  asked for later (``assert timeout_seconds == ``).
- ``multi_key``: ``keys`` (default 16) key-value lines with distinct keys; the value of one of them.
- ``multi_value``: one key set ``values`` times (default 4; the first at the distance, the others between it
  and the question) among ``decoys`` (default 8) lines of other keys; the answer lists all its values in order.
- ``variable_tracking``: a chain ``a = 48213``, ``b = a``, ... of ``hops`` (default 4) links after the root line,
  in order between it and the question, and ``decoy_chains`` (default 1) chains of other variables and values
  anywhere; asked for the last variable's value.

Formats (:data:`FORMATS`, :class:`LineFormat`): per task, **training** formats (:func:`training_formats`, for
the copy lines a model is trained on) and **held-out** formats (:func:`held_out_formats`, for the evaluation
only); no held-out line syntax is the line syntax of a training format of any task. :func:`probe_set` builds a
whole probe set.

Errors: ``TypeError`` for an argument of the wrong kind, ``ValueError`` naming the argument for a bad value
(a distance that does not fit the length, an unknown format, too many lines for the length), and
:class:`FillerError` (a ``ValueError``) when the filler cannot host the probe (too short, no line start where
one is needed, or every window holds the probe's strings).
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral
from types import MappingProxyType

import numpy as np

from .._checks import check_int
from .probe import HEX, LETTERS, Passkey

NEWLINE = 10
ATTEMPTS = 64
"""Draws of window, keys and values per probe before giving up."""

CODE_WORDS = ("timeout", "seconds", "retries", "buffer", "size", "limit", "count", "offset", "width", "height",
              "depth", "interval", "delay", "port", "batch", "chunk", "window", "threshold", "capacity", "total",
              "initial", "step", "page", "block", "cache", "queue", "pool", "worker", "row", "column", "level",
              "scale", "factor", "margin", "padding", "backoff", "quota", "budget", "stride", "period")
"""Words of ``plain_needle``'s keys (two of them joined by ``_``): names an ordinary program would use."""


@dataclass(frozen=True)
class RetrievalProbe(Passkey):
    """A retrieval probe: a :class:`~topo_attn.lm.probe.Passkey` (``ids`` ``uint8 [length]``; ``targets``
    ``int64 [len(answer)]``, contiguous, followed only by the format's ``end`` and ``"\n"``; ``distance``) and

    Attributes:
        task: the name of its task in :data:`TASKS`.
        format: the name of its format in ``FORMATS[task]``.
        needles: ``int64 [n, 2]``: ``[start, end)`` of each line the answer is read from, in text order (the
            first is the one at the distance; ``multi_value``'s other settings of the key and
            ``variable_tracking``'s links follow).
        decoys: ``int64 [m, 2]``: ``[start, end)`` of each decoy line, in text order.
    """

    task: str
    format: str
    needles: np.ndarray
    decoys: np.ndarray

    @property
    def prompt(self) -> bytes:
        """The bytes before the answer (``ids[:targets[0]]``): what a model is given."""
        return self.ids[:int(self.targets[0])].tobytes()

    @property
    def answer(self) -> bytes:
        """The bytes to predict (``ids[targets]``)."""
        return self.ids[self.targets].tobytes()

    @property
    def lookups(self) -> np.ndarray:
        """``int64``: the answer bytes (indices into ``targets``) that start a value, found by its key: the first,
        and in ``multi_value`` each one right after the format's ``sep`` (so ``define``'s ``, 0x`` is copied,
        not looked up). The others are copies."""
        if self.task != "multi_value":
            return np.zeros(1, np.int64)
        sep, answer = FORMATS[self.task][self.format].sep.encode(), self.answer
        starts, at = [0], answer.find(sep)
        while at >= 0:
            starts.append(at + len(sep))
            at = answer.find(sep, at + len(sep))
        return np.asarray(starts, np.int64)


class FillerError(ValueError):
    """The ``filler`` argument cannot host the probe: too short, no line start where one is needed, or every
    window drawn holds one of the probe's keys or values."""


@dataclass(frozen=True)
class LineFormat:
    """The syntax of a task's lines (``str.format`` templates, without the final ``"\\n"``).

    Attributes:
        name: the format's name (unique within a task).
        held_out: ``True`` for an evaluation-only format, ``False`` for a training format.
        line: a key-value line, with ``{key}`` and ``{value}`` (the root line of a chain).
        ask: the question before the answer, with ``{key}``.
        end: what follows the answer on the question's line.
        many: ``multi_value``'s question, with ``{key}``; its answer is the values joined by ``sep``, followed
            by ``many_end``.
        sep: see ``many``.
        many_end: see ``many``.
        link: ``variable_tracking``'s link ``{key}`` assigned from ``{source}``.
        indent: lines take the indentation of the filler line they are put before (``plain_needle``).
    """

    name: str
    held_out: bool
    line: str
    ask: str
    end: str = ""
    many: str = ""
    sep: str = ""
    many_end: str = ""
    link: str = ""
    indent: bool = False

    def render(self, key: str, value: str) -> tuple[bytes, int]:
        """The line for ``key`` and ``value`` (with its ``"\\n"``) and where the value starts in it."""
        head, tail = self.line.split("{value}")
        head = head.format(key=key)
        return (head + value + tail.format(key=key) + "\n").encode(), len(head)

    def render_link(self, key: str, source: str) -> bytes:
        """The chain link ``key`` assigned from ``source`` (with its ``"\\n"``)."""
        return (self.link.format(key=key, source=source) + "\n").encode()


KEY_VALUE_FORMATS = (
    LineFormat("assign", False, '{key} = "{value}"', '{key} = "', '"', '{key} in ("', '", "', '")'),
    LineFormat("set", False, "set {key} {value}", "set {key} ", "", "get {key} ", " ", ""),
    LineFormat("call", False, 'cfg.put("{key}", "{value}")', 'cfg.put("{key}", "', '")',
               'cfg.get_all("{key}") == ["', '", "', '"]'),
    LineFormat("yaml", False, "{key}: {value}", "{key}: ", "", "{key}: [", ", ", "]"),
    LineFormat("json", False, '"{key}": "{value}",', '"{key}": "', '",', '"{key}": ["', '", "', '"]'),
    LineFormat("toml", False, "{key} = '{value}'", "{key} = '", "'", "{key} = ['", "', '", "']"),
    LineFormat("define", False, "#define {key} 0x{value}", "#define {key} 0x", "", "{key}_all = [0x", ", 0x", "]"),
    LineFormat("env", False, "export {key}={value}", "export {key}=", "", "{key}_list=(", " ", ")"),
    LineFormat("dict", True, 'config["{key}"]: {value}', 'config["{key}"]: ', "", 'config["{key}"]: [', ", ", "]"),
    LineFormat("arrow", True, "# {key} -> {value}", "# {key} -> ", "", "# {key} => ", " | ", ""),
)
"""``single_needle``, ``multi_key`` and ``multi_value``: ``assign`` is the passkey's key line
(:func:`~topo_attn.lm.probe.key_line`)."""

PLAIN_FORMATS = (
    LineFormat("assign", False, "{key} = {value}", "assert {key} == ", indent=True),
    LineFormat("kwarg", False, "{key}={value},", "check({key}=", ")", indent=True),
    LineFormat("setattr", False, 'setattr(obj, "{key}", {value})', 'assert getattr(obj, "{key}") == ', indent=True),
    LineFormat("dict_item", False, '"{key}": {value},', 'assert table["{key}"] == ', indent=True),
    LineFormat("checked", False, "{key} = int({value})", "check_equal({key}, ", ")", indent=True),
    LineFormat("attribute", True, "self.{key} = {value}", "assert self.{key} == ", indent=True),
    LineFormat("annotated", True, "{key}: int = {value}", "print({key})  # ", indent=True),
)
"""``plain_needle``."""

CHAIN_FORMATS = (
    LineFormat("python", False, "{key} = {value}", "assert {key} == ", link="{key} = {source}"),
    LineFormat("shell", False, "{key}={value}", "test ${key} -eq ", link="{key}=${source}"),
    LineFormat("c", False, "int {key} = {value};", "assert({key} == ", ");", link="int {key} = {source};"),
    LineFormat("lua", False, "local {key} = {value}", "print({key}) -- ", link="local {key} = {source}"),
    LineFormat("perl", False, "my ${key} = {value};", "print ${key}; # ", link="my ${key} = ${source};"),
    LineFormat("js", True, "let {key} = {value};", "console.assert({key} === ", ");", link="let {key} = {source};"),
    LineFormat("go", True, "{key} := {value}", "fmt.Println({key})  // ", link="{key} := {source}"),
)
"""``variable_tracking``."""


def _by_name(formats: tuple[LineFormat, ...]) -> Mapping[str, LineFormat]:
    return MappingProxyType({f.name: f for f in formats})


FORMATS: Mapping[str, Mapping[str, LineFormat]] = MappingProxyType({
    "single_needle": _by_name(KEY_VALUE_FORMATS), "plain_needle": _by_name(PLAIN_FORMATS),
    "multi_key": _by_name(KEY_VALUE_FORMATS), "multi_value": _by_name(KEY_VALUE_FORMATS),
    "variable_tracking": _by_name(CHAIN_FORMATS)})
"""Per task, its formats by name."""


def training_formats(task: str) -> tuple[str, ...]:
    """The names of ``task``'s training formats (for the copy lines a model is trained on)."""
    return tuple(name for name, f in _formats_of(task).items() if not f.held_out)


def held_out_formats(task: str) -> tuple[str, ...]:
    """The names of ``task``'s held-out formats (evaluation only; never in training)."""
    return tuple(name for name, f in _formats_of(task).items() if f.held_out)


def _formats_of(task: str) -> Mapping[str, LineFormat]:
    if not isinstance(task, str):
        raise TypeError(f"task must be a str, got {type(task).__name__}")
    if task not in FORMATS:
        raise ValueError(f"task must be one of {sorted(FORMATS)}, got {task!r}")
    return FORMATS[task]


# ----------------------------------------------------------------------------------------------------- checks


def _filler_bytes(filler: object) -> bytes:
    if isinstance(filler, (bytes, bytearray, memoryview)):
        data = bytes(filler)
    elif isinstance(filler, np.ndarray):
        if filler.dtype != np.uint8:
            raise TypeError(f"filler must be uint8 bytes, got dtype {filler.dtype}")
        if filler.ndim != 1:
            raise ValueError(f"filler must be one-dimensional, got shape {filler.shape}")
        data = filler.tobytes()
    else:
        raise TypeError(f"filler must be bytes or a uint8 numpy array, got {type(filler).__name__}")
    if not data:
        raise FillerError("filler is empty")
    return data


def _rng(seed: object) -> np.random.Generator:
    if isinstance(seed, bool) or not isinstance(seed, (Integral, np.random.Generator, np.random.SeedSequence)):
        raise TypeError(f"seed must be an int or a numpy.random.Generator, got {type(seed).__name__}")
    return np.random.default_rng(seed)


def _format(task: str, name: object) -> LineFormat:
    formats = FORMATS[task]
    if name is None:
        return formats[training_formats(task)[0]]
    if not isinstance(name, str):
        raise TypeError(f"format must be a str, got {type(name).__name__}")
    if name not in formats:
        raise ValueError(f"format must be one of {list(formats)} for {task}, got {name!r}")
    return formats[name]


def _check_sizes(distance: object, length: object) -> tuple[int, int]:
    distance, length = check_int("distance", distance, 1), check_int("length", length, 2)
    if distance >= length:
        raise ValueError(f"distance must be less than length ({length}), got {distance}")
    return distance, length


# ----------------------------------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class _Plan:
    """One draw of a probe's lines: the needle (with where its value starts), the lines that must follow it in
    order, groups of decoy lines (each in order) placed anywhere before the question, the question, the answer,
    what ends the answer's line, the keys and values that must not occur elsewhere, and the least number of
    filler bytes between any two of the needle and the decoys."""

    needle: bytes
    value_at: int
    after: tuple[bytes, ...]
    free: tuple[tuple[bytes, ...], ...]
    question: bytes
    answer: bytes
    end: bytes
    protected: tuple[bytes, ...]
    spacing: int = 0


def _nested(strings: Sequence[bytes]) -> bool:
    """Whether one of ``strings`` occurs in another (or twice)."""
    return len(set(strings)) < len(strings) or any(a in b for a in strings for b in strings if a is not b)


def _line_starts(data: bytes) -> np.ndarray:
    """``int64``: 0 and every position after a ``"\\n"`` (below ``len(data)``)."""
    arr = np.frombuffer(data, dtype=np.uint8)
    starts = np.flatnonzero(arr[:-1] == NEWLINE) + 1
    return np.concatenate([[0], starts]).astype(np.int64)


def _indentation(data: bytes, start: int) -> bytes | None:
    """The leading spaces and tabs of the line at ``start``, ``None`` for a blank line."""
    end = data.find(b"\n", start)
    line = data[start:] if end < 0 else data[start:end]
    body = line.lstrip(b" \t")
    return None if not body.strip() else line[:len(line) - len(body)]


def _pick(candidates: np.ndarray, n: int, spacing: int, rng: np.random.Generator) -> np.ndarray | None:
    """``n`` sorted positions of ``candidates``, pairwise at least ``spacing`` apart (repeats allowed when
    ``spacing == 0``); ``None`` when a random greedy draw finds no such set."""
    if n == 0:
        return np.zeros(0, np.int64)
    if len(candidates) == 0:
        return None
    if spacing == 0:
        return np.sort(rng.choice(candidates, n))
    chosen: list[int] = []
    for c in rng.permutation(candidates).tolist():
        i = bisect.bisect(chosen, c)
        if (i == 0 or c - chosen[i - 1] >= spacing) and (i == len(chosen) or chosen[i] - c >= spacing):
            chosen.insert(i, c)
            if len(chosen) == n:
                return np.asarray(chosen, np.int64)
    return None


def _place(make: Callable[[np.random.Generator], _Plan], filler: bytes, distance: int, length: int,
           rng: np.random.Generator, task: str, fmt: LineFormat) -> RetrievalProbe:
    """Draw plans and windows until one fits (see the module's layout) and assemble the probe."""
    starts = _line_starts(filler)
    indents = [_indentation(filler, int(s)) for s in starts] if fmt.indent else None
    usable = [i for i in indents if i is not None] if indents is not None else [b""]
    if not usable:
        raise FillerError("filler has no non-blank line to take an indentation from")
    literal = "\n".join([fmt.line, fmt.ask, fmt.end, fmt.many, fmt.sep, fmt.many_end, fmt.link]).encode()
    failure: tuple[type[ValueError], str] = (ValueError, "")
    for _ in range(ATTEMPTS):
        plan = make(rng)
        if _nested(plan.protected) or any(s in literal for s in plan.protected):
            continue
        indent = usable[int(rng.integers(len(usable)))]  # (b"" unless the format indents)
        needle, value_at = indent + plan.needle, len(indent) + plan.value_at
        after = [indent + t for t in plan.after]
        free = [(g, indent + t) for g, group in enumerate(plan.free) for t in group]
        answer_start = length - len(plan.answer) - len(plan.end) - 1
        prompt_end = answer_start - len(plan.question) - 1  # where the tail "\n" question answer end "\n" starts
        needle_start = answer_start - distance - value_at
        after_bytes = sum(map(len, after))
        if needle_start < 0 or needle_start + len(needle) + after_bytes > prompt_end:
            high = answer_start - value_at
            low = answer_start - (prompt_end - len(needle) - after_bytes) - value_at
            failure = (ValueError, f"distance {distance} does not fit a {length}-byte {task} probe: with these "
                                   f"lines it must lie in [{low}, {high}]")
            continue
        # which decoys go before the needle: in proportion to the room; a group keeps its order
        u = rng.random(len(free))
        for g in range(len(plan.free)):
            members = [i for i, (h, _) in enumerate(free) if h == g]
            u[members] = np.sort(u[members])
        before = u < needle_start / max(1, prompt_end - len(needle))
        bytes_before = sum(len(t) for (_, t), b in zip(free, before) if b)
        cut = needle_start - bytes_before  # the needle's position among the filler's bytes
        size = prompt_end - len(needle) - after_bytes - sum(len(t) for _, t in free)  # filler bytes
        if cut < 0 or size < cut:
            failure = (ValueError, f"length {length} is too short for the {len(free)} decoy lines of this "
                                   f"{task} probe at distance {distance}")
            continue
        if size > len(filler):
            failure = (FillerError, f"filler has {len(filler)} bytes; this probe needs {size}")
            continue
        # the needle at a line start of the filler (with the drawn indentation)
        ok = (starts >= cut) & (starts <= len(filler) - size + cut)
        same = None if indents is None else np.array([i == indent for i in indents], dtype=bool)
        if same is not None:
            ok &= same
        if not ok.any():
            failure = (FillerError, "filler has no line start where the needle must go")
            continue
        w = int(rng.choice(starts[ok])) - cut
        window = filler[w:w + size]
        if any(s in window for s in plan.protected):
            failure = (FillerError, "filler holds the probe's keys or values in every window drawn")
            continue
        inside = (starts >= w) & (starts < w + size)
        if same is not None:
            inside &= same
        inner = starts[inside] - w  # line starts of the window where a line may go (of the same indentation)
        if same is None and (inner.size == 0 or inner[0] != 0):
            inner = np.concatenate([[0], inner])
        s = plan.spacing
        n_before = int(before.sum())
        cuts_before = _pick(inner[inner <= cut - s], n_before, s, rng)
        cuts_free_after = _pick(inner[(inner >= cut + s) & (inner < size)], len(free) - n_before, s, rng)
        after_candidates = np.unique(np.concatenate([[cut], inner[(inner > cut) & (inner < size)]]))
        cuts_after = _pick(after_candidates, len(after), 0, rng)
        if cuts_before is None or cuts_free_after is None or cuts_after is None:
            failure = (ValueError, f"length {length} is too short to place the {len(free)} decoy lines of this "
                                   f"{task} probe {s} filler bytes apart")
            continue
        order_before = sorted(np.flatnonzero(before), key=lambda i: u[i])
        order_after = sorted(np.flatnonzero(~before), key=lambda i: u[i])
        inserts = [(int(c), 0, j, free[i][1], "decoy") for j, (c, i) in enumerate(zip(cuts_before, order_before))]
        inserts.append((cut, 1, 0, needle, "needle"))
        inserts += [(int(c), 2, j, t, "needle") for j, (c, t) in enumerate(zip(cuts_after, after))]
        inserts += [(int(c), 2, j, free[i][1], "decoy")
                    for j, (c, i) in enumerate(zip(cuts_free_after, order_after))]
        inserts.sort(key=lambda item: item[:3])
        pieces, spans, cursor, position = [], {"needle": [], "decoy": []}, 0, 0
        for c, _, _, text, role in inserts:
            pieces.append(window[cursor:c])
            position += c - cursor
            cursor = c
            spans[role].append((position, position + len(text)))
            pieces.append(text)
            position += len(text)
        pieces += [window[cursor:], b"\n", plan.question, plan.answer, plan.end, b"\n"]
        ids = np.frombuffer(b"".join(pieces), dtype=np.uint8).copy()
        assert len(ids) == length and spans["needle"][0][0] == needle_start, "layout arithmetic"
        return RetrievalProbe(ids, np.arange(answer_start, answer_start + len(plan.answer), dtype=np.int64),
                              distance, task, fmt.name, np.asarray(spans["needle"], np.int64).reshape(-1, 2),
                              np.asarray(spans["decoy"], np.int64).reshape(-1, 2))
    kind, message = failure
    raise kind(message or f"could not draw {task} keys and values that are distinct")


# ----------------------------------------------------------------------------------------------------- draws


def _word(rng: np.random.Generator, low: int = 3, high: int = 8) -> str:
    return bytes(rng.choice(np.frombuffer(LETTERS, np.uint8), int(rng.integers(low, high + 1)))).decode()


def _identifiers(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` random identifiers ``[a-z]{3,8}_[a-z]{3,8}`` (the passkey's keys)."""
    return [_word(rng) + "_" + _word(rng) for _ in range(n)]


def _code_names(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` names of two distinct :data:`CODE_WORDS`."""
    pairs = [rng.choice(len(CODE_WORDS), 2, replace=False) for _ in range(n)]
    return [f"{CODE_WORDS[a]}_{CODE_WORDS[b]}" for a, b in pairs]


def _hex(rng: np.random.Generator, n: int, value_len: int) -> list[str]:
    return [bytes(rng.choice(np.frombuffer(HEX, np.uint8), value_len)).decode() for _ in range(n)]


def _numbers(rng: np.random.Generator, n: int, low: int, high: int) -> list[str]:
    return [str(v) for v in rng.integers(low, high, n)]


def _protected(*groups: Sequence[str]) -> tuple[bytes, ...]:
    return tuple(s.encode() for group in groups for s in group)


# ----------------------------------------------------------------------------------------------------- tasks


def single_needle(filler: bytes | np.ndarray, distance: int, length: int, seed: int | np.random.Generator,
                  format: str | None = None, *, budget: int = 32, block_size: int = 64, decoys: int | None = None,
                  value_len: int = 8) -> RetrievalProbe:
    """One key-value line and more decoy lines than ``budget`` blocks of ``block_size`` bytes could hold.

    Parameters
    ----------
    filler : bytes or numpy.ndarray
        ``uint8 [F]``: text (real documents) to build the probe into, one window of it kept in order.
    distance : int
        Bytes from the first byte of the needle's value to the first byte of the answer, ``< length``.
    length : int
        ``len(ids)``.
    seed : int or numpy.random.Generator
        Seeds everything drawn: window, positions, keys, values.
    format : str, optional
        A name of ``FORMATS["single_needle"]``; default the first training format (``"assign"``).
    budget, block_size : int
        The decoys lie in distinct blocks of ``block_size`` bytes (at least ``block_size`` filler bytes between
        any two of them and the needle), none shared with the needle's.
    decoys : int, optional
        Decoy lines (keys ``[a-z]{3,8}_[a-z]{3,8}``, values of ``value_len`` hex digits), ``> budget``; default
        ``budget + 1``. Spread over the whole prompt, before and after the needle.
    value_len : int
        Hex digits of each value.

    Returns
    -------
    RetrievalProbe
        ``ids`` ``uint8 [length]``; answer: the needle's value.

    Raises
    ------
    TypeError
        An argument of the wrong kind.
    ValueError
        ``decoys <= budget``, a size below 1, an unknown format, a distance or decoy count that does not fit.
    FillerError
        The filler cannot host the probe.
    """
    fmt, data, distance, length, rng = _common("single_needle", filler, distance, length, seed, format)
    budget, block_size = check_int("budget", budget, 0), check_int("block_size", block_size, 1)
    value_len = check_int("value_len", value_len, 1)
    decoys = budget + 1 if decoys is None else check_int("decoys", decoys, 1)
    if decoys <= budget:
        raise ValueError(f"decoys must exceed budget ({budget}) so that the budget cannot hold them, got {decoys}")

    def make(rng: np.random.Generator) -> _Plan:
        keys, values = _identifiers(rng, decoys + 1), _hex(rng, decoys + 1, value_len)
        needle, at = fmt.render(keys[0], values[0])
        return _Plan(needle, at, (), tuple((fmt.render(k, v)[0],) for k, v in zip(keys[1:], values[1:])),
                     fmt.ask.format(key=keys[0]).encode(), values[0].encode(), fmt.end.encode(),
                     _protected(keys, values), spacing=block_size)

    return _place(make, data, distance, length, rng, "single_needle", fmt)


def _first_key_plan(fmt, keys, values) -> _Plan:
    """The plan of a probe that asks for ``keys[0]``'s value: its line is the needle, the lines of the other
    keys are decoys."""
    needle, at = fmt.render(keys[0], values[0])
    return _Plan(needle, at, (), tuple((fmt.render(k, v)[0],) for k, v in zip(keys[1:], values[1:])),
                 fmt.ask.format(key=keys[0]).encode(), values[0].encode(), fmt.end.encode(), _protected(keys, values))


def plain_needle(filler: bytes | np.ndarray, distance: int, length: int, seed: int | np.random.Generator,
                 format: str | None = None, *, decoys: int = 4) -> RetrievalProbe:
    """An ordinary assignment inside code, asked for later: not an outlier among the lines around it.

    The needle and ``decoys`` more assignments have keys of two :data:`CODE_WORDS` (``timeout_seconds``),
    values of 4 or 5 decimal digits, and the indentation of the filler line each is put before (all of one
    indentation, drawn from the filler's lines). Parameters as :func:`single_needle` (``format``: a name of
    ``FORMATS["plain_needle"]``, default ``"assign"``); answer: the needle's value.

    Raises
    ------
    TypeError, ValueError, FillerError
        As :func:`single_needle` (``decoys`` below 0).
    """
    fmt, data, distance, length, rng = _common("plain_needle", filler, distance, length, seed, format)
    decoys = check_int("decoys", decoys, 0)

    def make(rng: np.random.Generator) -> _Plan:
        return _first_key_plan(fmt, _code_names(rng, decoys + 1), _numbers(rng, decoys + 1, 1000, 100000))

    return _place(make, data, distance, length, rng, "plain_needle", fmt)


def multi_key(filler: bytes | np.ndarray, distance: int, length: int, seed: int | np.random.Generator,
              format: str | None = None, *, keys: int = 16, value_len: int = 8) -> RetrievalProbe:
    """The value of one named key among ``keys`` key-value lines of distinct keys (the asked one at the
    distance, the others anywhere before the question). Parameters as :func:`single_needle` (``format``: a
    name of ``FORMATS["multi_key"]``); answer: the asked key's value.

    Raises
    ------
    TypeError, ValueError, FillerError
        As :func:`single_needle` (``keys`` below 2).
    """
    fmt, data, distance, length, rng = _common("multi_key", filler, distance, length, seed, format)
    keys, value_len = check_int("keys", keys, 2), check_int("value_len", value_len, 1)

    def make(rng: np.random.Generator) -> _Plan:
        return _first_key_plan(fmt, _identifiers(rng, keys), _hex(rng, keys, value_len))

    return _place(make, data, distance, length, rng, "multi_key", fmt)


def multi_value(filler: bytes | np.ndarray, distance: int, length: int, seed: int | np.random.Generator,
                format: str | None = None, *, values: int = 4, decoys: int = 8, value_len: int = 8) -> RetrievalProbe:
    """All values of one key set ``values`` times: the first setting at the distance, the others in order
    between it and the question, among ``decoys`` lines of other keys anywhere. The question is the format's
    ``many``; the answer is the values in text order joined by its ``sep`` (``many_end`` follows). Parameters
    as :func:`single_needle` (``format``: a name of ``FORMATS["multi_value"]``).

    Raises
    ------
    TypeError, ValueError, FillerError
        As :func:`single_needle` (``values`` below 2, ``decoys`` below 0).
    """
    fmt, data, distance, length, rng = _common("multi_value", filler, distance, length, seed, format)
    values, decoys = check_int("values", values, 2), check_int("decoys", decoys, 0)
    value_len = check_int("value_len", value_len, 1)

    def make(rng: np.random.Generator) -> _Plan:
        names, drawn = _identifiers(rng, decoys + 1), _hex(rng, values + decoys, value_len)
        own, other = drawn[:values], drawn[values:]
        needle, at = fmt.render(names[0], own[0])
        return _Plan(needle, at, tuple(fmt.render(names[0], v)[0] for v in own[1:]),
                     tuple((fmt.render(k, v)[0],) for k, v in zip(names[1:], other)),
                     fmt.many.format(key=names[0]).encode(), fmt.sep.join(own).encode(), fmt.many_end.encode(),
                     _protected(names, drawn))

    return _place(make, data, distance, length, rng, "multi_value", fmt)


def variable_tracking(filler: bytes | np.ndarray, distance: int, length: int, seed: int | np.random.Generator,
                      format: str | None = None, *, hops: int = 4, decoy_chains: int = 1) -> RetrievalProbe:
    """A chain of assignments: the root line (a 5-digit value) at the distance, then ``hops`` links, each
    variable assigned from the previous one, in order before the question; ``decoy_chains`` chains of the same
    shape (other variables and values) anywhere, each in its order. Variables: ``[a-z]{3,8}_[a-z]{3,8}``.
    Parameters as :func:`single_needle` (``format``: a name of ``FORMATS["variable_tracking"]``, default
    ``"python"``); answer: the root's value, asked for through the last variable.

    Raises
    ------
    TypeError, ValueError, FillerError
        As :func:`single_needle` (``hops`` below 1, ``decoy_chains`` below 0).
    """
    fmt, data, distance, length, rng = _common("variable_tracking", filler, distance, length, seed, format)
    hops, decoy_chains = check_int("hops", hops, 1), check_int("decoy_chains", decoy_chains, 0)

    def chain(names: list[str], value: str) -> tuple[bytes, ...]:
        return (fmt.render(names[0], value)[0],) + tuple(
            fmt.render_link(b, a) for a, b in zip(names[:-1], names[1:]))

    def make(rng: np.random.Generator) -> _Plan:
        names = _identifiers(rng, (hops + 1) * (decoy_chains + 1))
        roots = _numbers(rng, decoy_chains + 1, 10000, 100000)
        chains = [names[i * (hops + 1):(i + 1) * (hops + 1)] for i in range(decoy_chains + 1)]
        lines = chain(chains[0], roots[0])
        at = fmt.render(chains[0][0], roots[0])[1]
        return _Plan(lines[0], at, lines[1:], tuple(chain(c, r) for c, r in zip(chains[1:], roots[1:])),
                     fmt.ask.format(key=chains[0][-1]).encode(), roots[0].encode(), fmt.end.encode(),
                     _protected(names, roots))

    return _place(make, data, distance, length, rng, "variable_tracking", fmt)


def _common(task: str, filler: object, distance: object, length: object, seed: object,
            format: object) -> tuple[LineFormat, bytes, int, int, np.random.Generator]:
    fmt = _format(task, format)
    distance, length = _check_sizes(distance, length)
    return fmt, _filler_bytes(filler), distance, length, _rng(seed)


TASKS: Mapping[str, Callable[..., RetrievalProbe]] = MappingProxyType({
    "single_needle": single_needle, "plain_needle": plain_needle, "multi_key": multi_key,
    "multi_value": multi_value, "variable_tracking": variable_tracking})
"""The generators by task name: ``TASKS[task](filler, distance, length, seed, format, **options)``."""


def probe_set(task: str, filler: bytes | np.ndarray | Sequence[bytes], distances: Sequence[int],
              per_distance: int, formats: Sequence[str] | None = None, seed: int = 0, length: int | None = None,
              **options) -> list[RetrievalProbe]:
    """A whole probe set of ``task``: ``per_distance`` probes per distance, in order of ``distances``.

    Parameters
    ----------
    task : str
        A name of :data:`TASKS`.
    filler : bytes, numpy.ndarray or sequence of bytes
        One stream (``uint8 [F]``) or documents (``uint8 [N, L]``, or a sequence of byte strings): probe ``i``
        at distance ``d`` uses document ``(d + i) % N``, or the next ones if that one cannot host it.
    distances : sequence of int
        As :func:`single_needle`'s ``distance``.
    per_distance : int
        Probes per distance; probe ``i`` of a distance uses ``formats[i % len(formats)]``.
    formats : sequence of str, optional
        Format names of ``task``; default all its training formats (:func:`training_formats`). Pass
        :func:`held_out_formats` for an evaluation.
    seed : int
        Probe ``i`` at distance ``d`` is seeded by ``(seed, crc32(task), d, i)``: it does not depend on the
        other distances asked for.
    length : int, optional
        ``len(ids)``; default the documents' length ``L`` (required for one stream).
    **options
        Passed to the task's generator (``budget``, ``decoys``, ``hops``, ...).

    Returns
    -------
    list of RetrievalProbe

    Raises
    ------
    TypeError, ValueError, FillerError
        As the generator; ``ValueError`` for an empty ``distances``, ``per_distance < 1`` or an unknown format.
    """
    _formats_of(task)
    generator = TASKS[task]
    per_distance = check_int("per_distance", per_distance, 1)
    seed = check_int("seed", seed, 0)
    if isinstance(distances, (str, bytes)) or not isinstance(distances, Sequence) or not distances:
        raise ValueError(f"distances must be a non-empty sequence of ints, got {distances!r}")
    formats = training_formats(task) if formats is None else tuple(formats)
    if not formats or isinstance(formats, str):
        raise ValueError(f"formats must be a non-empty sequence of format names, got {formats!r}")
    for name in formats:
        _format(task, name)
    if isinstance(filler, np.ndarray) and filler.ndim == 2:
        documents = [row.tobytes() for row in filler]
    elif isinstance(filler, Sequence) and not isinstance(filler, (bytes, bytearray)):
        documents = [_filler_bytes(d) for d in filler]
    else:
        documents = [_filler_bytes(filler)]
    if not documents:
        raise ValueError("filler holds no documents")
    if length is None:
        if isinstance(filler, np.ndarray) and filler.ndim == 2:
            length = filler.shape[1]
        else:
            raise ValueError("length is required unless filler is a [N, L] array of documents")
    probes = []
    for distance in distances:
        distance = check_int("distance", distance, 1)
        for i in range(per_distance):
            fmt = formats[i % len(formats)]
            error: FillerError | None = None
            for tried in range(len(documents)):
                rng = np.random.default_rng([seed, zlib.crc32(task.encode()), distance, i])
                try:
                    probes.append(generator(documents[(distance + i + tried) % len(documents)], distance, length,
                                            rng, fmt, **options))
                    break
                except FillerError as e:
                    error = e
            else:
                raise FillerError(f"no document of filler can host {task} probe {i} at distance {distance}: {error}")
    return probes

