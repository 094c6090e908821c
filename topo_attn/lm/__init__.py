"""The kit's byte-level causal language model and the evaluation of selectors on it.

``corpus`` (the Python sources this machine has, split by a hash of each file's name), ``probe`` (the passkey
probe: a key line copied from far back), ``training_copies`` (the copy content of training windows: the retrieval
tasks in their training formats), ``evaluate`` (loss by position, bits per byte, passkey scores), ``train``
(``python -m topo_attn.lm train``, with SDPA or the kit's sparse attention from the first step), ``native``
(``python -m topo_attn.lm native``: one model trained per attention, compared with the SDPA-trained one under
the same selectors), ``study``
(``python -m topo_attn.lm evaluate``: every selector at several budgets), ``token_attention`` (per-token
selection), ``research`` (topology-aware selector ideas), ``generation`` (``python -m topo_attn.lm passkey``: the
passkey probe answered by ``generate()`` through the decode path), ``retrieval`` (RULER-style probes),
``value_confusion`` (which value of a key a model looks up in ``multi_value``), ``intervals`` (95% intervals),
``retrieval_runner`` (``python -m topo_attn.lm retrieval``: the retrieval suite scored per task, distance and
attention), ``evicted_model`` (a model scored with its key/value cache evicted by a policy of
:mod:`topo_attn.eviction`), ``eviction_runner`` (``python -m topo_attn.lm eviction``: the eviction policies at fixed
budgets), ``greedy`` (``python -m topo_attn.lm greedy``: where the kit's dense decode's greedy tokens first differ
from SDPA's recipe), ``results`` (the result files of these commands and their loaders and tables). Needs
transformers (the ``lm`` extra; ``results`` does not); ``import topo_attn`` does not import this package. It does
not import the benchmark runner (``topo_attn.bench``).
"""
