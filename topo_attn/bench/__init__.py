"""Benchmarks, run on a GPU with ``python -m topo_attn.bench --suite <suite>`` (the suites:
:data:`~topo_attn.bench.cases.SUITES`).

Modules, each importing only those listed before it: ``cases`` (:class:`Case`, the suites' cases),
``timing`` (the timer and the work count), ``results`` (reading the committed results in ``data/benchmarks/``,
and the commit of the code each records), one module per suite (``kernel`` for ``pr`` and ``llm``, ``build``,
``train``, ``select``, ``model`` (a transformers model's prefill through :mod:`topo_attn.integrations`; imports
transformers when it runs), ``decode``), and ``runner`` (the command line).
"""
