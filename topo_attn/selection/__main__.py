"""``python -m topo_attn.selection``: the selection-quality summary (every selector at equal budget) on a synthetic
key set and on the captured real q, k, v; the defaults are ``notebooks/05_selection_quality.ipynb``'s. The tables
and verdicts go to stdout; while they are computed, a progress bar on stderr names the selector and budget
that run when stderr is a terminal (``--progress`` / ``--no-progress`` force it on or off)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

import numpy as np

from .. import cli, samples
from .compare import compare_selectors, verdict
from .data import load_real_qkv, synthetic_qkv
from .selectors import SELECTORS

PROG = "python -m topo_attn.selection"

def _print_table(rows: Sequence[Mapping]) -> None:
    """One line per (selector, budget), lane means, budget-major in :data:`SELECTORS` order."""
    groups: dict[tuple[str, int], list[Mapping]] = {}
    for r in rows:
        groups.setdefault((r["selector"], int(r["budget"])), []).append(r)
    print(f"{'selector':<18}{'budget':>7}{'blocks/row':>11}{'recall':>9}{'rel_l2':>9}{'cos_err':>9}{'lse_err':>9}")
    for (name, budget), sel in sorted(groups.items(), key=lambda kv: (kv[0][1], list(SELECTORS).index(kv[0][0]))):
        m = {key: float(np.mean([float(r[key]) for r in sel])) for key in
             ("blocks_per_row", "recall", "rel_l2", "cos_err", "lse_err")}
        print(f"{name:<18}{budget:>7}{m['blocks_per_row']:>11.2f}{m['recall']:>9.4f}{m['rel_l2']:>9.4f}"
              f"{m['cos_err']:>9.4f}{m['lse_err']:>9.4f}")


def build_parser() -> argparse.ArgumentParser:
    """The harness's command line."""
    parser = cli.ArgumentParser(prog=PROG, description="Selection quality of every selector at equal budget.")
    parser.add_argument("--budgets", type=int, nargs="+", default=[1, 2, 4, 8],
                        help="extra key blocks per query block (>= 0)")
    parser.add_argument("--report-budget", type=int, default=4, help="the budget of the verdicts (one of --budgets)")
    parser.add_argument("--key-set", default="outliers",
                        help=f"sample key set for the synthetic set (one of {', '.join(samples.key_set_names())})")
    parser.add_argument("--block-size", type=int, default=32, help="for the synthetic set")
    parser.add_argument("--real-block-size", type=int, default=16)
    parser.add_argument("--sinks", type=int, default=1)
    parser.add_argument("--window", type=int, default=1)
    parser.add_argument("--clusters", type=int, default=4)
    cli.add_progress_argument(parser)
    cli.add_debug_argument(parser)
    return parser


def check_args(args: argparse.Namespace) -> None:
    """Raise :class:`~topo_attn.cli.UsageError` for a value that the harness would reject only after minutes."""
    cli.check_at_least("--budgets", args.budgets, 0, "budget")
    if args.report_budget not in args.budgets:
        raise cli.UsageError(f"argument --report-budget: {args.report_budget} is not among --budgets "
                             f"{args.budgets}; expected one of them")
    cli.check_at_least("--block-size", args.block_size, 1)
    cli.check_at_least("--real-block-size", args.real_block_size, 1)
    cli.check_at_least("--sinks", args.sinks, 0)
    cli.check_at_least("--window", args.window, 0)
    cli.check_at_least("--clusters", args.clusters, 1)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the tables and verdicts; ``argv`` as for the command line (``sys.argv[1:]`` when None). Returns 0.
    Raises :class:`~topo_attn.cli.UsageError` for a bad value (before any work)."""
    args = build_parser().parse_args(argv)
    check_args(args)
    progress = cli.progress_enabled(args.progress)
    common = dict(sinks=args.sinks, window=args.window, clusters=args.clusters)
    keys = cli.check_option("--key-set", lambda: samples.load_key_set(args.key_set))
    real_q, real_k, real_v, info = load_real_qkv()  # a missing file fails here, before any work
    q, k, v = synthetic_qkv(keys, args.block_size, seed=0, sharpness=0.5)
    rows = compare_selectors(q, k, v, args.block_size, args.budgets,
                             progress=progress and f"synthetic {args.key_set}", **common)
    print(f"synthetic: key set {args.key_set!r} {tuple(k.shape)}, blocks of {args.block_size}")
    _print_table(rows)
    print(verdict(rows, args.report_budget))
    q, k, v = real_q, real_k, real_v
    rows = compare_selectors(q, k, v, args.real_block_size, args.budgets, per_lane=True,
                             progress=progress and f"real {info['model']}", **common)
    print(f"\nreal: {info['model']} ({info['package']} {info['package_version']}), layers {info['layers']}, "
          f"q/k/v {tuple(q.shape)}, blocks of {args.real_block_size}; mean over layers and heads")
    _print_table(rows)
    print(verdict(rows, args.report_budget))
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main, prog=PROG))
