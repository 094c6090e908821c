"""``python -m topo_attn.bench``: the benchmark runner (:func:`topo_attn.bench.runner.main`)."""
from .runner import main

raise SystemExit(main())
