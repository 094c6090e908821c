"""The byte-level training corpus: the Python sources this machine has (the standard library and the installed
packages), split into training and validation files by a hash of each file's path, validation deduplicated
against training, and the held-out evaluation set (``python -m topo_attn.lm corpus``).

A document is one file's bytes; its token ids are those bytes (vocabulary 256, no special tokens), so any text
encodes as ``list(text.encode())``. A file's **name** is its path relative to its root, prefixed with the
root's kind (``stdlib/json/decoder.py``, ``site-packages/numpy/linalg/_linalg.py``): the split depends on the
name only, so the same file lands on the same side on every machine and in every environment.

- **Deduplication** (:func:`split_corpus`): a validation file whose bytes (sha256) or whose
  :func:`normalized_path` (the name without its root kind, site-packages roots, ``build/lib`` and vendoring
  folders such as ``_vendor``) is that of a training file, or of a validation file before it, is held out of
  both sides (a *duplicate*), so that no copy of a training file, vendored or built, is evaluated.
- **Packing** (:func:`pack`, :func:`packing_order`): the training files are packed in the order of a seeded hash
  of each file's content (:func:`seeded_key`), not of its index, so adding or removing a file leaves the order of
  every other file as it was.
- **The evaluation set** (:func:`build_eval_set`): one window per validation file, from at least
  :data:`EVAL_FILES` files of at least :data:`MIN_PACKAGES` packages and the standard library, taken a package at
  a time so that any first documents of the set come from different packages; saved with its file list (names,
  sha256, offsets) in the ``.npz`` and in a JSON manifest beside it (:func:`save_eval_set`).
  :func:`check_manifest` reports how this machine's files match a manifest.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib.metadata
import json
import platform
import site
import sys
import sysconfig
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import cli
from .._checks import check_int

VALIDATION_PERCENT = 2
"""The share of files (by name hash, in percent) held out for validation."""

MAX_FILE_BYTES = 1 << 20
"""Files larger than this (generated tables, vendored bundles) are left out."""

SEPARATOR = b"\n\n"
"""What separates two documents in a packed stream."""

ROOT_KINDS = ("stdlib", "site-packages")
"""The kinds of corpus roots: the first component of every file's name."""

SITE_DIRS = frozenset({"site-packages", "dist-packages"})
"""Folders that hold installed packages: a file under one is not a standard-library file, and its path is
normalised from there (:func:`normalized_path`)."""

VENDOR_DIRS = frozenset({"_vendor", "vendor", "_vendored", "vendored", "extern", "_extern", "external", "_external",
                         "externals", "third_party", "_third_party"})
"""Folder names under which packages keep vendored copies of other packages (``pip/_vendor/rich``,
``sklearn/externals/array_api_compat``, ``scipy/_external``): :func:`normalized_path` starts after them."""

EVAL_LENGTH = 8192
"""Bytes per evaluation document (the committed model's context)."""

EVAL_FILES = 128
"""Documents (one per validation file) in the evaluation set."""

MIN_PACKAGES = 20
"""Distinct packages besides the standard library that the evaluation set must draw from."""

STDLIB = "stdlib"
"""The package name of every standard-library file (:func:`package_of`)."""


@dataclass(frozen=True)
class SourceFile:
    """One corpus file: its machine-independent ``name``, where it is (``path``), its size and sha256."""

    name: str
    path: Path
    size: int
    sha256: str


def hash_int(text: str) -> int:
    """The first 8 bytes of ``sha256(text)`` as a little-endian unsigned integer: a place that depends on the
    text only."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def is_validation(name: str, percent: int = VALIDATION_PERCENT) -> bool:
    """Whether the file called ``name`` is a validation file: the first 8 bytes of sha256(name), as an
    unsigned integer (:func:`hash_int`), modulo 100, are below ``percent``. Deterministic, and independent of the
    file's bytes."""
    return hash_int(name) % 100 < percent


