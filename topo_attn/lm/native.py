"""``python -m topo_attn.lm native``: native sparse training (issue 42, item 2). Does a model trained with the
kit's sparse attention from the first step do as well as one trained dense, and does one trained with a
query-blind topology selector learn to make the blocks it needs salient?

At equal settings, steps and seed (so equal initial weights and equal batches), one byte-level model is trained
per attention of ``--attentions`` (default :data:`DEFAULT_ATTENTIONS`: SDPA, then ``window``, ``quest``,
``centroid``, ``topology`` and ``topology_22`` at ``--budget``, default n/8: an eighth of the context's blocks,
16 extra blocks per query block at context 8192 with 64-token blocks) by :func:`topo_attn.lm.train.train`
(``TrainSettings.attention``; its checkpoint in ``--models/<attention>/``; ``window`` adds no blocks: the sink
and the one-block window only, the floor of the comparison). With ``--init FOLDER`` every model starts from that
checkpoint's weights instead of the seeded initialisation (a dense model fine-tuned with each attention). Each
model is then scored on the
held-out documents with the attention it was trained with, and the SDPA-trained model also with every other
attention of the list applied after training; both through :func:`topo_attn.lm.study.quality_rows` (bits per
byte by :func:`topo_attn.lm.evaluate.bits_per_byte`, the passkey probe by
:func:`~topo_attn.lm.evaluate.passkey_scores`), on the same documents and probes.

The JSON (``--out``, e.g. ``data/benchmarks/lm_native_<gpu>.json``; written after every model, ``complete``
true at the end) holds, besides the GPU, versions, command and commit (:func:`topo_attn.provenance.run_record`)
and the settings (``retrieval_suite``: the suite's probes per cell, tasks, distances, formats and the attentions
it leaves ``unscored``):

- ``rows``, one per trained model: ``attention``, ``budget`` (extra blocks per query block; None for ``sdpa``
  and ``dense``, 0 for ``window``), ``bits_per_byte`` (all held-out positions), ``bits_per_byte_by_position``
  (per position bucket, :data:`topo_attn.lm.evaluate.BUCKETS`), ``bits_per_byte_per_document`` (each held-out
  document's, in order: the items of the paired intervals in :func:`markdown`), ``visited_fraction`` (of the
  causal blocks, in that evaluation), ``passkey`` (per distance: ``exact``, ``probes``, ``loss``),
  ``tokens_per_s`` (training bytes per second of the training steps, validations between them left out; a token
  is a byte),
  ``tokens_per_s_after_first_step`` (the same without the first step, which on a GPU compiles the kernels),
  ``steps``, ``seconds`` (the training steps' wall time), ``run_seconds`` (the whole training run: corpus,
  validations, probes, saving), ``train_visited_fraction``, ``model`` (the checkpoint's folder),
  ``retrieval_suite`` (the retrieval suite of :mod:`topo_attn.lm.retrieval_runner` in its held-out formats, per
  task and distance: ``task``, ``distance``, ``accuracy``, ``n``, ``ci_low``, ``ci_high``, ``wilson_low``,
  ``wilson_high``; ``--suite-probes`` per cell, built into the held-out documents and scored without
  look-ahead, :func:`~topo_attn.lm.retrieval_runner.suite_granularity`; None for an attention it cannot score
  so, and with ``--suite-probes 0``) and ``retrieval_suite_accuracy`` (over all its probes);
- ``after_training``, the SDPA-trained model with each other attention of the list, or of ``--compare``
  (``trained_with``: ``"sdpa"``): the same evaluation fields (empty, with a note, when ``sdpa`` is not among
  ``--attentions``).

With ``--resume`` a run adds its models to an existing ``--out`` of equal settings (:data:`RESUME_KEYS`, the
retrieval suite's, the budgets), skipping the attentions the file holds; ``runs`` then lists each run's command,
date, commit and attentions. A study too long for one sitting runs in parts: ``--attentions sdpa --compare
window quest ...`` first (the SDPA-trained model and its after-training rows), then ``--resume --attentions
window quest`` and so on.

:func:`markdown` renders the comparison; :func:`topo_attn.lm.results.load_lm_native` reads the file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from .. import cli
from ..provenance import ROOT, run_record
from . import train as training
from .corpus import parse_roots
from .intervals import paired_mean_difference
from .results import LM_NATIVE_SUITE, load_lm_native
from .retrieval import TASKS

PROG = "python -m topo_attn.lm native"
DEFAULT_ATTENTIONS = ("sdpa", "window", "quest", "centroid", "topology", "topology_22")
"""The attentions trained by default (issue 42's list; the kit's ``dense`` is left out: it equals SDPA to
rounding, and ``--attentions`` can add it)."""
DEFAULT_MODELS = ROOT / "data" / "lm_native"
"""Where the checkpoints go by default (one folder per attention)."""
ROW_FIELDS = ("attention", "budget", "bits_per_byte", "bits_per_byte_by_position", "bits_per_byte_per_document",
              "visited_fraction", "passkey",
              "tokens_per_s", "tokens_per_s_after_first_step", "steps", "seconds", "run_seconds",
              "train_visited_fraction", "model", "retrieval_suite", "retrieval_suite_accuracy")
"""The fields of a ``rows`` entry."""
AFTER_FIELDS = ("attention", "budget", "trained_with", "bits_per_byte", "bits_per_byte_by_position",
                "bits_per_byte_per_document", "visited_fraction", "passkey", "retrieval_suite",
                "retrieval_suite_accuracy")
"""The fields of an ``after_training`` entry."""
NO_SDPA = "no after_training rows: 'sdpa' is not among --attentions, so no dense-trained model was trained"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="JSON file for the results (e.g. "
                                                     "data/benchmarks/lm_native_h200.json)")
    parser.add_argument("--models", default=str(DEFAULT_MODELS),
                        help="folder for the checkpoints, one subfolder per attention (default: data/lm_native)")
    parser.add_argument("--attentions", nargs="+", default=list(DEFAULT_ATTENTIONS), metavar="ATTENTION",
                        help=f"the attentions to train with, each once, among {', '.join(training.ATTENTIONS)} "
                             f"(default: {' '.join(DEFAULT_ATTENTIONS)})")
    parser.add_argument("--budget", type=int, default=None,
                        help="extra key blocks per query block of the selectors that add blocks (default n/8: "
                             "ceil(context / block size) // 8, 16 at context 8192 with 64-token blocks)")
    training.add_arguments(parser, skip=("attention", "budget"))  # the training settings and the model's shape
    parser.add_argument("--documents", type=int, default=16,
                        help="held-out documents scored (at most --eval-documents)")
    parser.add_argument("--probes", type=int, default=16, help="passkey probes per distance")
    parser.add_argument("--probe-seed", type=int, default=1, help="seed of the passkey probes")
    parser.add_argument("--eval-batch", type=int, default=4, help="documents per forward in the evaluation")
    parser.add_argument("--suite-probes", type=int, default=8,
                        help="retrieval-suite probes per task and distance (held-out formats; 0: no suite)")
    parser.add_argument("--suite-tasks", nargs="+", default=list(TASKS), choices=list(TASKS),
                        help="the retrieval suite's tasks (default: all)")
    parser.add_argument("--suite-distances", type=int, nargs="+", default=None,
                        help="the retrieval suite's distances in bytes (default: 1k, 2k, 4k, ... and context - 128)")
    parser.add_argument("--compare", nargs="+", default=None, metavar="ATTENTION",
                        help="the attentions the SDPA-trained model is scored with after training (default: the "
                             "other attentions of --attentions)")
    parser.add_argument("--resume", action="store_true",
                        help="add this run's models to an existing --out of equal settings (the attentions it "
                             "holds are skipped), so the study can run in parts")
    parser.add_argument("--no-after-training", dest="after_training", action="store_false",
                        help="skip the SDPA-trained model under the other attentions")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--root", action="append", default=None, metavar="KIND=PATH",
                        help="a corpus root (repeatable; default: this Python's standard library and packages)")
    parser.add_argument("--max-shard-size", default="100MB", help="largest weights file (e.g. 15MB)")
    cli.add_progress_argument(parser)


def build_parser(add_help: bool = True) -> argparse.ArgumentParser:
    """``python -m topo_attn.lm native``'s command line (``add_help=False``: as a parent parser)."""
    return cli.command_parser(PROG, __doc__, add_arguments, add_help)


