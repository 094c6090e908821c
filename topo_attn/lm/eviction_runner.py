"""``python -m topo_attn.lm eviction``: KV-cache eviction (issue 41, item 5). With a fixed memory budget of key/value
blocks, chosen at the end of the prefill and again as blocks complete, what do the eviction policies of
:mod:`topo_attn.eviction` keep of a model's quality? Here selection must be query-blind (future queries are
unknown), the setting where topology's salience asks nothing it cannot have.

For a model folder (default ``data/lm``) and its held-out documents (``eval_set.npz``, as ``evaluate`` loads them,
cut to ``--length``), each configuration is the reference ``dense`` (nothing evicted, cache fraction 1) and every
policy of ``--policies`` (default all of :data:`topo_attn.eviction.POLICIES`) at every fraction of
``--cache-fractions`` (default 1/4 and 1/8): ``keep = floor(fraction * ceil(length / block_size))`` blocks per
layer and key/value head, ``--sinks`` and ``--window`` of them always kept. Each configuration runs the model through
:class:`~topo_attn.lm.evicted_model.EvictedModel`: the first ``--prefix`` bytes (default half the length) prefilled
with dense attention, the first choice per layer at its end (:func:`topo_attn.eviction.evict`), then the
continuation teacher-forced, attending exactly to the kept tokens and those written since, the choice again after
every completed block (:func:`topo_attn.eviction.update`); no prediction depends on a later byte.

- **Perplexity of the continuation**: bits per byte of the bytes predicted by the continuation's positions
  (``prefix + 1 .. length - 1``, :func:`~topo_attn.lm.evaluate.token_losses`), over ``--documents`` documents.
- **Retrieval under eviction**: the RULER-style tasks (:mod:`topo_attn.lm.retrieval`, held-out formats, built
  into the documents as :func:`topo_attn.lm.retrieval_runner.build_probes` builds them; ``single_needle`` with
  more decoys than the largest budget's blocks), ``--probes`` per task and distance, the first needle's line inside
  the prefix (default distance ``length - prefix // 2``: the needle's value in the middle of the prefix) and the
  answer in the continuation; exact match of the answer under greedy prediction
  (:func:`~topo_attn.lm.evaluate.passkey_scores`).
- **Memory**: the most tokens a layer's cache held during the continuation (``peak_tokens``: the budget plus the
  block being completed) against the full cache at the end of the document (``length`` tokens), as
  ``memory_fraction`` and as bytes of keys and values over every layer per document (``kv_bytes``,
  ``full_kv_bytes``). The prefill holds the ``prefix`` tokens before the first choice, for every policy alike.

Each row (``rows`` in the JSON) is one configuration: ``policy`` (``dense`` or the policy), ``cache_fraction``,
``keep_blocks``, ``query_blind`` (None for dense), ``bits_per_byte``, ``n_bytes`` (bytes scored),
``bits_per_byte_minus_dense``, ``peak_tokens``, ``kv_bytes``, ``full_kv_bytes``, ``memory_fraction``,
``seconds`` and ``retrieval``: per task ``accuracy``, ``n``, ``ci_low`` and ``ci_high`` (95% percentile bootstrap,
:func:`~topo_attn.lm.intervals.bootstrap_interval`), ``wilson_low`` and ``wilson_high`` (95% Wilson interval)
and, for policies, ``minus_dense``, ``minus_dense_low``, ``minus_dense_high`` (the accuracy minus dense's on the
same probes with its paired bootstrap interval); the cells pool the distances asked for. Written as JSON (``--out``;
``data/benchmarks/lm_eviction_<gpu>.json``) with the GPU, versions, command and commit, after every configuration
(``complete`` true at the end, so a run cut short keeps its rows); :func:`topo_attn.lm.results.load_lm_eviction`
reads it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from .. import cli
from ..eviction import POLICIES
from ..provenance import run_record
from ..schedule import num_blocks
from . import intervals
from .evaluate import bits_per_byte, passkey_scores, token_losses
from .evicted_model import EvictedModel, check_budget_fits
from .results import LM_EVICTION_SUITE
from .retrieval import TASKS, held_out_formats
from .retrieval_runner import build_probes
from .study import add_common_arguments, check_common_arguments, eval_set_path, load_documents, load_model

PROG = "python -m topo_attn.lm eviction"
DEFAULT_FRACTIONS = (0.25, 0.125)
INTERVAL = ("retrieval ci_low, ci_high: 95% percentile bootstrap (topo_attn.lm.intervals.bootstrap_interval, 10000 "
            "resamples, seed 0); wilson_low, wilson_high: 95% Wilson score interval; minus_dense_low, "
            "minus_dense_high: 95% paired bootstrap of the difference from dense on the same probes")
MEMORY = ("peak_tokens: the most tokens a layer's cache held during the continuation (the budget plus the block "
          "being completed); memory_fraction = peak_tokens / length (the full cache at the end of the document); "
          "kv_bytes, full_kv_bytes: keys and values of every layer per document in the run's dtype; the prefill "
          "holds the prefix's tokens before the first choice, for every policy alike")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, "held-out documents whose continuation is scored (also the probes' filler)")
    parser.set_defaults(documents=8, probes=8)
    for action in parser._actions:  # the common --probes, here per task and distance
        if action.dest == "probes":
            action.help = "retrieval probes per task and distance (default 8)"
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES),
                        help="eviction policies of topo_attn.eviction (default: all); dense always runs")
    parser.add_argument("--cache-fractions", type=float, nargs="+", default=list(DEFAULT_FRACTIONS),
                        metavar="FRACTION", help="budgets as fractions of the context's blocks, in (0, 1] "
                                                 "(default: 0.25 0.125)")
    parser.add_argument("--prefix", type=int, default=None,
                        help="bytes prefilled with dense attention before the first choice (default: half the length)")
    parser.add_argument("--observation", type=int, default=32, help="SnapKV's observation window, in queries")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS),
                        help="retrieval tasks of topo_attn.lm.retrieval (default: all)")
    parser.add_argument("--distances", type=int, nargs="+", default=None,
                        help="bytes from the needle's value to the answer, each > length - prefix (the needle in the "
                             "prefix; default: length - prefix // 2)")
    parser.add_argument("--no-retrieval", dest="retrieval", action="store_false", help="perplexity and memory only")
    parser.add_argument("--batch", type=int, default=4, help="documents or probes per forward")


def build_parser(add_help: bool = True) -> argparse.ArgumentParser:
    """``python -m topo_attn.lm eviction``'s command line (``add_help=False``: as a parent parser)."""
    return cli.command_parser(PROG, __doc__, add_arguments, add_help)


