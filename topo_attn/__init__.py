"""topo_attn: block-sparse causal attention whose key blocks are chosen by 0-dimensional persistent homology.

Layers, each importing only the ones below it: ``_checks`` (argument checks) < ``schedule`` (the CSR type) <
``rule`` (sinks + window + top-k) < ``attention`` (kernels, reference) and ``topology`` (persistence, the
schedule build) < ``selection`` (quality harness) < ``bench``, ``viz``, ``demo``, ``notebooks``. The benchmark
runner (``bench``) and the language-model study (``lm``) do not import each other: what both need lies below
them, the commit a result came from in ``provenance`` and the whole-model prefill timing in ``prefill_speed``.

Without a GPU, set ``TRITON_INTERPRET=1`` in the environment before triton is first imported (topo_attn imports
it on the first call of ``scheduled_attention``) to run the Triton kernel in Triton's interpreter on the CPU.
"""

from .attention import dense_masked_attention, forward_kernel, scheduled_attention
from .rule import SOURCE_NAMES
from .schedule import BlockSchedule, ScheduleCounts, dense_causal_schedule, num_blocks
from .topology import (block_centroids, block_salience, centroid_distances, minimum_spanning_tree,
                       persistence_barcode, schedule_from_salience, schedule_sources, top_salient_blocks,
                       topology_schedule)

__version__ = "0.1.0"

__all__ = [
    "SOURCE_NAMES",
    "BlockSchedule",
    "ScheduleCounts",
    "block_centroids",
    "block_salience",
    "centroid_distances",
    "dense_causal_schedule",
    "dense_masked_attention",
    "forward_kernel",
    "minimum_spanning_tree",
    "num_blocks",
    "persistence_barcode",
    "schedule_from_salience",
    "schedule_sources",
    "scheduled_attention",
    "top_salient_blocks",
    "topology_schedule",
]