def settings_for(args: argparse.Namespace, attention: str) -> training.TrainSettings:
    """The training settings of ``attention``: those of ``args``, with ``--budget`` for a selector that adds
    blocks (None, n/8, when not given) and None for the others."""
    base = training.settings_from_args(args, attention=attention, budget=None)
    return replace(base, budget=args.budget) if training.adds_blocks(attention) else base


def check_args(args: argparse.Namespace) -> None:
    """Raise :class:`~topo_attn.cli.UsageError` for values that would fail late (after a model was trained) or
    unclearly: an attention outside :data:`~topo_attn.lm.train.ATTENTIONS` or given twice, a negative
    ``--budget``, settings :func:`~topo_attn.lm.train.check_arguments` rejects, ``--documents`` beyond
    ``--eval-documents``, a count below 1, an ``--out`` whose folder does not exist, a ``--models`` that is a
    file, a bad ``--root``."""
    unknown = [a for a in args.attentions if a not in training.ATTENTIONS]
    if unknown:
        raise cli.UsageError(f"argument --attentions: each must be one of {list(training.ATTENTIONS)}, got "
                             f"{unknown}")
    twice = sorted({a for a in args.attentions if args.attentions.count(a) > 1})
    if twice:
        raise cli.UsageError(f"argument --attentions: each attention once (one model each), got {twice} twice")
    cli.check_at_least("--budget", args.budget, 0)
    bad = [a for a in args.compare or () if a not in training.ATTENTIONS or a == "sdpa"]
    if bad:
        raise cli.UsageError(f"argument --compare: each must be one of {list(training.ATTENTIONS[1:])}, got {bad}")
    for attention in [*args.attentions, *(args.compare or ())]:
        training.check_arguments(args, settings_for(args, attention))
    for option, value in (("--documents", args.documents), ("--probes", args.probes),
                          ("--eval-batch", args.eval_batch)):
        cli.check_at_least(option, value, 1)
    cli.check_at_least("--suite-probes", args.suite_probes, 0)
    cli.check_at_least("--suite-distances", args.suite_distances, 1, "distance")
    too_far = [d for d in args.suite_distances or () if d >= args.context]
    if too_far:
        raise cli.UsageError(f"argument --suite-distances: {too_far} do not fit --context {args.context} "
                             f"(expected distances < context)")
    if args.documents > args.eval_documents:
        raise cli.UsageError(f"argument --documents: at most --eval-documents ({args.eval_documents}, the held-out "
                             f"documents a training run keeps), got {args.documents}")
    out = Path(args.out)
    if out.is_dir() or not out.parent.is_dir():
        raise cli.UsageError(f"argument --out: expected a JSON file in an existing folder, got {args.out}")
    if args.resume and out.exists():
        load_lm_native(out)  # a readable file of this suite, else the message names it
    if Path(args.models).exists() and not Path(args.models).is_dir():
        raise cli.UsageError(f"argument --models: {args.models} is a file; expected a folder (created if missing)")
    parse_roots(args.root)


