"""``topology_22``: #22's rule itself, :func:`~topo_attn.topology_schedule` with ``topk = budget``: one top-k of
the elder-rule salience per lane, of which a row keeps the causal blocks (they may overlap the sinks and the
window, so rows visit fewer blocks than at an equal budget). Its rows are not of known width, so its schedule
costs one host sync (the entry count). At the end of a cache it is the equal-budget rule of ``topology``."""

from __future__ import annotations

from .selector import Selector
from .topology import step_scores

SELECTOR = Selector("topology_22", "#22's rule: one global top-k of the elder-rule salience per lane (visits "
                    "fewer blocks)", None, step_scores, topology_aware=True, sync_free=False, equal_budget=False)
