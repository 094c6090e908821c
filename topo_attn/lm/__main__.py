"""``python -m topo_attn.lm train|evaluate|research|passkey|corpus``: train the kit's byte-level language model,
evaluate a causal LM with every selector, try the topology-aware research selectors, answer the passkey probe
by generation through the decode path, or build the evaluation set and check a machine's files against a corpus
manifest (see :mod:`topo_attn.lm`)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
from types import ModuleType

from .. import cli
from ..notebooks import triton_mode
from .train import ModelShape, TrainSettings

PROG = "python -m topo_attn.lm"
SUBCOMMANDS = {"evaluate": "study", "research": "research", "passkey": "generation", "corpus": "corpus"}
"""The subcommands whose modules (of :mod:`topo_attn.lm`) parse their own command line (``build_parser``,
``main``)."""


def subcommand_module(name: str) -> ModuleType:
    """The module of subcommand ``name`` of :data:`SUBCOMMANDS` (imported when first needed)."""
    return importlib.import_module(f"{__package__}.{SUBCOMMANDS[name]}")


def option(field: str) -> str:
    """The command-line option of a settings field: ``eval_every`` -> ``--eval-every``."""
    return f"--{field.replace('_', '-')}"


def build_parser() -> argparse.ArgumentParser:
    """The whole command line, each subcommand with its real arguments (those of ``evaluate``, ``research``,
    ``passkey`` and ``corpus`` from their modules' parsers)."""
    parser = cli.ArgumentParser(prog=PROG, description=__doc__)
    cli.add_debug_argument(parser)
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train the byte-level model (a GPU; dense attention)")
    train.add_argument("--out", required=True, help="output folder (checkpoint, log, manifest, evaluation set)")
    for field in dataclasses.fields(TrainSettings):
        kind = {"max_minutes": float, "stop_after": int}.get(field.name, type(field.default))
        train.add_argument(option(field.name), type=kind, default=field.default)
    for field in dataclasses.fields(ModelShape):
        train.add_argument(option(field.name), type=type(field.default), default=field.default)
    train.add_argument("--device", default="cuda")
    train.add_argument("--max-shard-size", default="100MB", help="largest weights file (e.g. 15MB)")
    cli.add_progress_argument(train)
    cli.add_debug_argument(train)

    helps = {"evaluate": "perplexity, retrieval, recall and speed for every selector",
             "research": "recall of the topology-aware research selectors against the baselines",
             "passkey": "the passkey probe answered by generate() through the decode path",
             "corpus": "build the evaluation set (--out) or check this machine's files against a manifest (--check)"}
    for name in SUBCOMMANDS:
        module = subcommand_module(name)
        commands.add_parser(name, parents=[module.build_parser(add_help=False)], help=helps[name],
                            description=module.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    return parser


def check_train_args(args: argparse.Namespace) -> None:
    """Raise :class:`~topo_attn.cli.UsageError` for ``train`` values that would fail late (after the corpus is
    read) or unclearly: settings :func:`~topo_attn.lm.train.train` rejects, a model shape below 1, a device
    without CUDA."""
    from .study import check_device
    from .train import check_settings

    settings = TrainSettings(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainSettings)})
    try:
        check_settings(dataclasses.replace(settings, stop_after=settings.stop_after or None), option)
    except (ValueError, TypeError) as error:
        raise cli.UsageError(str(error)) from error
    for field in dataclasses.fields(ModelShape):
        if field.type in (int, "int"):
            cli.check_at_least(option(field.name), getattr(args, field.name), 1, field.name)
    check_device("--device", args.device)


def main(argv: list[str] | None = None) -> int:
    """The command line (``sys.argv[1:]`` when None): ``evaluate``, ``research``, ``passkey`` and ``corpus`` go
    to their modules' ``main`` with the rest of ``argv``; ``train`` trains here. Returns 0; raises
    :class:`~topo_attn.cli.UsageError` for a bad value."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] and argv[0] in SUBCOMMANDS:
        triton_mode()  # without a GPU, the kit's kernels run in Triton's interpreter (set before triton loads)
        return subcommand_module(argv[0]).main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "train":
        from .train import train as run_train

        check_train_args(args)
        triton_mode()
        values = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainSettings)}
        values["stop_after"] = values["stop_after"] or None  # --stop-after 0: run every step
        settings = TrainSettings(**values)
        shape = ModelShape(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ModelShape)})
        summary = run_train(args.out, settings, shape, device=args.device, max_shard_size=args.max_shard_size,
                            progress=args.progress)
        print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main, prog=PROG))
