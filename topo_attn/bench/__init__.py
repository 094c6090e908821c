"""Benchmarks, run on a GPU with ``python -m topo_attn.bench --suite pr|llm|build|train|select`` (``runner``), one
module per suite, and the reading of their committed results (``results``)."""
