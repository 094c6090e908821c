"""Benchmarks, run on a GPU with ``python -m topo_attn.bench --suite pr|llm|build|train|select``.

Modules, each importing only those listed before it: ``cases`` (:class:`Case`, the suites' cases),
``timing`` (the timer and the work count), ``results`` (reading the committed results in ``data/benchmarks/``,
and the commit of the code each records), one module per suite (``kernel`` for ``pr`` and ``llm``, ``build``,
``train``, ``select``), and ``runner`` (the command line).
"""
