"""``TopoCache``: a transformers KV cache that also keeps what the kit's selectors read at decode time.

.. code-block:: python

    from topo_attn.integrations import transformers as tat
    from topo_attn.integrations.cache import TopoCache
    model.set_attn_implementation(tat.register(selector="quest", block_size=64, budget=8))
    out = model.generate(input_ids, max_new_tokens=32, cache=TopoCache())  # transformers >= 5.24
    out = model.generate(input_ids, max_new_tokens=32, **cache_argument(TopoCache()))  # any transformers 5

A :class:`TopoCache` is a ``transformers.DynamicCache`` (keys and values grow by concatenation, as there)
that holds, per layer and block size, a :class:`~topo_attn.selection.incremental.KeyBlockStats`: the centroid
and Quest's element-wise minimum and maximum of each complete key block, and the blocks' elder-rule salience
when a topology selector asks for it. The backend's attention function updates them from the cache at a
decode step, reading only the blocks completed since the last step (``LayerStats.blocks_read``), so a step's
selection costs products with ``n`` block statistics instead of a pass over every cached key.

How the attention function finds them: :meth:`TopoCache.update` returns the layer's key tensor with the
attribute :data:`~topo_attn.integrations.transformers.BLOCK_STATS_ATTRIBUTE` set to a function
``block_size -> KeyBlockStats`` of that layer. Cropping, reordering (beam search), selecting or repeating batch
entries and resetting the cache forget the statistics (they are rebuilt from the cache when next needed).

Importing this module imports transformers (``pip install topo_attn[lm]``).
"""

from __future__ import annotations

from functools import partial

import transformers
from packaging import version
from transformers import DynamicCache

from .._checks import check_int
from ..selection.incremental import KeyBlockStats
from .transformers import BLOCK_STATS_ATTRIBUTE

__all__ = ["CACHE_ARGUMENT", "TopoCache", "cache_argument"]

CACHE_ARGUMENT = "cache" if version.parse(transformers.__version__).release >= (5, 24) else "past_key_values"
"""The name under which ``generate()`` and a model's ``forward`` take a cache: ``cache`` from transformers 5.24
on (``past_key_values`` warns there, deprecated), ``past_key_values`` before."""


def cache_argument(cache) -> dict:
    """``{CACHE_ARGUMENT: cache}``, to pass a cache to ``generate()`` or ``forward`` on any transformers 5."""
    return {CACHE_ARGUMENT: cache}


class TopoCache(DynamicCache):
    """A ``DynamicCache`` with per-layer key-block statistics for the kit's decode-time selection (see the
    module docstring). Takes the same arguments as ``DynamicCache``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.block_stats: dict[tuple[int, int], KeyBlockStats] = {}

    def stats(self, layer_idx: int, block_size: int) -> KeyBlockStats:
        """The :class:`KeyBlockStats` of layer ``layer_idx`` for blocks of ``block_size`` (created empty on
        first use; filled by the attention function). Raises ``TypeError``/``ValueError`` for a non-int or a
        block size below 1."""
        key = (check_int("layer_idx", layer_idx), check_int("block_size", block_size, 1))
        if key not in self.block_stats:
            self.block_stats[key] = KeyBlockStats(block_size)
        return self.block_stats[key]

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """``DynamicCache.update``, with the layer's statistics attached to the returned key tensor."""
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        setattr(keys, BLOCK_STATS_ATTRIBUTE, partial(self.stats, layer_idx))
        return keys, values

    def _forget(self) -> None:
        for stats in self.block_stats.values():
            stats.reset()

    def reset(self, *args, **kwargs):
        super().reset(*args, **kwargs)
        self._forget()

    def crop(self, *args, **kwargs):
        super().crop(*args, **kwargs)
        self._forget()

    def reorder_cache(self, *args, **kwargs):
        super().reorder_cache(*args, **kwargs)
        self._forget()

    def batch_select_indices(self, *args, **kwargs):
        super().batch_select_indices(*args, **kwargs)
        self._forget()

    def batch_repeat_interleave(self, *args, **kwargs):
        super().batch_repeat_interleave(*args, **kwargs)
        self._forget()