def default_roots() -> list[tuple[str, Path]]:
    """``[("stdlib", dir), ("site-packages", dir), ...]``: this Python's standard library and its
    site-packages directories (the environment's and the user's), existing ones only, without repeats."""
    roots = [("stdlib", Path(sysconfig.get_paths()["stdlib"]))]
    packages = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    packages.append(sysconfig.get_paths()["purelib"])
    roots += [("site-packages", Path(p)) for p in packages]
    seen, found = set(), []
    for kind, root in roots:
        resolved = root.resolve()
        if resolved.is_dir() and resolved not in seen:
            seen.add(resolved)
            found.append((kind, resolved))
    return found


def find_sources(roots: list[tuple[str, Path]] | None = None, max_bytes: int = MAX_FILE_BYTES) -> list[SourceFile]:
    """Every ``*.py`` file under ``roots`` (default :func:`default_roots`; the standard library's
    ``site-packages`` is left to its own root, or out when it is none: another environment's packages, not the
    standard library) of 1 to ``max_bytes`` bytes that holds no NUL byte, sorted by name, each name once (the
    first root wins).

    Raises:
        ValueError: no file was found.
    """
    roots = default_roots() if roots is None else roots
    max_bytes = check_int("max_bytes", max_bytes, 1)
    inner = {root for _, root in roots}
    files: dict[str, SourceFile] = {}
    for kind, root in roots:
        for path in sorted(root.rglob("*.py")):
            if any(parent in inner and root in parent.parents for parent in path.parents):
                continue  # under a root nested in this one (site-packages inside the stdlib tree): counted there
            if kind == STDLIB and SITE_DIRS & set(path.relative_to(root).parts[:-1]):
                continue  # another environment's packages inside the standard library's folder: not stdlib
            if not path.is_file():
                continue
            data = path.read_bytes()
            if not 0 < len(data) <= max_bytes or b"\0" in data:
                continue
            name = f"{kind}/{path.relative_to(root).as_posix()}"
            files.setdefault(name, SourceFile(name, path, len(data), hashlib.sha256(data).hexdigest()))
    if not files:
        raise ValueError(f"roots {[str(r) for _, r in roots]} hold no Python source files")
    return [files[name] for name in sorted(files)]


def split_sources(files: list[SourceFile], percent: int = VALIDATION_PERCENT) -> tuple[list, list]:
    """``(train, validation)``: ``files`` split by :func:`is_validation` of each name (orders kept), before
    deduplication (:func:`split_corpus` removes the validation files that copy a training file)."""
    validation = [f for f in files if is_validation(f.name, percent)]
    train = [f for f in files if not is_validation(f.name, percent)]
    return train, validation


def seeded_key(value: str, seed: int, purpose: str = "pack") -> int:
    """A place in a seeded order: the first 8 bytes, as a little-endian unsigned integer, of
    ``sha256(f"{purpose}:{seed}:{value}")``, ``value`` being a file's content hash (hex) or a package's name. It
    depends on the value, the seed and the purpose only, never on the other files."""
    return hash_int(f"{purpose}:{check_int('seed', seed)}:{value}")


def packing_order(files: list[SourceFile], seed: int) -> list[SourceFile]:
    """``files`` sorted by :func:`seeded_key` of their content (ties, files of equal bytes, by name): adding or
    removing a file leaves every other file's relative order unchanged."""
    return sorted(files, key=lambda f: (seeded_key(f.sha256, seed), f.name))


def pack(files: list[SourceFile], seed: int | None = None) -> np.ndarray:
    """The files' bytes in one ``uint8`` stream, :data:`SEPARATOR` after each file; in the given order, or in
    :func:`packing_order` of ``seed``. Raises ``ValueError`` for no files."""
    if not files:
        raise ValueError("files must not be empty")
    ordered = files if seed is None else packing_order(files, seed)
    return np.frombuffer(b"".join(f.path.read_bytes() + SEPARATOR for f in ordered), dtype=np.uint8).copy()


