"""``python -m topo_attn.lm train|native|evaluate|research|passkey|corpus|retrieval|eviction|greedy``: train the kit's
byte-level language model (with SDPA or, ``--attention``, the kit's sparse attention from the first step), train one
model per attention and compare them (native sparse training), evaluate a causal LM with every selector, try the
topology-aware research selectors, answer the passkey probe by generation through the decode path, build the
evaluation set and check a machine's files against a corpus manifest, score the RULER-style retrieval suite,
measure KV-cache eviction policies, or check the kit's dense decode's greedy tokens against SDPA's (see
:mod:`topo_attn.lm`)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from types import ModuleType

from .. import cli
from ..notebooks import triton_mode
from . import train as training
from .corpus import parse_roots

PROG = "python -m topo_attn.lm"
SUBCOMMANDS = {"native": "native", "evaluate": "study", "research": "research", "passkey": "generation",
               "corpus": "corpus", "retrieval": "retrieval_runner", "eviction": "eviction_runner",
               "greedy": "greedy"}
"""The subcommands whose modules (of :mod:`topo_attn.lm`) parse their own command line (``build_parser``,
``main``)."""


def subcommand_module(name: str) -> ModuleType:
    """The module of subcommand ``name`` of :data:`SUBCOMMANDS` (imported when first needed)."""
    return importlib.import_module(f"{__package__}.{SUBCOMMANDS[name]}")


option = training.option


def build_parser() -> argparse.ArgumentParser:
    """The whole command line, each subcommand with its real arguments (those of ``native``, ``evaluate``,
    ``research``, ``passkey``, ``corpus``, ``retrieval`` and ``eviction`` from their modules' parsers)."""
    parser = cli.ArgumentParser(prog=PROG, description=__doc__)
    cli.add_debug_argument(parser)
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train the byte-level model (a GPU; SDPA, or --attention SELECTOR "
                                              "--budget B: the kit's sparse attention from the first step)")
    train.add_argument("--out", required=True, help="output folder (checkpoint, log, manifest, evaluation set)")
    training.add_arguments(train)  # --attention (sdpa, dense or a selector), --budget (blocks; default n/8), ...
    train.add_argument("--device", default="cuda")
    train.add_argument("--root", action="append", default=None, metavar="KIND=PATH",
                       help="a corpus root (repeatable; default: this Python's standard library and packages)")
    train.add_argument("--max-shard-size", default="100MB", help="largest weights file (e.g. 15MB)")
    cli.add_progress_argument(train)
    cli.add_debug_argument(train)

    helps = {"native": "native sparse training: one model per attention at equal steps and seeds, compared with "
                       "the SDPA-trained model under the same selectors",
             "evaluate": "perplexity, retrieval, recall and speed for every selector",
             "research": "recall of the topology-aware research selectors against the baselines",
             "passkey": "the passkey probe answered by generate() through the decode path",
             "corpus": "build the evaluation set (--out) or check this machine's files against a manifest (--check)",
             "retrieval": "the RULER-style retrieval suite per task and distance, with 95%% intervals, without "
                          "look-ahead",
             "greedy": "where the kit's dense decode's greedy tokens first differ from SDPA's recipe",
             "eviction": "KV-cache eviction policies at a fixed budget of blocks: perplexity of the continuation, "
                         "retrieval and memory"}
    for name in SUBCOMMANDS:
        module = subcommand_module(name)
        commands.add_parser(name, parents=[module.build_parser(add_help=False)], help=helps[name],
                            description=module.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    return parser


def check_train_args(args: argparse.Namespace) -> None:
    """Raise :class:`~topo_attn.cli.UsageError` for ``train`` values that would fail late (after the corpus is
    read) or unclearly: settings :func:`~topo_attn.lm.train.train` rejects (a bad ``--attention`` or
    ``--budget`` among them), a model shape below 1, a device without CUDA, a bad ``--root``
    (:func:`~topo_attn.lm.train.check_arguments`)."""
    training.check_arguments(args, training.settings_from_args(args))
    parse_roots(args.root)


def main(argv: list[str] | None = None) -> int:
    """The command line (``sys.argv[1:]`` when None): ``native``, ``evaluate``, ``research``, ``passkey``,
    ``corpus``, ``retrieval`` and ``eviction`` go to their modules' ``main`` with the rest of ``argv``; ``train``
    trains here. Returns 0; raises :class:`~topo_attn.cli.UsageError` for a bad value."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] and argv[0] in SUBCOMMANDS:
        triton_mode()  # without a GPU, the kit's kernels run in Triton's interpreter (set before triton loads)
        return subcommand_module(argv[0]).main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "train":
        check_train_args(args)
        triton_mode()
        settings = training.settings_from_args(args)  # --stop-after 0: run every step
        summary = training.train(args.out, settings, training.shape_from_args(args), device=args.device,
                                 roots=parse_roots(args.root), max_shard_size=args.max_shard_size,
                                 progress=args.progress)
        print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main, prog=PROG))
