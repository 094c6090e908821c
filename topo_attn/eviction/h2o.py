"""``h2o``: H2O's heavy hitters, the blocks that have received the most attention so far.

Definition. Every query ``t`` (of query head ``h``) spreads a causal softmax (scale ``config.scale``) over the
keys in the cache when it is written: at the prefill over every key at positions ``<= t`` (nothing is evicted
before the first choice), during decode over the kept blocks and the tokens written since the previous choice, up
to ``t``. A block's score is the mass it has received from every query so far, summed over its keys, over those
queries and over the query heads of its key/value head (GQA): the accumulated attention. Mass received before a
block was evicted is forgotten with it; a block written since the previous choice starts from what the queries
since gave it. The budget rule keeps the sinks, the window and the ``keep - sinks - window`` blocks of most
accumulated mass, ties to the lower block index.

It needs every query: at :meth:`~topo_attn.eviction.EvictionPolicy.evict` the ``S`` queries of the prefill, at
:func:`~topo_attn.eviction.update` the queries of all the tokens written since (whose attention over the
compact cache, queries at its end, is their attention when they were written, since eviction happens only at a
choice). The accumulated mass of the kept blocks is carried to the next choice, so an update depends on the
history and is not a choice from scratch. Early blocks are seen by more queries, the bias H2O has too.
"""

from __future__ import annotations

from .policy import BlockScores, CacheView, EvictionConfig, EvictionPolicy, received_attention


def scores(view: CacheView, config: EvictionConfig) -> BlockScores:
    """The carried mass of the kept blocks (zero for the others) plus the mass from the view's queries:
    float64 ``[B, H_kv, m]``, carried on."""
    mass = received_attention(view.keys, view.queries, config.block_size, config.scale)
    if view.carry is not None:
        mass[..., :view.carry.shape[-1]] += view.carry
    return BlockScores(mass, mass)


POLICY = EvictionPolicy("h2o", "H2O: the most attention received from every query so far (heavy hitters)",
                        scores, query_aware=True, all_queries=True, carries=True)
