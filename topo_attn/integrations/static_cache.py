"""``TopoStaticCache``: a preallocated transformers ``StaticCache`` that also keeps, per layer, the key-block
statistics the kit's selectors read at a decode step, so that one compiled step (a CUDA graph) serves every
step of ``generate()``.

.. code-block:: python

    from topo_attn.integrations import transformers as tat
    from topo_attn.integrations.cache import cache_argument
    from topo_attn.integrations.static_cache import TopoStaticCache
    model.set_attn_implementation(tat.register(selector="quest", block_size=64, budget=32))
    cache = TopoStaticCache(model.config, max_cache_len=prompt_len + new_tokens)
    out = model.generate(input_ids, max_new_tokens=new_tokens, **cache_argument(cache))  # compiles the step

transformers compiles the decode step by itself when the cache is a static one (``StaticCache``, this class
included) and the model is on a GPU (``generate``'s "static cache + compiled forward" recipe); the prefill
runs eagerly.

What a layer keeps (:class:`StaticLayerState`, put on the layer's key buffer under
:data:`~topo_attn.integrations.transformers.STATIC_STATE_ATTRIBUTE` by :meth:`TopoStaticCache.update`): the
layer's length (transformers' ``cumulative_length``, a device tensor updated in place: the number of valid
keys, never read on the host at a decode step) and, per block size, a
:class:`~topo_attn.selection.static_step.StaticBlockStats` (centroid, minimum and maximum of every key block,
preallocated for ``max_cache_len`` keys and updated in place by the attention function for the blocks each
call writes). The buffers are created at the first (eager) call that needs them and marked as static
addresses, so a captured graph updates them in place.

Beam search (``reorder_cache``) and batch selection are not supported: they raise ``ValueError``. Cropping
(``crop``) and ``reset`` keep the statistics valid (each call recomputes the blocks it writes).

Importing this module imports transformers (``pip install topo_attn[lm]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import StaticCache

from .._checks import check_int
from ..selection.static_step import StaticBlockStats
from .transformers import STATIC_STATE_ATTRIBUTE

__all__ = ["StaticLayerState", "TopoStaticCache"]


@dataclass
class StaticLayerState:
    """What the kit keeps for one layer of a :class:`TopoStaticCache`: ``length``, the layer's number of valid
    keys (a one-element integer device tensor, updated in place by the cache), and the layer's
    :class:`StaticBlockStats` by block size (:meth:`block_stats`)."""

    length: torch.Tensor
    stats: dict[int, StaticBlockStats] = field(default_factory=dict)

    def block_stats(self, keys: torch.Tensor, block_size: int, salience: bool = False) -> StaticBlockStats:
        """The layer's statistics for blocks of ``block_size`` over its key buffer ``keys [B, H_kv, S_max, D]``,
        created (zero, float32, marked as a static address) at the first call for that block size, with the
        kept salience when ``salience`` (the ``topology`` selector's). Raises ``ValueError`` when they would be
        created inside a compiled region (run the first call, the prefill, eagerly: ``generate`` does), and when
        the salience is asked of statistics created without it (one cache used by two backends)."""
        found = self.stats.get(block_size)
        if found is None:
            if torch.compiler.is_compiling():
                raise ValueError("TopoStaticCache creates its block statistics at the first eager call (the "
                                 "prefill); run the prefill outside torch.compile")
            found = StaticBlockStats.for_cache(keys, block_size, torch.float32, salience=salience)
            _mark_static(found)
            self.stats[block_size] = found
        elif salience and found.salience is None:
            raise ValueError("this TopoStaticCache's block statistics were made without the salience the "
                             "topology selector reads (another backend used the cache first); use a new cache")
        return found


    def keep_rows(self, stats: StaticBlockStats, sinks: int, window: int, budget: int) -> None:
        """Create (at an eager call, marked as static addresses) the buffers in which a query-blind selector's
        one-launch step keeps its rows for this rule (:meth:`StaticBlockStats.kept_table`); nothing inside a
        compiled region (the step then computes every row)."""
        if not torch.compiler.is_compiling() and (sinks, window, budget) not in stats.kept_tables:
            stats.kept_table(sinks, window, budget)
            _mark_static(stats)


def _mark_static(stats: StaticBlockStats) -> None:
    """Mark every buffer of ``stats`` as a static address: a compiled step mutates them, and CUDA graphs are
    skipped for a mutated input that is not static."""
    for buffer in stats.buffers():
        torch._dynamo.mark_static_address(buffer)


class TopoStaticCache(StaticCache):
    """A ``transformers.StaticCache`` (same arguments: ``config``, ``max_cache_len``, ...) whose layers carry a
    :class:`StaticLayerState` for the kit's attention backend (module docstring). With another backend it
    behaves as a ``StaticCache``."""

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """``StaticCache.update``; the layer's key buffer carries its :class:`StaticLayerState`."""
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        if getattr(keys, STATIC_STATE_ATTRIBUTE, None) is None:
            layer = self.layers[check_int("layer_idx", layer_idx)]
            setattr(keys, STATIC_STATE_ATTRIBUTE, StaticLayerState(layer.cumulative_length))
        return keys, values

    def reorder_cache(self, *args, **kwargs):
        raise ValueError("TopoStaticCache does not support beam search (reorder_cache); use num_beams=1")

    def batch_select_indices(self, *args, **kwargs):
        raise ValueError("TopoStaticCache does not support selecting batch entries")

    def batch_repeat_interleave(self, *args, **kwargs):
        raise ValueError("TopoStaticCache does not support repeating batch entries")
