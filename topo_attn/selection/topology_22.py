"""``topology_22``: #22's rule itself, :func:`~topo_attn.topology_schedule` with ``topk = budget``: one top-k of
the elder-rule salience per lane, of which a row keeps the causal blocks (they may overlap the sinks and the
window, so rows visit fewer blocks than at an equal budget). Its rows are not of known width: on a GPU its
schedule is *padded* (:attr:`~topo_attn.BlockSchedule.padded`), the entries in a buffer of the most the rule can
give and their count known on the device only, so the selection waits for no host sync. At the end of a cache it
is the equal-budget rule of ``topology``."""

from __future__ import annotations

from .selector import Selector
from .topology import step_scores

SELECTOR = Selector("topology_22", "#22's rule: one global top-k of the elder-rule salience per lane (visits "
                    "fewer blocks)", None, step_scores, topology_aware=True, equal_budget=False)
