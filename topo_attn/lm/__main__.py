"""``python -m topo_attn.lm train|evaluate|research|passkey``: train the kit's byte-level language model,
evaluate a causal LM with every selector, try the topology-aware research selectors, or answer the passkey probe
by generation through the decode path (see :mod:`topo_attn.lm`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from ..notebooks import triton_mode
from .train import ModelShape, TrainSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m topo_attn.lm", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train the byte-level model (a GPU; dense attention)")
    train.add_argument("--out", required=True, help="output folder (checkpoint, log, manifest, evaluation set)")
    for field in dataclasses.fields(TrainSettings):
        kind = {"max_minutes": float, "stop_after": int}.get(field.name, type(field.default))
        train.add_argument(f"--{field.name.replace('_', '-')}", type=kind, default=field.default)
    for field in dataclasses.fields(ModelShape):
        train.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default)
    train.add_argument("--device", default="cuda")
    train.add_argument("--max-shard-size", default="100MB", help="largest weights file (e.g. 15MB)")

    commands.add_parser("evaluate", add_help=False,
                        help="perplexity, retrieval, recall and speed for every selector (its own --help)")
    commands.add_parser("research", add_help=False,
                        help="recall of the topology-aware research selectors against the baselines (its own --help)")
    commands.add_parser("passkey", add_help=False,
                        help="the passkey probe answered by generate() through the decode path (its own --help)")

    argv = sys.argv[1:] if argv is None else list(argv)
    triton_mode()  # without a GPU, the kit's kernels run in Triton's interpreter (set before triton loads)
    if argv[:1] == ["evaluate"]:
        from .study import main as evaluate_main
        return evaluate_main(argv[1:])
    if argv[:1] == ["research"]:
        from .research import main as research_main
        return research_main(argv[1:])
    if argv[:1] == ["passkey"]:
        from .generation import main as passkey_main
        return passkey_main(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "train":
        from .train import train as run_train

        values = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainSettings)}
        values["stop_after"] = values["stop_after"] or None  # --stop-after 0: run every step
        settings = TrainSettings(**values)
        shape = ModelShape(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ModelShape)})
        summary = run_train(args.out, settings, shape, device=args.device, max_shard_size=args.max_shard_size)
        print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
