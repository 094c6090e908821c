"""Connections of the kit to other libraries, each imported explicitly by its users (importing this package
imports none of them, nor the libraries they connect to).

- :mod:`topo_attn.integrations.transformers`: an attention backend for Hugging Face transformers (>= 5):
  ``register(...)`` returns an ``attn_implementation`` name under which a model runs its prefill and training
  forwards through :func:`topo_attn.scheduled_attention` with schedules built per layer by a selector of
  :mod:`topo_attn.selection`, and its decode steps (fewer queries than keys) sparsely through the split-K decode
  kernel. Needs the optional extra ``lm`` (``pip install topo_attn[lm]``).
- :mod:`topo_attn.integrations.cache`: ``TopoCache``, a transformers ``DynamicCache`` that keeps per-block key
  statistics for decode-time selection (importing it imports transformers).

This is the top layer of the package: it imports ``attention``, ``schedule``, ``selection`` and ``_checks``;
nothing imports it but the whole-model prefill timing (:mod:`topo_attn.prefill_speed`, which the benchmark's
``model`` suite and the language-model study share), inside its functions, and :mod:`topo_attn.lm`.
"""
