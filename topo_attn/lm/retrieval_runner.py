"""``python -m topo_attn.lm retrieval``: the RULER-style retrieval suite (:mod:`.retrieval`) scored for ``sdpa``,
the kit's ``dense`` and each selector at each budget, without look-ahead.

For a model folder (default ``data/lm``) and its held-out documents (``eval_set.npz``, loaded as
``python -m topo_attn.lm evaluate`` loads them), per task of ``--tasks`` and distance of ``--distances``,
``--probes`` probes are built (:func:`~topo_attn.lm.retrieval.probe_set`, seeded by ``--seed``) in the task's
**held-out** line formats (:func:`~topo_attn.lm.retrieval.held_out_formats`), into the held-out documents as
filler, each probe as long as the documents. ``--formats training`` builds them in the training formats instead,
a diagnostic that separates a model that cannot retrieve from one that cannot read a new format (``format_kind``
and ``dense_gate.formats`` say which; the gate counts for held-out formats only). ``single_needle`` gets
``budget = max(--budgets)`` and ``--block-size``, so its decoys outnumber every budget's blocks.

Scoring: exact match of the answer under greedy prediction (:func:`~topo_attn.lm.evaluate.passkey_scores`:
every byte of the answer is the model's most likely next byte given the true bytes before it). Selectors run
at token granularity (:mod:`topo_attn.lm.token_attention`: each query token chooses its key blocks from its own
query among the complete blocks before its own, as a decode step does), so no position's prediction depends on
a later byte; ``sdpa`` and ``dense`` attend to every earlier byte.

Each row (``rows`` in the JSON) is one cell: ``task``, ``distance``, ``attention`` (``sdpa``, ``dense`` or the
selector), ``selector`` (None for ``sdpa`` and ``dense``), ``budget`` (None for them), ``accuracy``, ``n`` (the
probes of the cell), ``ci_low`` and ``ci_high`` (the 95% percentile bootstrap interval,
:func:`~topo_attn.lm.intervals.bootstrap_interval`, a single point when every probe of the cell agrees),
``wilson_low`` and ``wilson_high`` (the 95% Wilson interval, :func:`~topo_attn.lm.intervals.wilson_interval`,
the one to quote for such cells), ``dense_reaches_90`` (whether ``dense`` answers at least 90% of this task
and distance: the issue's condition before selectors are compared) and, for selectors, ``minus_dense``,
``minus_dense_low``, ``minus_dense_high`` (the accuracy minus dense's on the same probes, with its 95% paired
bootstrap interval, :func:`~topo_attn.lm.intervals.paired_difference`). ``lookup_accuracy`` and
``copy_accuracy`` split a miss: the fraction of the cell's answer bytes that start a value (found by its key,
:attr:`~topo_attn.lm.probe.Passkey.lookups`) and of the other answer bytes (continued from the byte before)
that the model predicts right. ``dense_gate`` sums the condition up.
Written as JSON after every configuration from ``dense`` on (``complete``: whether all of them ran, ``missing``:
the others), so a run stopped by a time limit keeps what it measured (``--out``;
``data/benchmarks/lm_retrieval_<gpu>.json``), with the GPU, versions, command and commit;
:func:`topo_attn.lm.results.load_lm_retrieval` reads it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from .. import cli
from ..provenance import run_record
from . import intervals
from .evaluate import passkey_scores
from .results import LM_RETRIEVAL_SUITE
from .retrieval import TASKS, held_out_formats, probe_set, training_formats
from .study import (add_common_arguments, check_common_arguments, eval_set_path, load_documents, load_model,
                    use_attention)
from .token_attention import TOKEN_SELECTORS
from .train import probe_distances

PROG = "python -m topo_attn.lm retrieval"
DEFAULT_SELECTORS = tuple(s for s in ("centroid", "quest", "oracle", "topology") if s in TOKEN_SELECTORS)
DEFAULT_BUDGETS = (6, 30)
DENSE_THRESHOLD = 0.9
"""The accuracy ``dense`` must reach on every task at every distance before selectors are compared."""
INTERVAL = ("ci_low, ci_high: 95% percentile bootstrap (topo_attn.lm.intervals.bootstrap_interval, 10000 "
            "resamples, seed 0); wilson_low, wilson_high: 95% Wilson score interval; minus_dense_low, "
            "minus_dense_high: 95% paired bootstrap of the difference from dense on the same probes")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, "held-out documents the probes are built into (the filler)")
    for action in parser._actions:  # the common --probes, here per cell
        if action.dest == "probes":
            action.help = "probes per task and distance (per cell)"
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS),
                        help="tasks of topo_attn.lm.retrieval (default: all)")
    parser.add_argument("--distances", type=int, nargs="+", default=None,
                        help="bytes from the needle's value to the answer (default: 1k, 2k, 4k, ... and the "
                             "document length - 128)")
    parser.add_argument("--selectors", nargs="+", default=list(DEFAULT_SELECTORS), choices=TOKEN_SELECTORS,
                        help=f"token-granularity selectors (default: {' '.join(DEFAULT_SELECTORS)})")
    parser.add_argument("--budgets", type=int, nargs="+", default=list(DEFAULT_BUDGETS),
                        help="key blocks per query token beyond sinks and window")
    parser.add_argument("--batch", type=int, default=4, help="probes per forward")
    parser.add_argument("--formats", choices=("held_out", "training"), default="held_out",
                        help="the tasks' line formats the probes use: held_out (the suite; default) or training "
                             "(a diagnostic: whether the model retrieves at all in the formats it was trained "
                             "on, which the 90%% gate does not count)")


def build_parser(add_help: bool = True) -> argparse.ArgumentParser:
    """``python -m topo_attn.lm retrieval``'s command line (``add_help=False``: as a parent parser)."""
    return cli.command_parser(PROG, __doc__, add_arguments, add_help)