def keep_blocks(fraction: float, blocks: int) -> int:
    """The budget of a cache fraction: ``floor(fraction * blocks)`` blocks (never more than the fraction)."""
    return math.floor(fraction * blocks + 1e-9)


def sizes(args: argparse.Namespace) -> tuple[int, int]:
    """``(length, prefix)``: ``--length`` (default the documents' length) and ``--prefix`` (default half of it)."""
    length = args.length
    if length is None:
        with np.load(eval_set_path(args), allow_pickle=False) as data:
            length = int(data["documents"].shape[1])
    return length, length // 2 if args.prefix is None else args.prefix


def default_distances(length: int, prefix: int) -> list[int]:
    """The needle's value in the middle of the prefix: ``[length - prefix // 2]``."""
    return [length - prefix // 2]


def check_args(args: argparse.Namespace) -> None:
    """Raise :class:`~topo_attn.cli.UsageError` for values that would fail late or unclearly: a count below 1, a
    cache fraction outside ``(0, 1]`` or whose budget does not fit the prefix (the budget rule of
    :mod:`topo_attn.eviction`), a ``--prefix`` not shorter than the length, a ``--length`` beyond the documents, a
    distance that puts the needle outside the prefix, an ``--out`` whose folder does not exist, and those of
    :func:`~topo_attn.lm.study.check_common_arguments` (any block size ``>= 1``; the model folder and evaluation
    set)."""
    for option, value in (("--prefix", args.prefix), ("--observation", args.observation), ("--batch", args.batch)):
        cli.check_at_least(option, value, 1)
    cli.check_at_least("--distances", args.distances, 1, "distance")
    outside = [f for f in args.cache_fractions if not 0 < f <= 1]
    if outside:
        raise cli.UsageError(f"argument --cache-fractions: each must lie in (0, 1], got {outside}")
    check_common_arguments(args, kernel_block_size=False)
    with np.load(eval_set_path(args), allow_pickle=False) as data:
        available = int(data["documents"].shape[1])
    if args.length is not None and args.length > available:
        raise cli.UsageError(f"argument --length: the documents hold {available} bytes, got {args.length}")
    length, prefix = sizes(args)
    if not 1 <= prefix < length:
        raise cli.UsageError(f"argument --prefix: expected 1 <= prefix < length ({length}), got {prefix}")
    blocks = num_blocks(length, args.block_size)
    for fraction in args.cache_fractions:
        keep = keep_blocks(fraction, blocks)
        try:
            check_budget_fits(prefix, keep, args.block_size, args.sinks, args.window)
        except ValueError as error:
            raise cli.UsageError(f"argument --cache-fractions: {fraction} of {blocks} blocks keeps {keep} of the "
                                 f"prefix's {num_blocks(prefix, args.block_size)}: {error}") from error
    far = [d for d in args.distances or () if not length - prefix < d < length]
    if far:
        raise cli.UsageError(f"argument --distances: {far} do not put the needle in the prefix (expected "
                             f"{length - prefix} < distance < {length})")
    if args.out and (Path(args.out).is_dir() or not Path(args.out).parent.is_dir()):
        raise cli.UsageError(f"argument --out: expected a JSON file in an existing folder, got {args.out}")


def check_probes(probes: list, prefix: int) -> None:
    """Each probe's first needle line ends inside the prefix and its answer is predicted in the continuation;
    else ``ValueError`` naming ``--distances`` or ``--prefix``."""
    for probe in probes:
        if int(probe.needles[0, 1]) > prefix:
            raise ValueError(f"argument --distances: a {probe.task} needle at distance {probe.distance} ends at byte "
                             f"{int(probe.needles[0, 1])}, after the prefix ({prefix}); expected a larger distance")
        if int(probe.targets[0]) - 1 < prefix:
            raise ValueError(f"argument --prefix: a {probe.task} answer starts at byte {int(probe.targets[0])}, "
                             f"inside the prefix ({prefix}); expected a shorter prefix")


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """Bytes of keys and values one token takes in every layer's cache."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def retrieval_cells(probes: list, correct: list[bool], dense: list[bool] | None) -> dict[str, dict]:
    """Per task (in the probes' order), the accuracy of ``correct`` (one outcome per probe) with its intervals and,
    when ``dense`` is given, the paired difference from it."""
    cells = {}
    for task in dict.fromkeys(p.task for p in probes):
        at = [i for i, p in enumerate(probes) if p.task == task]
        mine = [correct[i] for i in at]
        boot, wilson = intervals.bootstrap_interval(mine), intervals.wilson_interval(mine)
        cell = dict(accuracy=boot.accuracy, n=boot.n, ci_low=boot.ci_low, ci_high=boot.ci_high,
                    wilson_low=wilson.ci_low, wilson_high=wilson.ci_high)
        if dense is not None:
            diff = intervals.paired_difference(mine, [dense[i] for i in at])
            cell.update(minus_dense=diff.difference, minus_dense_low=diff.ci_low, minus_dense_high=diff.ci_high)
        cells[task] = cell
    return cells


def eviction_study(args: argparse.Namespace, argv: list[str] | None = None) -> dict:
    """Everything of the module docstring for parsed (and checked, :func:`check_args`) ``args``; the results as a
    dict (and JSON at ``args.out``)."""
    from tqdm.auto import tqdm

    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if args.device != "cpu" else torch.float32)
    length, prefix = sizes(args)
    model = load_model(args.model, args.device, dtype)
    docs = load_documents(eval_set_path(args), args.documents, length)
    ids = torch.from_numpy(docs.astype(np.int64))
    blocks = num_blocks(length, args.block_size)
    keeps = {f: keep_blocks(f, blocks) for f in args.cache_fractions}
    distances = list(args.distances) if args.distances else default_distances(length, prefix)
    probes = []
    if args.retrieval:
        probes = build_probes(docs, list(args.tasks), distances, args.probes, args.seed, max(keeps.values()),
                              args.block_size)
        check_probes(probes, prefix)
    per_token = kv_bytes_per_token(model.config, dtype)
    configs = [(None, 1.0, None)] + [(p, f, keeps[f]) for p in args.policies for f in args.cache_fractions]
    rows, dense = [], None
    result = dict(
        suite=LM_EVICTION_SUITE, model=str(args.model),
        **run_record(args.device, f"{PROG} " + " ".join(argv if argv is not None else sys.argv[2:])),
        complete=False, eval_set=str(eval_set_path(args)),
        documents=len(docs), length=length, prefix=prefix, block_size=args.block_size, context_blocks=blocks,
        sinks=args.sinks, window=args.window, observation=args.observation, seed=args.seed,
        dtype=str(dtype).removeprefix("torch."), policies=list(args.policies),
        cache_fractions=list(args.cache_fractions),
        tasks=list(args.tasks) if probes else [], distances=distances if probes else [],
        probes_per_cell=args.probes if probes else 0,
        formats={task: list(held_out_formats(task)) for task in args.tasks} if probes else {},
        scoring="bits per byte of the bytes the continuation's positions predict (topo_attn.lm.evaluate."
                "token_losses); retrieval: exact match of the answer under greedy prediction "
                "(topo_attn.lm.evaluate.passkey_scores); both through topo_attn.lm.evicted_model.EvictedModel: "
                "dense prefill, then the evicted cache, no look-ahead",
        memory=MEMORY, interval=INTERVAL, rows=rows, seconds=0.0)
    started = time.perf_counter()
    for policy, fraction, keep in tqdm(configs, desc="eviction", disable=not cli.progress_enabled(args.progress)):
        begun = time.perf_counter()
        evicted = EvictedModel(model, prefix, policy, keep, args.block_size, args.sinks, args.window,
                               args.observation, args.seed)
        losses = token_losses(evicted, ids, batch=args.batch)[:, prefix:]  # bytes prefix + 1 .. length - 1
        correct = [bool(r["exact"]) for r in passkey_scores(evicted, probes, batch=args.batch)] if probes else []
        bits = bits_per_byte(losses, buckets=())["all"]
        rows.append(dict(
            policy=policy or "dense", cache_fraction=fraction, keep_blocks=blocks if keep is None else keep,
            query_blind=None if policy is None else not POLICIES[policy].query_aware, bits_per_byte=bits,
            n_bytes=int(losses.numel()), bits_per_byte_minus_dense=0.0 if dense is None
            else bits - dense["bits_per_byte"], peak_tokens=evicted.peak_tokens,
            kv_bytes=evicted.peak_tokens * per_token, full_kv_bytes=length * per_token,
            memory_fraction=evicted.peak_tokens / length,
            retrieval=retrieval_cells(probes, correct, None if dense is None else dense["correct"]),
            seconds=time.perf_counter() - begun))
        if dense is None:
            dense = dict(bits_per_byte=bits, correct=correct)
        result["seconds"] = time.perf_counter() - started
        write(result, args.out)
    result["complete"] = True
    write(result, args.out)
    return result


def write(result: dict, out: str | None) -> None:
    """``result`` as JSON at ``out`` (nothing when None)."""
    if out:
        Path(out).write_text(json.dumps(result, indent=1))


def markdown(result: dict) -> str:
    """Per configuration: the budget, the memory kept, bits per byte (and the change from dense) and the retrieval
    accuracy per task with its bootstrap interval."""
    tasks = list(result["tasks"])
    head = ["policy", "cache", "keep", "memory", "bits/byte", "vs dense", *tasks]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in result["rows"]:
        cells = [r["policy"], f"{r['cache_fraction']:.3g}", str(r["keep_blocks"]), f"{r['memory_fraction']:.1%}",
                 f"{r['bits_per_byte']:.3f}", f"{r['bits_per_byte_minus_dense']:+.3f}"]
        for task in tasks:
            cells.append(intervals.accuracy_text(r["retrieval"][task]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command line (``argv`` without ``eviction``; ``sys.argv[2:]`` when None): print the table. Raises
    :class:`~topo_attn.cli.UsageError` for a bad value (:func:`check_args`) before anything loads."""
    argv = sys.argv[2:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    check_args(args)
    print(markdown(eviction_study(args, argv)))
    return 0
