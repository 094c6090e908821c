"""Selection: which key blocks each query block visits, and how much of full causal attention that keeps.

One module per selector (``window``, ``random``, ``topology_22``, ``topology``, ``centroid``, ``quest``,
``cluster``, ``cluster_centroid``, ``oracle``), each describing itself with a
:class:`~topo_attn.selection.selector.Selector` (its score functions over a whole sequence, at the end of a
cache, per token), collected by ``registry``. ``selectors`` selects over a whole sequence (:func:`select`),
``incremental`` for queries at the end of a growing key cache (:func:`select_for_queries`, from per-block
statistics kept as the cache grows), ``static_step`` for one query at the end of a preallocated cache in fixed
shapes (:func:`step_block_table` over :class:`StaticBlockStats`, the length a device tensor; ``kept_salience``
the salience such a step keeps for ``topology``, ``static_quality`` what that costs against the exact one); all
rank with ``topk`` and build the CSR by arithmetic
(:func:`topo_attn.rule.budget_schedule`), without a host sync. ``stats`` holds the block statistics, ``metrics``
recall and output errors against full attention, ``compare`` every selector at every budget and a verdict,
``data`` synthetic and captured real inputs. ``python -m topo_attn.selection`` prints the summary.
"""

from .cluster import mst_clusters
from .compare import compare_selectors, verdict
from .data import REAL_QKV, load_real_qkv, synthetic_qkv
from .incremental import INCREMENTAL_SELECTORS, KeyBlockStats, select_for_queries
from .metrics import (DEFAULT_CHUNK, QualityMetrics, Reference, block_attention_mass, full_attention,
                      schedule_quality)
from .registry import SELECTORS, names
from .selector import Selector
from .static_step import STATIC_SELECTORS, StaticBlockStats, step_block_table
from .selectors import (DESCRIPTIONS, QUERY_AWARE, TOPOLOGY_AWARE, block_scores, candidate_counts,
                        previous_row_scores, schedule_from_scores, select)

__all__ = ["DEFAULT_CHUNK", "DESCRIPTIONS", "INCREMENTAL_SELECTORS", "QUERY_AWARE", "REAL_QKV", "SELECTORS",
           "STATIC_SELECTORS", "TOPOLOGY_AWARE", "KeyBlockStats", "QualityMetrics", "Reference", "Selector",
           "StaticBlockStats", "block_attention_mass", "block_scores", "candidate_counts", "compare_selectors",
           "full_attention", "load_real_qkv", "mst_clusters", "names", "previous_row_scores",
           "schedule_from_scores", "schedule_quality", "select", "select_for_queries", "step_block_table",
           "synthetic_qkv", "verdict"]
