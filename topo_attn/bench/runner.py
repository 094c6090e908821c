"""Benchmark runner: ``python -m topo_attn.bench --suite pr|llm|build|train|select|model|decode|generate|step|host``.

Runs the cases of one suite (:data:`~topo_attn.bench.cases.SUITES`) on a CUDA GPU, one module per suite:
``kernel`` (``pr``, ``llm``), ``build``, ``train``, ``select``, ``model``, ``decode`` (one query token
against a 32k / 128k key/value cache, the kit's decode path against SDPA and FlexAttention, with the HBM
bandwidth reached and the suite's goals), ``generate`` (time per token of greedy ``generate()`` with a static
cache and the compiled step, against transformers' own recipe), ``step`` (one layer's decode step over a static
cache: each selector's one-launch update and table, as CUDA-graph replays, next to the decode it serves), ``host``
(one layer's host time split into selection, kernel and the backend's own work, next to SDPA's), with a
progress bar on stderr naming the case that runs when stderr is a terminal (``--progress`` / ``--no-progress``
force it on or off; ``--no-flex`` leaves FlexAttention out of ``llm``, ``train``, ``model`` and ``decode``).
Prints the suite's markdown table on stdout and writes JSON (the GPU, the torch, triton and transformers
versions, the exact command, the date, the commit of the code with whether ``topo_attn/`` had uncommitted changes
(:func:`~topo_attn.provenance.run_record`, taken as the run starts), the optional note, the rows of every case
(one per case, or one per implementation in ``model``, per timed path in ``decode`` and per selector in ``step``)
and the table) to
``--out`` or ``data/benchmarks/<suite>_<gpu>.json`` in the repository (:data:`~topo_attn.bench.results.RESULTS_DIR`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import torch

from .. import cli
from ..prefill_speed import COMPILE_MODES, calls_median_ms
from ..provenance import run_record
from ..selection import names
from .build import build_markdown, run_build_case
from .cases import SUITES, Case
from .decode import decode_markdown, peak_tbps_for, quest_step, run_decode_case
from .generate import generate_markdown, run_generate_case
from .host import host_markdown, run_host_case
from .kernel import kernel_markdown, run_kernel_case
from .model import model_markdown, run_model_case
from .results import RESULTS_DIR
from .select import run_select_case, select_markdown
from .step import run_step_case, step_markdown
from .timing import graph_median_ms, median_ms
from .train import run_train_case, train_markdown

__all__ = ["SUITES", "build_parser", "main", "run_cases"]
PROG = "python -m topo_attn.bench"

MODEL_SELECTORS = ("dense",) + names("block")
"""The ``--selectors`` choices: the kit's dense row and every whole-sequence selector."""
GENERATE_SELECTORS = ("dense",) + tuple(n for n in names("step", static_step=True) if n != "window")
"""What ``--selectors`` may name for the generate suite: the kit's dense rows and each selector with a
fixed-shape decode step (its default rows)."""
MERGES = ("separate", "kernel")
"""The generate suite's ``--merges``: the kit's decode with two launches, or with the merge in one."""
DISPLAY_FLAGS = ("--no-progress", "--progress", "--debug")
"""Flags that change only what is shown while the runner works: left out of the command stored with the results."""


def run_cases(cases: Sequence[Case], run_case: Callable[[Case], dict | list[dict]], progress: bool | None = True,
              description: str | None = None,
              after_case: Callable[[list[dict], int], None] | None = None) -> list[dict]:
    """The rows of ``run_case(case)`` for each of ``cases``, in order; a case may give one row (a dict) or
    several (a list of dicts). With ``progress``, a tqdm bar on stderr counts the cases, shows
    ``description`` and names the case that runs; it is cleared when the cases are done, and nothing is
    written to stdout; ``progress=None``: a bar only when stderr is a terminal (:func:`topo_attn.cli.progress_enabled`).
    ``after_case(rows, cases_done)`` is called with the rows so far after each case."""
    from tqdm import tqdm

    rows: list[dict] = []
    with tqdm(total=len(cases), desc=description, unit="case", file=sys.stderr, leave=False,
              disable=not cli.progress_enabled(progress)) as bar:
        for done, case in enumerate(cases, 1):
            bar.set_postfix_str(case.name)
            found = run_case(case)
            rows.extend(found if isinstance(found, list) else [found])
            if after_case is not None:
                after_case(rows, done)
            bar.update()
    return rows