def documents(stream: np.ndarray, length: int, count: int | None = None) -> np.ndarray:
    """Consecutive, non-overlapping windows of ``length`` bytes of ``stream`` (``count`` of them, or all that
    fit): ``uint8 [count, length]``. Raises ``ValueError`` when fewer than ``count`` (or none) fit."""
    length = check_int("length", length, 1)
    fit = len(stream) // length
    count = fit if count is None else check_int("count", count, 1)
    if fit < max(count, 1):
        raise ValueError(f"the stream of {len(stream)} bytes holds {fit} windows of {length}, fewer than {count}")
    return stream[: count * length].reshape(count, length).copy()


def _path_parts(name: str, vendoring: bool) -> list[str]:
    """The components of ``name`` without its root kind, from after the last site-packages folder or
    ``build/lib`` pair (and vendoring folder, when ``vendoring``) on; the file name is never cut."""
    parts = name.split("/")
    if len(parts) > 1 and parts[0] in ROOT_KINDS:
        parts = parts[1:]
    start = 0
    for i, part in enumerate(parts[:-1]):
        if part in SITE_DIRS or (vendoring and part in VENDOR_DIRS):
            start = i + 1
        elif part == "build" and i + 2 < len(parts) and (parts[i + 1] == "lib" or parts[i + 1].startswith("lib.")):
            start = i + 2
    return parts[start:]


def normalized_path(name: str) -> str:
    """The path by which copies of one module match across roots, vendoring and builds: the file's ``name``
    without its root kind (:data:`ROOT_KINDS`), starting after the last folder that is a site-packages folder
    (:data:`SITE_DIRS`), a vendoring folder (:data:`VENDOR_DIRS`) or a ``build/lib`` (``build/lib.<platform>``)
    pair. ``site-packages/pip/_vendor/rich/x.py``, ``site-packages/build/lib/rich/x.py`` and
    ``site-packages/rich/x.py`` are all ``rich/x.py``; ``stdlib/json/decoder.py`` is ``json/decoder.py``. The
    file name itself is never cut. (Generous on purpose: a false match only drops a validation file.)"""
    return "/".join(_path_parts(name, vendoring=True))


def package_of(name: str) -> str:
    """The package a file belongs to: :data:`STDLIB` for a file of a ``stdlib`` root (outside any site-packages
    folder), else the first component of its path without the root kind, a site-packages folder or ``build/lib``
    (a single-module package without ``.py``), vendoring folders kept: ``site-packages/pip/_vendor/rich/x.py``
    belongs to ``pip``, ``site-packages/build/lib/botorch/x.py`` to ``botorch``, ``site-packages/six.py`` to
    ``six``."""
    parts = name.split("/")
    if parts[0] == STDLIB and not SITE_DIRS & set(parts[1:-1]):
        return STDLIB
    return _path_parts(name, vendoring=False)[0].removesuffix(".py")


@dataclass(frozen=True)
class Duplicate:
    """A validation file held out of both sides: its bytes (``reason="content"``) or its normalised path
    (``reason="path"``) are those of the file called ``of`` (a training file, or a validation file kept before
    it)."""

    file: SourceFile
    reason: str
    of: str


@dataclass(frozen=True)
class CorpusSplit:
    """The training files, the deduplicated validation files and the duplicates taken out of validation."""

    train: list[SourceFile]
    validation: list[SourceFile]
    duplicates: list[Duplicate] = field(default_factory=list)


def split_corpus(files: list[SourceFile], percent: int = VALIDATION_PERCENT) -> CorpusSplit:
    """:func:`split_sources`, then the validation files deduplicated: in name order, a validation file whose
    sha256 or :func:`normalized_path` is that of a training file, or of a validation file kept before it, becomes
    a :class:`Duplicate` (content checked first) and lands on neither side. Training files are kept as they are.
    """
    train, validation = split_sources(files, percent)
    by_hash: dict[str, str] = {}
    by_path: dict[str, str] = {}
    for f in train:
        by_hash.setdefault(f.sha256, f.name)
        by_path.setdefault(normalized_path(f.name), f.name)
    kept, duplicates = [], []
    for f in validation:
        path = normalized_path(f.name)
        if f.sha256 in by_hash:
            duplicates.append(Duplicate(f, "content", by_hash[f.sha256]))
        elif path in by_path:
            duplicates.append(Duplicate(f, "path", by_path[path]))
        else:
            kept.append(f)
            by_hash[f.sha256] = by_path[path] = f.name
    return CorpusSplit(train, kept, duplicates)