def check_args(args: argparse.Namespace) -> None:
    """Raise :class:`~topo_attn.cli.UsageError` for values that would fail late or unclearly: a distance below 1
    or not shorter than ``--length``, ``--batch`` below 1, and those of
    :func:`~topo_attn.lm.study.check_common_arguments` (the model folder and evaluation set last)."""
    cli.check_at_least("--distances", args.distances, 1, "distance")
    cli.check_at_least("--batch", args.batch, 1)
    if args.length is not None and args.distances:
        cli.check_at_least("--length", args.length, 1)
        too_far = [d for d in args.distances if d >= args.length]
        if too_far:
            raise cli.UsageError(f"argument --distances: {too_far} do not fit --length {args.length} "
                                 f"(expected distances < length)")
    check_common_arguments(args)


def line_formats(task: str, kind: str = "held_out") -> tuple[str, ...]:
    """``task``'s held-out formats (``kind="held_out"``, what the suite scores) or its training formats
    (``"training"``, the diagnostic of ``--formats training``)."""
    return held_out_formats(task) if kind == "held_out" else training_formats(task)


def build_probes(docs: np.ndarray, tasks: list[str], distances: list[int], per_cell: int, seed: int,
                 budget: int, block_size: int, formats: str = "held_out", option: str = "--distances") -> list:
    """Per task (in order), ``per_cell`` probes per distance in its ``formats`` (:func:`line_formats`), built
    into ``docs`` (``uint8 [N, L]``), each ``L`` bytes long. Raises ``ValueError`` naming ``option`` (the
    command line's distances) when a distance does not fit or the documents cannot host a probe."""
    probes = []
    for task in tasks:
        options = dict(budget=budget, block_size=block_size) if task == "single_needle" else {}
        try:
            probes += probe_set(task, docs, distances, per_cell, formats=line_formats(task, formats), seed=seed,
                                **options)
        except ValueError as error:
            raise ValueError(f"argument {option}: {task} probes of {docs.shape[1]} bytes at distances "
                             f"{distances}: {error}") from error
    return probes


def suite_granularity(attention: str) -> str | None:
    """How the suite scores ``attention`` without look-ahead: ``"token"`` for a selector of
    :data:`~topo_attn.lm.token_attention.TOKEN_SELECTORS` (each query token chooses from its own query among the
    complete blocks before it); ``"block"`` for ``sdpa``, ``dense`` and ``window``, whose blocks depend on no
    query or key; None for the others (``topology_22``: the salience of a whole sequence's block centroids, so a
    query block's choice reads keys after it), which the suite does not score."""
    if attention in TOKEN_SELECTORS:
        return "token"
    return "block" if attention in ("sdpa", "dense", "window") else None


