"""Topology: key-block centroids, the 0-dimensional persistence of their Rips filtration (minimum spanning tree,
elder-rule salience, barcode) and the topology schedule built from it. ``persistence`` is the exact CPU path,
``gpu`` the Triton kernels, ``build`` picks between them."""

from ..rule import SINK, SKIPPED, SOURCE_NAMES, TOPOLOGY, WINDOW
from .build import (block_centroids, block_salience, key_block_salience, schedule_from_salience, schedule_sources,
                    topology_schedule)
from .persistence import centroid_distances, minimum_spanning_tree, persistence_barcode, top_salient_blocks

__all__ = ["SINK", "SKIPPED", "SOURCE_NAMES", "TOPOLOGY", "WINDOW", "block_centroids", "block_salience",
           "centroid_distances", "key_block_salience", "minimum_spanning_tree", "persistence_barcode",
           "schedule_from_salience", "schedule_sources", "top_salient_blocks", "topology_schedule"]