def _evaluation_args(args: argparse.Namespace) -> argparse.Namespace:
    """What :func:`topo_attn.lm.study.quality_rows` reads: the rule's sizes, the probes, block granularity."""
    return argparse.Namespace(probes=args.probes, seed=args.probe_seed, batch=args.eval_batch,
                              block_size=args.block_size, sinks=args.sinks, window=args.window, dense_layers=[],
                              strict=False, per_query_head=False, granularity="block", budgets=[], selectors=None)


def _scored(perplexity: dict, retrieval: list[dict]) -> dict:
    """A configuration's evaluation fields from its :func:`~topo_attn.lm.study.quality_rows` rows."""
    bits = perplexity["bits_per_byte"]
    passkey = [{k: r[k] for k in ("distance", "exact", "probes", "loss")} for r in retrieval
               if (r["attention"], r["budget"]) == (perplexity["attention"], perplexity["budget"])]
    return dict(attention=perplexity["attention"], budget=perplexity["budget"], bits_per_byte=bits["all"],
                bits_per_byte_by_position={k: v for k, v in bits.items() if k != "all"},
                bits_per_byte_per_document=perplexity["bits_per_byte_per_document"],
                visited_fraction=perplexity["visited_fraction"], passkey=passkey)


def suite_fields(model, probes: list, attention: str, budget: int | None, args: argparse.Namespace) -> dict:
    """``retrieval_suite`` and ``retrieval_suite_accuracy`` of ``model`` under ``attention`` at ``budget`` on
    ``probes`` (None for both when there are none or the suite cannot score the attention without look-ahead)."""
    from . import retrieval_runner

    if not probes or retrieval_runner.suite_granularity(attention) is None:
        return dict(retrieval_suite=None, retrieval_suite_accuracy=None)
    correct = [bool(r["exact"]) for r in retrieval_runner.score_probes(model, probes, attention, budget, args,
                                                                        args.eval_batch)]
    cells = [dict(task=task, distance=distance, **retrieval_runner.cell_accuracy([correct[i] for i in at]))
             for (task, distance), at in retrieval_runner.cells(probes).items()]
    return dict(retrieval_suite=cells, retrieval_suite_accuracy=sum(correct) / len(correct))