def build_parser() -> argparse.ArgumentParser:
    """The runner's command line."""
    parser = cli.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="llm")
    parser.add_argument("--cases", nargs="*", help="only cases whose name contains one of these strings")
    parser.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compilation is slow)")
    parser.add_argument("--selectors", nargs="+", default=None, choices=MODEL_SELECTORS,
                        help="model and generate suites: only these selectors' rows ('dense': the kit's dense "
                             "row) next to the floor and sdpa or the recipe (default: all)")
    parser.add_argument("--merges", nargs="+", default=None, choices=MERGES,
                        help="generate suite: the kit's rows with only these decode merges (default: both)")
    parser.add_argument("--compile", choices=COMPILE_MODES, default=None, dest="compile_mode",
                        help="model suite: time every row on torch.compile(model.forward, mode=...) (no "
                             "FlexAttention row; selectors whose schedules wait for the host skipped)")
    parser.add_argument("--note", default=None, help="a note stored with the results (the commit is stored anyway)")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON path (default data/benchmarks/<suite>_<gpu>.json)")
    cli.add_progress_argument(parser)
    parser.add_argument("--timer", choices=("eager", "graph"), default="eager",
                        help="decode suite: time each call eagerly (host launch path included) or as a CUDA graph "
                             "replay (the GPU's time, as a captured decode loop runs it)")
    cli.add_debug_argument(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the chosen suite and write its results. Returns the exit
    status: 0, or 2 (with a message on stderr) without a CUDA GPU. Raises :class:`~topo_attn.cli.UsageError`
    when ``--cases`` matches no case of the suite."""
    args = build_parser().parse_args(argv)
    cases = [c for c in SUITES[args.suite] if not args.cases or any(s in c.name for s in args.cases)]
    if not cases:
        raise cli.UsageError(f"argument --cases: {' '.join(args.cases)} matches no case of suite {args.suite}; "
                             f"its cases are {', '.join(c.name for c in SUITES[args.suite])}")
    if args.selectors is not None and args.suite not in ("model", "generate"):
        raise cli.UsageError(f"argument --selectors: applies to the model and generate suites only, not to suite "
                             f"{args.suite}")
    if args.suite == "generate" and args.selectors is not None:
        other = [s for s in args.selectors if s not in GENERATE_SELECTORS]
        if other:
            raise cli.UsageError(f"argument --selectors: the generate suite runs {list(GENERATE_SELECTORS)}, got "
                                 f"{other}")
    if args.compile_mode is not None and args.suite != "model":
        raise cli.UsageError(f"argument --compile: applies to the model suite only, not to suite {args.suite}")
    if args.merges is not None and args.suite != "generate":
        raise cli.UsageError(f"argument --merges: applies to the generate suite only, not to suite {args.suite}")
    if not torch.cuda.is_available():
        print(f"{PROG}: error: the benchmark runner needs a CUDA GPU; committed results are in data/benchmarks/",
              file=sys.stderr)
        return 2
    given = argv if argv is not None else sys.argv[1:]
    command = "python -m topo_attn.bench " + " ".join(a for a in given if a not in DISPLAY_FLAGS)
    header = run_record("cuda", command.strip())  # the code as the run starts
    gpu = header["gpu"]
    print(f"{gpu}, torch {header['torch']}, triton {header['triton']}", file=sys.stderr)

    def run_case(case: Case) -> dict | list[dict]:
        if args.suite == "build":
            found = run_build_case(case, median_ms)
        elif args.suite == "train":
            found = run_train_case(case, median_ms, with_flex=not args.no_flex)
        elif args.suite == "select":
            found = run_select_case(case, median_ms)
        elif args.suite == "model":  # a long case keeps its rows so far (the file is rewritten after each)
            found = run_model_case(case, calls_median_ms, with_flex=not args.no_flex,
                                   after_row=lambda part: write(finished + part, cases_done, case.name),
                                   selectors=None if args.selectors is None else tuple(args.selectors),
                                   compile=None if args.compile_mode is None
                                   else partial(torch.compile, mode=args.compile_mode))
        elif args.suite == "generate":  # like the model suite, a long case keeps its rows so far
            chosen = args.selectors
            found = run_generate_case(
                case, selectors=None if chosen is None else tuple(s for s in chosen if s != "dense"),
                dense=chosen is None or "dense" in chosen, merges=tuple(args.merges or MERGES),
                after_row=lambda part: write(finished + part, cases_done, case.name))
        elif args.suite == "step":
            found = run_step_case(case, graph_median_ms)
        elif args.suite == "host":
            found = run_host_case(case)
        elif args.suite == "decode":
            timer = graph_median_ms if args.timer == "graph" else median_ms
            found = run_decode_case(case, timer, with_flex=not args.no_flex, select_step=quest_step(case),
                                    select_timer=median_ms, peak_tbps=peak_tbps_for(torch.cuda.get_device_name()))
            for row in found:
                row["timer"] = "cuda graph replay" if args.timer == "graph" else "eager"
        else:
            found = run_kernel_case(case, args.suite, median_ms, with_flex=not args.no_flex)
        torch.cuda.empty_cache()
        return found

    tables = {"build": build_markdown, "train": train_markdown, "select": select_markdown, "model": model_markdown,
              "decode": decode_markdown, "generate": generate_markdown, "step": step_markdown, "host": host_markdown}
    slug = gpu.replace("NVIDIA ", "").replace(" ", "-").lower()
    out = args.out or RESULTS_DIR / f"{args.suite}_{slug}.json"
    out.parent.mkdir(parents=True, exist_ok=True)

    def write(rows: list[dict], done: int, running: str | None = None) -> str:
        """The results file with the rows of the first ``done`` cases, and those of case ``running`` so far
        (rewritten after every case, and after every row of a model or generate case: a run cut short keeps them, marked
        ``partial``); returns the table."""
        table = tables[args.suite](rows) if args.suite in tables else kernel_markdown(rows, args.suite)
        result = dict(suite=args.suite, **header, rows=rows, table=table)
        if done < len(cases):
            result["partial"] = f"{done} of {len(cases)} cases so far" + (
                f", and the rows of {running} done so far" if running else "")
        if args.note:
            result["note"] = args.note
        out.write_text(json.dumps(result, indent=1))
        return table

    finished: list[dict] = []  # the rows of the cases done, and how many
    cases_done = 0

    def after_case(rows: list[dict], done: int) -> None:
        nonlocal cases_done
        finished[:], cases_done = rows, done
        write(rows, done)

    rows = run_cases(cases, run_case, progress=args.progress, description=f"suite {args.suite}",
                     after_case=after_case)
    print(write(rows, len(cases)))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main, prog=PROG))
