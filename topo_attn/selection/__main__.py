"""``python -m topo_attn.selection``: the selection-quality summary (every selector at equal budget) on a synthetic
key set and on the captured real q, k, v; the defaults are ``notebooks/05_selection_quality.ipynb``'s. The tables
and verdicts go to stdout; while they are computed, a progress bar on stderr names the selector and budget
that run (``--no-progress`` turns it off)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

import numpy as np

from .. import samples
from .compare import compare_selectors, verdict
from .data import load_real_qkv, synthetic_qkv
from .selectors import SELECTORS


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


def main(argv: Sequence[str] | None = None) -> None:
    """Print the tables and verdicts; ``argv`` as for the command line (``sys.argv[1:]`` when None)."""
    parser = argparse.ArgumentParser(prog="python -m topo_attn.selection",
                                     description="Selection quality of every selector at equal budget.")
    parser.add_argument("--budgets", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--report-budget", type=int, default=4)
    parser.add_argument("--key-set", default="outliers")
    parser.add_argument("--block-size", type=int, default=32, help="for the synthetic set")
    parser.add_argument("--real-block-size", type=int, default=16)
    parser.add_argument("--sinks", type=int, default=1)
    parser.add_argument("--window", type=int, default=1)
    parser.add_argument("--clusters", type=int, default=4)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    args = parser.parse_args(argv)
    common = dict(sinks=args.sinks, window=args.window, clusters=args.clusters)
    q, k, v = synthetic_qkv(samples.load_key_set(args.key_set), args.block_size, seed=0, sharpness=0.5)
    rows = compare_selectors(q, k, v, args.block_size, args.budgets,
                             progress=not args.no_progress and f"synthetic {args.key_set}", **common)
    print(f"synthetic: key set {args.key_set!r} {tuple(k.shape)}, blocks of {args.block_size}")
    _print_table(rows)
    print(verdict(rows, args.report_budget))
    q, k, v, info = load_real_qkv()
    rows = compare_selectors(q, k, v, args.real_block_size, args.budgets, per_lane=True,
                             progress=not args.no_progress and f"real {info['model']}", **common)
    print(f"\nreal: {info['model']} ({info['package']} {info['package_version']}), layers {info['layers']}, "
          f"q/k/v {tuple(q.shape)}, blocks of {args.real_block_size}; mean over layers and heads")
    _print_table(rows)
    print(verdict(rows, args.report_budget))


if __name__ == "__main__":
    main()