def manifest(train: list[SourceFile], validation: list[SourceFile], duplicates: Iterable[Duplicate] = ()) -> dict:
    """A JSON-able record of the corpus: per file its name, size, sha256 and side (``train``, ``validation``, or
    ``duplicate`` with ``reason`` and ``duplicate_of``), and the Python and package versions the files came
    from."""
    duplicates = list(duplicates)
    packages = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            packages[name] = dist.version
    return dict(
        python=sys.version.split()[0], implementation=platform.python_implementation(), platform=platform.platform(),
        validation_percent=VALIDATION_PERCENT, split="sha256(name)[:8] as little-endian int % 100 < percent",
        deduplication="a validation file whose sha256 or normalized_path is that of a training file (or of a "
                      "validation file before it) is a duplicate, on neither side",
        packing="sha256(f'pack:{seed}:{file sha256}')[:8] as little-endian int, ties by name",
        train_files=len(train), train_bytes=sum(f.size for f in train),
        validation_files=len(validation), validation_bytes=sum(f.size for f in validation),
        duplicate_files=len(duplicates), duplicate_bytes=sum(d.file.size for d in duplicates),
        packages=dict(sorted(packages.items(), key=lambda kv: kv[0].lower())),
        files=[dict(name=f.name, size=f.size, sha256=f.sha256, side=side)
               for side, group in (("train", train), ("validation", validation)) for f in group]
        + [dict(name=d.file.name, size=d.file.size, sha256=d.file.sha256, side="duplicate", reason=d.reason,
                duplicate_of=d.of) for d in duplicates],
    )


# ------------------------------------------------------------------------------------------ the evaluation set
@dataclass(frozen=True)
class EvalSet:
    """The evaluation set: ``documents`` (``uint8 [N, length]``), document ``i`` being bytes
    ``offsets[i]:offsets[i] + length`` of ``files[i]`` (of package ``packages[i]``), and the split it came
    from."""

    documents: np.ndarray
    files: list[SourceFile]
    offsets: list[int]
    packages: list[str]
    split: CorpusSplit
    seed: int

    def summary(self) -> dict:
        """Counts: documents, their length, files and packages chosen, and the split's sizes and duplicates."""
        reasons = [d.reason for d in self.split.duplicates]
        return dict(documents=len(self.files), length=int(self.documents.shape[1]),
                    packages=len(set(self.packages) - {STDLIB}), stdlib_files=self.packages.count(STDLIB),
                    train_files=len(self.split.train), validation_files=len(self.split.validation),
                    duplicates=len(reasons), duplicates_by_content=reasons.count("content"),
                    duplicates_by_path=reasons.count("path"))


