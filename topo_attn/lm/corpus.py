"""The byte-level training corpus: the Python sources this machine has (the standard library and the installed
packages), split into training and validation files by a hash of each file's path.

A document is one file's bytes; its token ids are those bytes (vocabulary 256, no special tokens), so any text
encodes as ``list(text.encode())``. A file's **name** is its path relative to its root, prefixed with the
root's kind (``stdlib/json/decoder.py``, ``site-packages/numpy/linalg/_linalg.py``): the split depends on the
name only, so the same file lands on the same side on every machine and in every environment.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import site
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._checks import check_int

VALIDATION_PERCENT = 2
"""The share of files (by name hash, in percent) held out for validation."""

MAX_FILE_BYTES = 1 << 20
"""Files larger than this (generated tables, vendored bundles) are left out."""

SEPARATOR = b"\n\n"
"""What separates two documents in a packed stream."""


@dataclass(frozen=True)
class SourceFile:
    """One corpus file: its machine-independent ``name``, where it is (``path``), its size and sha256."""

    name: str
    path: Path
    size: int
    sha256: str


def is_validation(name: str, percent: int = VALIDATION_PERCENT) -> bool:
    """Whether the file called ``name`` is a validation file: the first 8 bytes of sha256(name), as an
    unsigned integer, modulo 100, are below ``percent``. Deterministic, and independent of the file's bytes."""
    digest = hashlib.sha256(name.encode()).digest()
    return int.from_bytes(digest[:8], "little") % 100 < percent


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
    ``site-packages`` is left to its own root) of 1 to ``max_bytes`` bytes that holds no NUL byte, sorted by
    name, each name once (the first root wins).

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
    """``(train, validation)``: ``files`` split by :func:`is_validation` of each name (orders kept)."""
    validation = [f for f in files if is_validation(f.name, percent)]
    train = [f for f in files if not is_validation(f.name, percent)]
    return train, validation


def pack(files: list[SourceFile], seed: int | None = None) -> np.ndarray:
    """The files' bytes in one ``uint8`` stream, :data:`SEPARATOR` after each file; in the given order, or
    shuffled by a ``numpy`` generator seeded with ``seed``. Raises ``ValueError`` for no files."""
    if not files:
        raise ValueError("files must not be empty")
    order = list(range(len(files)))
    if seed is not None:
        np.random.default_rng(seed).shuffle(order)
    return np.frombuffer(b"".join(files[i].path.read_bytes() + SEPARATOR for i in order), dtype=np.uint8).copy()


def documents(stream: np.ndarray, length: int, count: int | None = None) -> np.ndarray:
    """Consecutive, non-overlapping windows of ``length`` bytes of ``stream`` (``count`` of them, or all that
    fit): ``uint8 [count, length]``. Raises ``ValueError`` when fewer than ``count`` (or none) fit."""
    length = check_int("length", length, 1)
    fit = len(stream) // length
    count = fit if count is None else check_int("count", count, 1)
    if fit < max(count, 1):
        raise ValueError(f"the stream of {len(stream)} bytes holds {fit} windows of {length}, fewer than {count}")
    return stream[: count * length].reshape(count, length).copy()


def manifest(train: list[SourceFile], validation: list[SourceFile]) -> dict:
    """A JSON-able record of the corpus: per file its name, size, sha256 and side, and the Python and package
    versions the files came from."""
    packages = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            packages[name] = dist.version
    return dict(
        python=sys.version.split()[0], implementation=platform.python_implementation(), platform=platform.platform(),
        validation_percent=VALIDATION_PERCENT, split="sha256(name)[:8] as little-endian int % 100 < percent",
        train_files=len(train), train_bytes=sum(f.size for f in train),
        validation_files=len(validation), validation_bytes=sum(f.size for f in validation),
        packages=dict(sorted(packages.items(), key=lambda kv: kv[0].lower())),
        files=[dict(name=f.name, size=f.size, sha256=f.sha256, side=side)
               for side, group in (("train", train), ("validation", validation)) for f in group],
    )