def training_row(scored: dict, summary: dict, folder: Path) -> dict:
    """A ``rows`` entry: the evaluation of ``scored`` (:func:`_scored`) and the speed of the training run whose
    :func:`~topo_attn.lm.train.train` summary is ``summary``."""
    steps, seen, seconds = summary["steps"], summary["bytes"], summary["train_seconds"]
    later = seconds - summary["first_step_seconds"]
    return dict(scored, tokens_per_s=seen / seconds,
                tokens_per_s_after_first_step=seen * (steps - 1) / steps / later if steps > 1 and later > 0 else None,
                steps=steps, seconds=seconds, run_seconds=summary["seconds"],
                train_visited_fraction=summary["visited_fraction"], model=str(folder))


RESUME_KEYS = ("block_size", "sinks", "window", "settings", "shape", "documents", "length", "probes", "dtype",
               "device")
"""What a resumed file must share with the run that adds to it (``retrieval_suite`` too, less ``unscored``)."""


def resumed(result: dict, path: Path) -> dict:
    """``result`` (a new run's header, no rows yet) continued from the file ``path`` of an earlier run: its rows
    and after-training rows kept, ``attentions`` and ``budgets`` joined, each run's command and commit in
    ``runs``. Raises :class:`~topo_attn.cli.UsageError` naming the first setting that differs."""
    old = load_lm_native(path)
    for key in RESUME_KEYS:
        if old.get(key) != result[key]:
            raise cli.UsageError(f"argument --resume: {path} was run with {key} = {old.get(key)!r}, this run has "
                                 f"{result[key]!r}; resume only with equal settings")
    suite = {k: v for k, v in result["retrieval_suite"].items() if k != "unscored"}
    if {k: v for k, v in old["retrieval_suite"].items() if k != "unscored"} != suite:
        raise cli.UsageError(f"argument --resume: {path} was run with other retrieval-suite settings "
                             f"({old['retrieval_suite']}); resume only with equal settings")
    clash = [a for a in result["budgets"] if a in old["budgets"] and old["budgets"][a] != result["budgets"][a]]
    if clash:
        raise cli.UsageError(f"argument --resume: {path} has other budgets for {clash}; resume only with equal "
                             f"settings")
    def run_of(data: dict) -> dict:
        return {k: data[k] for k in ("command", "date", "commit", "dirty", "attentions")}

    return dict(result, rows=old["rows"], after_training=old["after_training"], notes=old["notes"],
                attentions=list(dict.fromkeys(old["attentions"] + result["attentions"])),
                budgets={**old["budgets"], **result["budgets"]},
                retrieval_suite=dict(old["retrieval_suite"], unscored=list(dict.fromkeys(
                    old["retrieval_suite"]["unscored"] + result["retrieval_suite"]["unscored"]))),
                runs=old.get("runs", [run_of(old)]) + [run_of(result)])


