"""The schedule build on the GPU, in Triton kernels: block centroids (``centroids``); the elder-rule saliences
(``salience``, orchestrating ``distances``, ``boruvka``, ``prim``, ``prim_order`` and ``elder``); the rule's
CSR rows (``rows``); all of them captured in a CUDA graph (``graph``) and chained by programmatic dependent
launch on Hopper (``pdl``). :mod:`topo_attn.topology.build` calls them; they import nothing from the host layer
and report bad input as flags that the caller turns into errors. Triton is imported by these modules, so import
them on first use only.

Imports point down: ``graph`` -> ``centroids``, ``rows``, ``salience``; ``salience`` -> ``boruvka``, ``prim``,
``prim_order``, ``elder``; ``boruvka`` and ``prim`` -> ``distances``; ``prim`` -> ``elder``; every kernel module
-> ``pdl``.
"""

MAX_BLOCKS = 4096
"""Most key blocks per lane that the GPU kernels take (Prim's per-block state lives in registers); CUDA inputs
with more blocks are computed on the CPU."""
