"""``python -m topo_attn.bench``: the benchmark runner (:func:`topo_attn.bench.runner.main`)."""
from .. import cli
from .runner import PROG, build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    raise SystemExit(cli.run(main, prog=PROG))