def score_probes(model, probes: list, attention: str, budget: int | None, args: argparse.Namespace,
                 batch: int) -> list[dict]:
    """:func:`~topo_attn.lm.evaluate.passkey_scores` of ``model`` on each of ``probes`` (``exact``: whether it
    answers exactly; the lookup and copy counts) under ``attention`` at ``budget``, at its
    :func:`suite_granularity` (``args``: the rule's ``block_size``, ``sinks``, ``window``). Raises ``ValueError``
    for an attention the suite cannot score without look-ahead."""
    granularity = suite_granularity(attention)
    if granularity is None:
        raise ValueError(f"the retrieval suite cannot score {attention!r} without look-ahead (expected sdpa, "
                         f"dense, window or one of {list(TOKEN_SELECTORS)})")
    settings = argparse.Namespace(block_size=args.block_size, sinks=args.sinks, window=args.window,
                                  granularity=granularity, strict=False, per_query_head=False, dense_layers=[])
    use_attention(model, attention, budget, settings)
    return passkey_scores(model, probes, batch=batch)


def cells(probes: list) -> dict[tuple[str, int], list[int]]:
    """The probes' indices per cell ``(task, distance)``, in the probes' order."""
    at: dict[tuple[str, int], list[int]] = {}
    for i, probe in enumerate(probes):
        at.setdefault((probe.task, probe.distance), []).append(i)
    return at


def cell_accuracy(correct: list[bool]) -> dict:
    """One cell's ``accuracy``, ``n``, 95% bootstrap ``ci_low``/``ci_high`` and Wilson ``wilson_low``/``wilson_high``
    from its probes' outcomes."""
    boot, wilson = intervals.bootstrap_interval(correct), intervals.wilson_interval(correct)
    return dict(accuracy=boot.accuracy, n=boot.n, ci_low=boot.ci_low, ci_high=boot.ci_high,
                wilson_low=wilson.ci_low, wilson_high=wilson.ci_high)


def byte_accuracy(scores: list[dict]) -> dict:
    """``lookup_accuracy`` and ``copy_accuracy`` (NaN without such bytes) over probes' scores
    (:func:`~topo_attn.lm.evaluate.passkey_scores` rows)."""
    def share(right: str, total: str) -> float:
        count = sum(s[total] for s in scores)
        return sum(s[right] for s in scores) / count if count else float("nan")

    return dict(lookup_accuracy=share("lookups_right", "lookups"), copy_accuracy=share("copies_right", "copies"))


def cell_rows(probes: list, outcomes: dict[tuple[str, int | None], list[bool]],
              scores: dict[tuple[str, int | None], list[dict]] | None = None) -> list[dict]:
    """The rows of the module docstring from per-probe outcomes: ``outcomes[(attention, budget)]`` holds one bool
    per probe of ``probes`` (in order); ``("dense", None)`` must be among them. ``scores``: the same keys'
    :func:`score_probes` rows, for the lookup and copy accuracies (left out of the rows when None)."""
    dense = outcomes[("dense", None)]
    rows = []
    for (attention, budget), correct in outcomes.items():
        for (task, distance), at in cells(probes).items():
            mine = [correct[i] for i in at]
            theirs = [dense[i] for i in at]
            row = dict(task=task, distance=distance, attention=attention,
                       selector=None if attention in ("sdpa", "dense") else attention, budget=budget,
                       **cell_accuracy(mine), dense_reaches_90=bool(np.mean(theirs) >= DENSE_THRESHOLD))
            if scores is not None and (attention, budget) in scores:
                row.update(byte_accuracy([scores[(attention, budget)][i] for i in at]))
            if row["selector"] is not None:
                diff = intervals.paired_difference(mine, theirs)
                row.update(minus_dense=diff.difference, minus_dense_low=diff.ci_low, minus_dense_high=diff.ci_high)
            rows.append(row)
    return rows


def dense_gate(rows: list[dict]) -> dict:
    """``threshold``, ``passed`` (dense reaches it on every task at every distance) and the ``failing`` cells
    (``task``, ``distance``, ``accuracy``) of dense."""
    failing = [dict(task=r["task"], distance=r["distance"], accuracy=r["accuracy"]) for r in rows
               if r["attention"] == "dense" and r["accuracy"] < DENSE_THRESHOLD]
    return dict(threshold=DENSE_THRESHOLD, passed=not failing, failing=failing)


