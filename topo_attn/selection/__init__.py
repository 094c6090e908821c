"""Selection quality: how much of full causal attention a block schedule keeps, and the selectors to compare.

``metrics`` (recall and output errors against full attention, the true block mass), ``selectors`` (score
functions and equal-budget schedules on the rule's base mask), ``compare`` (every selector at every budget, and
a verdict), ``data`` (synthetic and captured real inputs), ``incremental`` (selection for queries at the end of a
growing key cache, from per-block statistics kept as the cache grows). ``python -m topo_attn.selection`` prints
the summary.
"""

from .compare import compare_selectors, verdict
from .data import REAL_QKV, load_real_qkv, synthetic_qkv
from .incremental import INCREMENTAL_SELECTORS, KeyBlockStats, select_for_queries
from .metrics import (DEFAULT_CHUNK, QualityMetrics, Reference, block_attention_mass, full_attention,
                      schedule_quality)
from .selectors import (DESCRIPTIONS, QUERY_AWARE, SELECTORS, TOPOLOGY_AWARE, candidate_counts, centroid_scores,
                        cluster_centroid_scores, cluster_scores, mst_clusters, oracle_scores, previous_row_scores,
                        quest_scores, random_scores, schedule_from_scores, select, topology_scores, window_scores)

__all__ = ["DEFAULT_CHUNK", "DESCRIPTIONS", "INCREMENTAL_SELECTORS", "QUERY_AWARE", "REAL_QKV", "SELECTORS",
           "TOPOLOGY_AWARE", "KeyBlockStats", "QualityMetrics", "Reference", "block_attention_mass",
           "candidate_counts", "centroid_scores", "cluster_centroid_scores", "cluster_scores", "compare_selectors",
           "full_attention", "load_real_qkv", "mst_clusters", "oracle_scores", "previous_row_scores",
           "quest_scores", "random_scores", "schedule_from_scores", "schedule_quality", "select",
           "select_for_queries", "synthetic_qkv", "topology_scores", "verdict", "window_scores"]
