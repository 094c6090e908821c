"""Benchmark runner: ``python -m topo_attn.bench --suite pr|llm|build|train|select``.

Runs the cases of one suite (:data:`~topo_attn.bench.cases.SUITES`) on a CUDA GPU, one module per suite:
``kernel`` (``pr``, ``llm``), ``build``, ``train``, ``select``. Prints the suite's markdown table and writes JSON
(the GPU, the torch and triton versions, the exact command, the date, the optional note, one row per case and
the table) to ``--out`` or ``data/benchmarks/<suite>_<gpu>.json`` in the repository
(:data:`~topo_attn.bench.results.RESULTS_DIR`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from .build import build_markdown, run_build_case
from .cases import SUITES
from .kernel import kernel_markdown, run_kernel_case
from .results import RESULTS_DIR
from .select import run_select_case, select_markdown
from .timing import median_ms
from .train import run_train_case, train_markdown

__all__ = ["SUITES", "main"]


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the chosen suite and write its results. Returns the exit
    status: 0, or 2 (with a message on stderr) without a CUDA GPU."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="llm")
    parser.add_argument("--cases", nargs="*", help="only cases whose name contains one of these strings")
    parser.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compilation is slow)")
    parser.add_argument("--note", default=None, help="a note stored with the results (e.g. the commit measured)")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON path (default data/benchmarks/<suite>_<gpu>.json)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("the benchmark runner needs a CUDA GPU; committed results are in data/benchmarks/", file=sys.stderr)
        return 2
    import triton

    cases = [c for c in SUITES[args.suite] if not args.cases or any(s in c.name for s in args.cases)]
    gpu = torch.cuda.get_device_name()
    print(f"{gpu}, torch {torch.__version__}, triton {triton.__version__}", file=sys.stderr)
    rows = []
    for i, case in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] {case.name} ...", file=sys.stderr, flush=True)
        if args.suite == "build":
            rows.append(run_build_case(case, median_ms))
        elif args.suite == "train":
            rows.append(run_train_case(case, median_ms, with_flex=not args.no_flex))
        elif args.suite == "select":
            rows.extend(run_select_case(case, median_ms))
        else:
            rows.append(run_kernel_case(case, args.suite, median_ms, with_flex=not args.no_flex))
        torch.cuda.empty_cache()
    tables = {"build": build_markdown, "train": train_markdown, "select": select_markdown}
    table = tables[args.suite](rows) if args.suite in tables else kernel_markdown(rows, args.suite)
    print(table)
    command = "python -m topo_attn.bench " + " ".join(argv if argv is not None else sys.argv[1:])
    result = dict(suite=args.suite, gpu=gpu, torch=torch.__version__, triton=triton.__version__,
                  command=command.strip(), date=time.strftime("%Y-%m-%d"), rows=rows, table=table)
    if args.note:
        result["note"] = args.note
    slug = gpu.replace("NVIDIA ", "").replace(" ", "-").lower()
    out = args.out or RESULTS_DIR / f"{args.suite}_{slug}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
