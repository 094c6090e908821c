"""The selector registry (``topo_attn.selection.registry``): the name lists derived from it, per path and flags,
and the lookup's errors."""

from __future__ import annotations

import pytest

from topo_attn.selection import registry
from topo_attn.selection.registry import SELECTORS, get, names


def expected(path=None, **flags) -> tuple[str, ...]:
    """The names, recomputed from each selector's fields: the paths it has, then the flags asked."""
    has = {None: lambda n, s: True, "block": lambda n, s: s.block_scores is not None or n == "topology_22",
           "step": lambda n, s: s.step_scores is not None, "token": lambda n, s: s.token_scores is not None}[path]
    return tuple(n for n, s in SELECTORS.items() if has(n, s) and all(getattr(s, f) == v for f, v in flags.items()))


@pytest.mark.parametrize("path", [None, "block", "step", "token"])
@pytest.mark.parametrize("flags", [{}, {"query_aware": True}, {"query_aware": False},
                                   {"query_aware": True, "adds_blocks": True}, {"adds_blocks": True,
                                                                                 "query_aware": True}])
def test_names_per_path_and_flags(path, flags):
    assert names(path, **flags) == expected(path, **flags)
    assert names(path, **flags) == names(path, **dict(reversed(flags.items())))  # the flags' order is irrelevant


def test_the_name_lists_are_not_all_alike():
    assert names("step") != names() and names(query_aware=True) != names(query_aware=False)
    assert "topology_22" in names("block") and "cluster" in names("block") and "cluster" not in names("step")


def test_get_and_its_errors():
    assert get("centroid") is SELECTORS["centroid"] and get("quest", "step") is SELECTORS["quest"]
    with pytest.raises(ValueError, match="over a whole sequence"):
        get("bogus", "block")
    with pytest.raises(ValueError, match="at the end of a key cache"):
        get("cluster", "step")
    with pytest.raises(TypeError, match="selector must be a str"):
        get(3)
    with pytest.raises(ValueError, match="path must be"):
        names("rows")
    assert registry.names is names