def run(args: argparse.Namespace, argv: list[str] | None = None) -> dict:
    """Everything of the module docstring for parsed (and checked, :func:`check_args`) ``args``; the results as
    a dict, also written to ``--out`` after every model."""
    import torch

    from . import study
    from .retrieval_runner import build_probes, suite_granularity

    device = args.device
    dtype = torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16
    shape, roots, models = training.shape_from_args(args), parse_roots(args.root), Path(args.models)
    evaluation = _evaluation_args(args)
    compare = [a for a in args.attentions if a != "sdpa"] if args.compare is None else list(args.compare)
    budgets = {a: training.attention_budget(settings_for(args, a)) for a in dict.fromkeys(args.attentions + compare)}
    suite_distances = list(args.suite_distances or training.probe_distances(args.context))
    decoy_budget = max([b for b in budgets.values() if b] or [0])  # single_needle's decoys outnumber every budget
    base = training.settings_from_args(args, attention="sdpa", budget=None)  # recorded less these two fields
    result = dict(
        suite=LM_NATIVE_SUITE, **run_record(device, f"{PROG} " + " ".join(sys.argv[2:] if argv is None else argv)),
        complete=False,
        attentions=list(args.attentions), budgets=budgets, block_size=args.block_size, sinks=args.sinks,
        window=args.window, settings={k: v for k, v in asdict(base).items() if k not in ("attention", "budget")},
        shape=asdict(shape), documents=args.documents, length=args.context, probes=args.probes,
        retrieval_suite=dict(probes_per_cell=args.suite_probes, tasks=list(args.suite_tasks),
                             distances=suite_distances, formats="held_out",
                             unscored=[a for a in budgets if suite_granularity(a) is None]),
        dtype=str(dtype).removeprefix("torch."), device=device, rows=[], after_training=[], notes=[])
    if args.resume and Path(args.out).exists():
        result = resumed(result, Path(args.out))
    elif args.after_training and "sdpa" not in args.attentions:
        result["notes"].append(NO_SDPA)
    done = {r["attention"] for r in result["rows"]}
    started = time.perf_counter()
    for attention in [a for a in args.attentions if a not in done]:
        folder = models / attention
        summary = training.train(folder, settings_for(args, attention), shape, device=device, roots=roots,
                                 progress=args.progress, max_shard_size=args.max_shard_size)
        model = study.load_model(folder, device, dtype)
        docs = study.load_documents(folder / "eval_set.npz", args.documents)
        probes = build_probes(docs, list(args.suite_tasks), suite_distances, args.suite_probes, args.probe_seed,
                              decoy_budget, args.block_size, option="--suite-distances") if args.suite_probes else []
        perplexity, retrieval = study.quality_rows(model, docs, evaluation, args.progress,
                                                   configs=[(attention, budgets[attention])])
        suite = suite_fields(model, probes, attention, budgets[attention], args)
        result["rows"].append(dict(training_row(_scored(perplexity[0], retrieval), summary, folder), **suite))
        if attention == "sdpa" and args.after_training:
            configs = [(a, budgets[a]) for a in compare]
            perplexity, retrieval = study.quality_rows(model, docs, evaluation, args.progress, configs=configs)
            scored = [dict(_scored(p, retrieval), trained_with="sdpa",
                           **suite_fields(model, probes, p["attention"], p["budget"], args)) for p in perplexity]
            result["after_training"] = [{k: r[k] for k in AFTER_FIELDS} for r in scored]
        del model
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
        result["seconds"] = time.perf_counter() - started
        Path(args.out).write_text(json.dumps(result, indent=1))
    if any(r["attention"] == "sdpa" for r in result["rows"]):  # an earlier part's note no longer holds
        result["notes"] = [n for n in result["notes"] if n != NO_SDPA]
    result["complete"] = True
    Path(args.out).write_text(json.dumps(result, indent=1))
    return result


