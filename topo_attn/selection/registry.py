"""The registry of selectors: one :class:`~topo_attn.selection.selector.Selector` per module, read by everything
that picks blocks. Lists of names are derived from it (:func:`names`), never written out again."""

from __future__ import annotations

import functools

from . import (centroid, cluster, cluster_centroid, oracle, quest, random, topology, topology_22, window)
from .selector import Selector

SELECTORS: dict[str, Selector] = {module.SELECTOR.name: module.SELECTOR for module in (
    window, random, topology_22, topology, centroid, quest, cluster, cluster_centroid, oracle)}
"""Every selector by name, in the order tables list them."""


def names(path: str | None = None, **flags: bool) -> tuple[str, ...]:
    """The selectors' names, in :data:`SELECTORS` order: all of them, or those that support ``path``
    (``"block"``, ``"step"`` or ``"token"``: a whole sequence, the end of a cache, one token at a time) and
    whose flags (``query_aware=True``, ``sync_free=True``, ...) have the values given. Raises ``ValueError``
    for another path."""
    if path not in (None, "block", "step", "token"):
        raise ValueError(f"path must be None, 'block', 'step' or 'token', got {path!r}")
    return _names(path, tuple(sorted(flags.items())))


@functools.cache
def _names(path: str | None, flags: tuple[tuple[str, bool], ...]) -> tuple[str, ...]:
    """:func:`names` for a checked ``path`` and its flags as sorted items (kept per call: the registry is fixed
    at import, and a layer's selection asks once or twice)."""
    chosen = []
    for name, selector in SELECTORS.items():
        if path == "block" and selector.block_scores is None and name != "topology_22":
            continue
        if path in ("step", "token") and getattr(selector, f"{path}_scores") is None:
            continue
        if all(getattr(selector, flag) == value for flag, value in flags):
            chosen.append(name)
    return tuple(chosen)


def get(name: object, path: str | None = None, **flags: bool) -> Selector:
    """The selector called ``name``, supporting ``path`` when given and with the flags given (see
    :func:`names`). Raises ``TypeError`` for a non-str name and ``ValueError`` naming the selectors there are."""
    if not isinstance(name, str):
        raise TypeError(f"selector must be a str, got {type(name).__name__}")
    allowed = names(path, **flags)
    if name not in allowed:
        where = {None: "", "block": " over a whole sequence", "step": " at the end of a key cache",
                 "token": " per token"}[path]
        where += "".join(f" ({flag}={value})" for flag, value in flags.items())
        raise ValueError(f"selector must be one of {list(allowed)}{where}, got {name!r}")
    return SELECTORS[name]