def retrieval_suite(args: argparse.Namespace, argv: list[str] | None = None) -> dict:
    """Everything of the module docstring for parsed (and checked) ``args``; the results as a dict (and JSON
    at ``args.out``)."""
    from tqdm.auto import tqdm

    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if args.device != "cpu" else torch.float32)
    model = load_model(args.model, args.device, dtype)
    docs = load_documents(eval_set_path(args), args.documents, args.length)
    length = int(docs.shape[1])
    distances = list(args.distances) if args.distances else probe_distances(length)
    probes = build_probes(docs, list(args.tasks), distances, args.probes, args.seed, max(args.budgets),
                          args.block_size, args.formats)
    configs = [("sdpa", None), ("dense", None)] + [(s, b) for s in args.selectors for b in args.budgets]
    started = time.perf_counter()
    header = dict(
        suite=LM_RETRIEVAL_SUITE, model=str(args.model),
        **run_record(args.device, f"{PROG} " + " ".join(argv if argv is not None else sys.argv[2:])),
        eval_set=str(eval_set_path(args)),
        documents=len(docs), length=length, block_size=args.block_size, sinks=args.sinks, window=args.window,
        granularity="token", dtype=str(dtype).removeprefix("torch."), seed=args.seed,
        probes_per_cell=args.probes, tasks=list(args.tasks), distances=distances,
        format_kind=args.formats, formats={task: list(line_formats(task, args.formats)) for task in args.tasks},
        scoring="exact match of the answer under greedy prediction (topo_attn.lm.evaluate.passkey_scores), "
                "selectors per token (topo_attn.lm.token_attention): no look-ahead",
        interval=INTERVAL)
    scores = {}
    for attention, budget in tqdm(configs, desc="retrieval", disable=not cli.progress_enabled(args.progress)):
        scores[(attention, budget)] = score_probes(model, probes, attention, budget, args, args.batch)
        if args.out and ("dense", None) in scores:  # what ran so far survives a time limit
            write_result(args.out, header, probes, scores, configs, started)
    model.set_attn_implementation("sdpa")
    return write_result(args.out, header, probes, scores, configs, started)


def write_result(out: str | None, header: dict, probes: list, scores: dict, configs: list,
                 started: float) -> dict:
    """The result of the module docstring from the :func:`score_probes` rows so far (``scores``, per
    configuration: ``("dense", None)`` among them), written to ``out`` when given; ``complete`` says whether every
    configuration of ``configs`` ran (``missing`` lists the others as ``[attention, budget]``)."""
    outcomes = {config: [bool(r["exact"]) for r in rows] for config, rows in scores.items()}
    rows = cell_rows(probes, outcomes, scores)
    missing = [list(c) for c in configs if c not in scores]
    gate = dict(dense_gate(rows), formats=header["format_kind"])  # the gate counts held-out formats only
    result = dict(header, complete=not missing, missing=missing, dense_gate=gate, rows=rows,
                  seconds=time.perf_counter() - started)
    if out:
        Path(out).write_text(json.dumps(result, indent=1))
    return result


def markdown(result: dict) -> str:
    """Per task and configuration, the accuracy per distance with its bootstrap interval; dense's lookup and copy
    accuracies per cell."""
    distances = sorted({r["distance"] for r in result["rows"]})
    head = ["task", "attention", "budget", *[f"@{d}" for d in distances]]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    keys = list(dict.fromkeys((r["task"], r["attention"], r["budget"]) for r in result["rows"]))
    cells = {(r["task"], r["attention"], r["budget"], r["distance"]): r for r in result["rows"]}
    for task, attention, budget in keys:
        out = [task, attention, "" if budget is None else str(budget)]
        for d in distances:
            r = cells.get((task, attention, budget, d))
            out.append("" if r is None else intervals.accuracy_text(r))
        lines.append("| " + " | ".join(out) + " |")
    split = [r for r in result["rows"] if r["attention"] == "dense" and "lookup_accuracy" in r]
    if split:
        lines.append("\ndense, answer bytes right, finding a value / copying it: " + "; ".join(
            f"{r['task']} @{r['distance']} {r['lookup_accuracy']:.0%} / {r['copy_accuracy']:.0%}" for r in split))
    gate = result["dense_gate"]
    diagnostic = " (training formats: a diagnostic, not the gate)" if gate.get("formats") == "training" else ""
    lines.append(f"\ndense reaches {gate['threshold']:.0%} on every task and distance: "
                 f"{'yes' if gate['passed'] else 'no'}{diagnostic}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command line (``argv`` without ``retrieval``; ``sys.argv[2:]`` when None): print the table. Raises
    :class:`~topo_attn.cli.UsageError` for a bad value (:func:`check_args`) before anything loads."""
    argv = sys.argv[2:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    check_args(args)
    print(markdown(retrieval_suite(args, argv)))
    return 0