def markdown(result: dict) -> str:
    """A Markdown table of a :func:`run` result: per trained attention its budget, visited fraction, bits per byte
    (all and per position bucket) trained natively and, for the SDPA-trained model with that attention applied
    after training, the same; the native model's bits per byte minus the after-training one's and minus the
    SDPA-trained model's, each with a paired 95% bootstrap interval over the documents (blank for a file without
    per-document values); the retrieval suite's accuracy of both; training tokens per second over all steps
    and after the first (which compiles the kernels on a GPU), the latter over SDPA's row (blank without one),
    steps and seconds."""
    after = {r["attention"]: r for r in result["after_training"]}
    buckets = list(result["rows"][0]["bits_per_byte_by_position"]) if result["rows"] else []
    sdpa_row = next((r for r in result["rows"] if r["attention"] == "sdpa"), None)
    sdpa = None if sdpa_row is None else sdpa_row.get("tokens_per_s_after_first_step")
    head = ["attention", "budget", "visited", "bits/byte native", "after SDPA training",
            "native - after [95% CI]", "native - sdpa [95% CI]",
            *[f"native {b}" for b in buckets], "suite native", "suite after SDPA training", "tokens/s",
            "tokens/s after step 1", "/ sdpa", "steps", "seconds"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in result["rows"]:
        other = after.get(row["attention"])
        if row["attention"] == "sdpa":
            other = row
        cells = [row["attention"], "" if row["budget"] is None else str(row["budget"]),
                 f"{row['visited_fraction']:.1%}", f"{row['bits_per_byte']:.3f}",
                 "" if other is None else f"{other['bits_per_byte']:.3f}",
                 *(_paired(row, b) if b is not row else "" for b in (other, sdpa_row)),
                 *[f"{row['bits_per_byte_by_position'][b]:.3f}" for b in buckets],
                 _accuracy(row), "" if other is None else _accuracy(other),
                 f"{row['tokens_per_s']:.0f}", *_steady_throughput(row.get("tokens_per_s_after_first_step"), sdpa),
                 str(row["steps"]), f"{row['seconds']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _paired(row: dict, other: dict | None) -> str:
    """``row``'s bits per byte minus ``other``'s over the same documents, with its paired bootstrap interval
    (:func:`topo_attn.lm.intervals.paired_mean_difference`); blank without ``other`` or without per-document
    values (an older file)."""
    a = row.get("bits_per_byte_per_document")
    b = None if other is None else other.get("bits_per_byte_per_document")
    if not a or not b:
        return ""
    found = paired_mean_difference(a, b)
    return f"{found.difference:+.3f} [{found.ci_low:+.3f}, {found.ci_high:+.3f}]"


def _steady_throughput(tokens_per_s: float | None, sdpa: float | None) -> list[str]:
    """The cells of tokens per second after the first step and their ratio to SDPA's (blank where unknown: one
    step, or an older file)."""
    if tokens_per_s is None:
        return ["", ""]
    return [f"{tokens_per_s:.0f}", "" if not sdpa else f"{tokens_per_s / sdpa:.2f}x"]


def _accuracy(row: dict) -> str:
    """A row's retrieval-suite accuracy as a percentage, blank when it was not scored (an older file included)."""
    accuracy = row.get("retrieval_suite_accuracy")
    return "" if accuracy is None else f"{accuracy:.0%}"


def main(argv: list[str] | None = None) -> int:
    """The command line (``argv`` without ``native``; ``sys.argv[2:]`` when None): train, score, write ``--out``
    and print :func:`markdown`. Raises :class:`~topo_attn.cli.UsageError` for a bad value (:func:`check_args`)
    before anything is trained."""
    argv = sys.argv[2:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    check_args(args)
    result = run(args, argv)
    print(markdown(result))
    for note in result["notes"]:
        print(f"note: {note}")
    return 0