def build_eval_set(files: list[SourceFile], length: int = EVAL_LENGTH, count: int = EVAL_FILES,
                   min_packages: int = MIN_PACKAGES, seed: int = 0,
                   percent: int = VALIDATION_PERCENT) -> EvalSet:
    """The evaluation set of the corpus ``files`` (:func:`find_sources`): one window of ``length`` bytes from
    each of ``count`` deduplicated validation files (:func:`split_corpus`) of at least ``length`` bytes.

    The files are taken a package at a time (:func:`package_of`): packages in the order of
    ``seeded_key(package, seed, "package")``, each package's files in the order of
    ``seeded_key(sha256, seed, "file")``; round ``r`` takes the ``r``-th file of every package that has one.
    So the first documents come from as many packages as there are, and a file added to one package moves no
    other package's choice. When ``count`` is smaller than the packages and the rounds leave the standard library
    out, its first file takes the last place. A window starts at
    ``seeded_key(sha256, seed, "window") % (size - length + 1)``.

    Raises:
        ValueError: fewer than ``count`` eligible files, or the chosen ones span fewer than ``min_packages``
            packages besides the standard library, or no standard-library file (the message says what this
            machine has); ``count`` below ``min_packages + 1``.
    """
    length, count = check_int("length", length, 1), check_int("count", count, 1)
    min_packages, seed = check_int("min_packages", min_packages), check_int("seed", seed)
    if count < min_packages + 1:
        raise ValueError(f"count must be >= min_packages + 1 = {min_packages + 1} (a file per package and one of "
                         f"the standard library), got {count}")
    split = split_corpus(files, percent)
    groups: dict[str, list[SourceFile]] = {}
    for f in split.validation:
        if f.size >= length:
            groups.setdefault(package_of(f.name), []).append(f)
    eligible = sum(len(g) for g in groups.values())
    have = (f"this corpus has {eligible} deduplicated validation files of >= {length} bytes in "
            f"{len(set(groups) - {STDLIB})} packages besides the standard library ({len(groups.get(STDLIB, []))} "
            f"standard-library files; {len(split.validation)} validation files in all, {len(split.duplicates)} "
            f"duplicates taken out)")
    if eligible < count:
        raise ValueError(f"the evaluation set needs {count} validation files of >= {length} bytes: {have}; use "
                         f"a machine with more packages installed, or a larger validation percent")
    for group in groups.values():
        group.sort(key=lambda f: (seeded_key(f.sha256, seed, "file"), f.name))
    order = sorted(groups, key=lambda p: (seeded_key(p, seed, "package"), p))
    chosen: list[tuple[str, SourceFile]] = []
    for r in range(max(len(g) for g in groups.values())):
        chosen += [(p, groups[p][r]) for p in order if r < len(groups[p])]
    chosen = chosen[:count]
    if STDLIB in groups and all(p != STDLIB for p, _ in chosen):  # fewer documents than packages
        chosen[-1] = (STDLIB, groups[STDLIB][0])
    packages = [p for p, _ in chosen]
    if len(set(packages) - {STDLIB}) < min_packages or STDLIB not in packages:
        raise ValueError(f"the evaluation set needs files of at least {min_packages} packages and the standard "
                         f"library: {have}; use a machine with more packages installed")
    offsets, rows = [], []
    for _, f in chosen:
        data = f.path.read_bytes()
        if hashlib.sha256(data).hexdigest() != f.sha256:
            raise ValueError(f"{f.path} changed while the evaluation set was built")
        offset = seeded_key(f.sha256, seed, "window") % (len(data) - length + 1)
        offsets.append(offset)
        rows.append(np.frombuffer(data[offset:offset + length], dtype=np.uint8))
    return EvalSet(np.stack(rows), [f for _, f in chosen], offsets, packages, split, seed)


def eval_set_manifest(eval_set: EvalSet) -> dict:
    """A JSON-able record of an evaluation set: how it was chosen, its counts (:meth:`EvalSet.summary`), the
    Python it came from, the duplicates found (``duplicate_files``), and per document its file (``name``,
    ``sha256``, ``size``), ``package`` and window ``offset``."""
    return dict(
        kind="topo_attn.lm eval set", python=sys.version.split()[0], seed=eval_set.seed,
        rule="one window per deduplicated validation file of >= length bytes, a package at a time (see "
             "topo_attn.lm.corpus.build_eval_set)",
        **eval_set.summary(),
        files=[dict(name=f.name, sha256=f.sha256, size=f.size, package=p, offset=o)
               for f, p, o in zip(eval_set.files, eval_set.packages, eval_set.offsets)],
        duplicate_files=[dict(name=d.file.name, sha256=d.file.sha256, reason=d.reason, duplicate_of=d.of)
                    for d in eval_set.split.duplicates],
    )


def save_eval_set(eval_set: EvalSet, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``eval_set.npz`` (``documents``, and the file list as arrays ``names``, ``sha256``, ``offsets``)
    and ``eval_set.json`` (:func:`eval_set_manifest`) into ``out_dir`` (created). Returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    npz, record = out / "eval_set.npz", out / "eval_set.json"
    np.savez_compressed(npz, documents=eval_set.documents, names=np.array([f.name for f in eval_set.files]),
                        sha256=np.array([f.sha256 for f in eval_set.files]),
                        offsets=np.array(eval_set.offsets, dtype=np.int64))
    record.write_text(json.dumps(eval_set_manifest(eval_set), indent=1) + "\n")
    return npz, record


MANIFEST_EXPECTED = ("a corpus manifest (.json or .json.gz with a 'files' list of name and sha256, such as "
                     "data/lm/corpus_manifest.json.gz or eval_set.json) or an eval_set.npz with 'names' and 'sha256'")


def read_manifest(path: str | Path) -> list[dict]:
    """The files a manifest lists, ``[{"name", "sha256", "side"?}]``: from a JSON file (gzipped or not) with a
    ``files`` list (:func:`manifest`, :func:`eval_set_manifest`), or an ``.npz`` with ``names`` and ``sha256``
    arrays (:func:`save_eval_set`).

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is none of these.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(2, "No such file", str(path))
    if zipfile.is_zipfile(path):
        with np.load(path, allow_pickle=False) as data:
            if not {"names", "sha256"} <= set(data.files):
                raise ValueError(f"{path} holds the arrays {list(data.files)}, no 'names' and 'sha256'; expected "
                                 f"{MANIFEST_EXPECTED}")
            return [dict(name=str(n), sha256=str(h)) for n, h in zip(data["names"], data["sha256"])]
    try:
        raw = path.read_bytes()
        record = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        entries = [dict(name=str(f["name"]), sha256=str(f["sha256"]), **({"side": f["side"]} if "side" in f else {}))
                   for f in record["files"]]
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is not a manifest ({type(error).__name__}: {error}); expected "
                         f"{MANIFEST_EXPECTED}") from error
    return entries


def check_manifest(entries: list[dict], files: list[SourceFile]) -> dict:
    """How ``files`` (this machine's, :func:`find_sources`) match a manifest's ``entries``
    (:func:`read_manifest`): ``same`` (a file of that name with that sha256), ``changed`` (the name with other
    bytes), ``missing`` (no file of that name), each a sorted list of names, ``extra`` (the number of files
    here that the manifest does not list), and, where the entries have sides, the three counts per side."""
    here = {f.name: f.sha256 for f in files}
    status = {}
    for entry in entries:
        sha = here.get(entry["name"])
        status[entry["name"]] = "missing" if sha is None else "same" if sha == entry["sha256"] else "changed"
    result = {key: sorted(n for n, s in status.items() if s == key) for key in ("same", "changed", "missing")}
    result["listed"] = len(status)
    result["extra"] = len(set(here) - set(status))
    sides: dict[str, dict[str, int]] = {}
    for entry in entries:
        if "side" in entry:
            counts = sides.setdefault(entry["side"], dict(same=0, changed=0, missing=0))
            counts[status[entry["name"]]] += 1
    if sides:
        result["sides"] = sides
    return result


def format_check(path: str | Path, result: dict, examples: int = 5) -> str:
    """The report of :func:`check_manifest` that ``corpus --check`` prints: the counts, per side where known,
    and the first ``examples`` names changed and missing."""
    lines = [f"manifest {path}: {result['listed']} files",
             f"same content: {len(result['same'])}", f"changed: {len(result['changed'])}",
             f"missing: {len(result['missing'])}", f"here but not listed: {result['extra']}"]
    for side, counts in sorted(result.get("sides", {}).items()):
        lines.append(f"  {side}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    for key in ("changed", "missing"):
        names = result[key]
        if names:
            more = f" (and {len(names) - examples} more)" if len(names) > examples else ""
            lines.append(f"{key}: " + ", ".join(names[:examples]) + more)
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ command line
PROG = "python -m topo_attn.lm corpus"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--out", help="folder to write eval_set.npz and eval_set.json into")
    action.add_argument("--check", metavar="MANIFEST",
                        help="report how this machine's files match MANIFEST (" + MANIFEST_EXPECTED + ")")
    parser.add_argument("--root", action="append", default=None, metavar="KIND=PATH",
                        help=f"a corpus root, KIND one of {', '.join(ROOT_KINDS)} (repeat; default: this Python's "
                             f"standard library and site-packages)")
    parser.add_argument("--length", type=int, default=EVAL_LENGTH, help="bytes per document")
    parser.add_argument("--files", type=int, default=EVAL_FILES, help="documents, one per validation file")
    parser.add_argument("--min-packages", type=int, default=MIN_PACKAGES,
                        help="packages besides the standard library the set must span")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--validation-percent", type=int, default=VALIDATION_PERCENT)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def build_parser(add_help: bool = True) -> argparse.ArgumentParser:
    """``corpus``'s command line: ``--out`` or ``--check``, the roots and the set's settings."""
    return cli.command_parser(PROG, __doc__, add_arguments, add_help=add_help)


def parse_roots(values: list[str] | None) -> list[tuple[str, Path]] | None:
    """``--root KIND=PATH`` values as roots (None: the default roots); a :class:`~topo_attn.cli.UsageError` for a
    malformed value, an unknown kind or a missing folder."""
    if values is None:
        return None
    roots = []
    for value in values:
        kind, sep, folder = value.partition("=")
        if not sep or kind not in ROOT_KINDS or not folder:
            raise cli.UsageError(f"argument --root: expected KIND=PATH with KIND one of {', '.join(ROOT_KINDS)}, "
                                 f"got {value!r}")
        if not Path(folder).is_dir():
            raise cli.UsageError(f"argument --root: no folder {folder}")
        roots.append((kind, Path(folder).resolve()))
    return roots


def main(argv: list[str] | None = None) -> int:
    """``corpus --out DIR`` builds and writes the evaluation set (:func:`build_eval_set`, :func:`save_eval_set`)
    and prints its counts; ``corpus --check MANIFEST`` prints :func:`format_check`. Returns 0; raises
    :class:`~topo_attn.cli.UsageError` for a bad value."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    cli.check_at_least("--length", args.length, 1)
    cli.check_at_least("--files", args.files, 1)
    cli.check_at_least("--min-packages", args.min_packages, 0, "min_packages")
    cli.check_at_least("--seed", args.seed, 0)
    if not 0 < args.validation_percent < 100:
        raise cli.UsageError(f"argument --validation-percent: expected 1 to 99, got {args.validation_percent}")
    if args.files < args.min_packages + 1:
        raise cli.UsageError(f"argument --files: expected at least --min-packages + 1 = {args.min_packages + 1}, "
                             f"got {args.files}")
    roots = parse_roots(args.root)
    if args.check is not None:
        if not Path(args.check).is_file():
            raise cli.UsageError(f"argument --check: no file {args.check}; expected {MANIFEST_EXPECTED}")
        entries = cli.check_option("--check", lambda: read_manifest(args.check))
        result = check_manifest(entries, find_sources(roots))
        print(json.dumps(result, indent=1) if args.json else format_check(args.check, result))
        return 0
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise cli.UsageError(f"argument --out: {out} is a file; expected a folder")
    eval_set = build_eval_set(find_sources(roots), args.length, args.files, args.min_packages, args.seed,
                              args.validation_percent)
    npz, record = save_eval_set(eval_set, out)
    summary = dict(eval_set.summary(), npz=str(npz), manifest=str(record))
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print("\n".join(f"{key}: {value}" for key, value in summary.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main, prog=PROG))
