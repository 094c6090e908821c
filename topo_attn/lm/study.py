"""``python -m topo_attn.lm evaluate``: how much of a causal LM's quality each selector keeps, at which visited
fraction, and at what speed.

For a model folder (default ``data/lm``, the kit's model) and its held-out documents (``eval_set.npz``: a
``documents`` array ``uint8 [N, L]``; the model's tokens are bytes), with the kit's transformers backend
(:mod:`topo_attn.integrations.transformers`, every layer sparse unless ``--dense-layers``):

With ``--strict`` each query block takes the blocks the query block before it scored
(``topo_attn.selection.select(strict=True)``), so no position's attention depends on a later byte: the
perplexity of a row-pooled choice otherwise includes a small look-ahead inside each query block. The query heads
of a key/value head choose their blocks together (the kernels' lanes); ``--per-query-head`` has every query head
choose its own.

``--granularity token`` (not with ``--strict``; the selectors of
:data:`~topo_attn.lm.token_attention.TOKEN_SELECTORS` only, all of them by default) has each query token choose
its key blocks from its own query, among the complete blocks before its own, as a decode step with a KV cache
does (:mod:`topo_attn.lm.token_attention`: torch's SDPA with a per-token mask, no kernel): leak-free and not
stale. ``sdpa`` and ``dense`` run as with block granularity; the visited fraction counts per token (equal to
the block backend's at the same sizes); the recall and speed rows, which are about the block schedules and
the kernels, are skipped with a note (``notes`` in the JSON).

- **perplexity**: bits per byte, overall and by position bucket (and per document,
  ``bits_per_byte_per_document``, for paired intervals), for ``sdpa``, the kit's ``dense`` and every selector of
  :data:`SELECTORS` at every budget, with the visited fraction of the causal blocks achieved;
- **retrieval**: the passkey probe (:mod:`.probe`) at distances from 1k to the context: exact-match rate and
  loss on the repeated value's bytes, for the same configurations;
- **recall**: per layer and head, the attention-mass recall of each selector's schedule
  (:func:`topo_attn.selection.schedule_quality`) on the model's own queries and keys of one document;
- **speed** (a GPU only): the whole model's prefill at the context length with ``sdpa`` and the kit's backend
  (:func:`topo_attn.prefill_speed.prefill_speed_rows`, schedule builds included).

Results are written as JSON (``--out``) with the GPU, versions, command and commit: rewritten after every
configuration's perplexity and retrieval and after every speed row, with ``partial`` saying what is missing
until the run completes, so a run stopped by a time limit keeps what it finished.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import zipfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch

from .. import cli
from .._checks import SUPPORTED_DTYPES, check_kernel_block_size
from ..prefill_speed import COMPILE_MODES, prefill_speed_rows
from ..provenance import ROOT, run_record
from ..schedule import num_blocks
from ..selection import full_attention, names, schedule_quality, select
from .evaluate import bits_per_byte, document_bits_per_byte, passkey_scores, token_losses
from .results import LM_SUITE
from .token_attention import TOKEN_SELECTORS, register_token_selection
from .token_attention import last_stats as token_last_stats
from .train import check_device, probe_distances, probe_set

SELECTORS = names("block")
"""The sparse selectors evaluated (every selector of :mod:`topo_attn.selection`'s registry)."""

DEFAULT_MODEL = ROOT / "data" / "lm"
PROG = "python -m topo_attn.lm evaluate"
DTYPES = tuple(str(dtype).removeprefix("torch.") for dtype in SUPPORTED_DTYPES)
"""The ``--dtype`` names: the dtypes the kit's kernels take."""
MODEL_EXPECTED = ("a model folder with config.json and the weights (*.safetensors), as "
                  "python -m topo_attn.lm train --out FOLDER writes one")
EVAL_SET_EXPECTED = "an .npz file with a 'documents' array uint8 [N, L] (the held-out documents)"
BACKEND = "topo_attn_evaluate"
TOKEN_BACKEND = "topo_attn_token_evaluate"
TOKEN_SKIPPED = ("recall and speed rows skipped for --granularity token: they measure the block schedules "
                 "(recall) and the kernels (speed), not per-token selection")
CAPTURE = "topo_attn_capture"


def load_model(path: str | Path, device: str, dtype: torch.dtype):
    """``LlamaForCausalLM``-like model of the folder ``path`` (``AutoModelForCausalLM``) in eval mode."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").to(device).eval()


def load_documents(path: str | Path, count: int | None = None, length: int | None = None) -> np.ndarray:
    """The ``documents`` (``uint8 [N, L]``) of an ``.npz`` file, the first ``count`` of them, cut to ``length``.
    Raises ``ValueError`` when the file holds fewer documents or shorter ones."""
    docs = np.load(path)["documents"]
    count = len(docs) if count is None else count
    length = docs.shape[1] if length is None else length
    if docs.ndim != 2 or len(docs) < count or docs.shape[1] < length:
        raise ValueError(f"{path} holds documents of shape {docs.shape}; expected at least [{count}, {length}]")
    return docs[:count, :length]


def configurations(budgets: list[int], selectors: tuple[str, ...] = SELECTORS) -> list[tuple[str, int | None]]:
    """``(attention, budget)``: ``sdpa``, the kit's ``dense``, ``window`` once (when among ``selectors``), and
    every other selector of ``selectors`` at every budget. Raises ``ValueError`` for a name outside
    :data:`SELECTORS`."""
    unknown = sorted(set(selectors) - set(SELECTORS))
    if unknown:
        raise ValueError(f"selectors must be among {list(SELECTORS)}, got {unknown}")
    out = [("sdpa", None), ("dense", None)] + ([("window", 0)] if "window" in selectors else [])
    return out + [(s, b) for s in SELECTORS if s in selectors and s != "window" for b in budgets]


def chosen_selectors(args: argparse.Namespace) -> tuple[str, ...]:
    """The selectors to evaluate: ``--selectors``, or by default every selector of :data:`SELECTORS` (block
    granularity) or of :data:`~topo_attn.lm.token_attention.TOKEN_SELECTORS` (token granularity). Raises
    ``ValueError`` for token granularity with ``--strict`` or with a selector it does not have."""
    if args.granularity == "block":
        return tuple(args.selectors or SELECTORS)
    if args.strict:
        raise ValueError("--strict is for --granularity block: token granularity has no look-ahead to remove")
    if args.per_query_head:
        raise ValueError("--per-query-head is for --granularity block: at token granularity every query token "
                         "of every head chooses its own blocks")
    others = sorted(set(args.selectors or ()) - set(TOKEN_SELECTORS))
    if others:
        raise ValueError(f"--granularity token takes the selectors {list(TOKEN_SELECTORS)}, got {others}")
    return tuple(args.selectors or [s for s in SELECTORS if s in TOKEN_SELECTORS])


def _strict(attention: str, args) -> bool:
    """Whether ``attention`` runs with ``strict=True``: ``--strict`` asked for it and the selector has row scores
    (not ``dense``, not ``topology_22``)."""
    return args.strict and attention not in ("dense", "topology_22")


def selection_options(attention: str, args) -> dict:
    """The selector options of ``attention`` (block granularity): ``strict`` (:func:`_strict`) and, with
    ``--per-query-head``, ``per_query_head`` (every query head chooses its own blocks; by default the query heads
    of a key/value head choose together)."""
    options = {"strict": True} if _strict(attention, args) else {}
    if args.per_query_head and attention != "dense":
        options["per_query_head"] = True
    return options


def use_attention(model, attention: str, budget: int | None, args) -> str | None:
    """Switch ``model`` to ``attention``; the backend name of the kit (None for sdpa)."""
    from ..integrations import transformers as tat

    if attention == "sdpa":
        model.set_attn_implementation("sdpa")
        return None
    if args.granularity == "token" and attention != "dense":
        name = register_token_selection(attention, args.block_size, args.sinks, args.window, budget or 0,
                                        name=TOKEN_BACKEND)
        model.set_attn_implementation(name)
        return name
    name = tat.register(selector=attention, block_size=args.block_size, sinks=args.sinks, window=args.window,
                        budget=budget or 0, dense_layers=args.dense_layers, name=BACKEND,
                        options=selection_options(attention, args))
    model.set_attn_implementation(name)
    return name


def _visited(name: str | None) -> tuple[int, int]:
    """Scheduled and causal block pairs of the last forward over all layers (the dense count for sdpa: 0, 0);
    for the token backend, visible and causal key blocks summed over tokens."""
    from ..integrations import transformers as tat

    if name is None:
        return 0, 0
    if name == TOKEN_BACKEND:
        stats = token_last_stats(name).values()
        return sum(s.visited_blocks for s in stats), sum(s.causal_blocks for s in stats)
    stats = tat.last_stats(name).values()
    return sum(s.scheduled_blocks for s in stats), sum(s.causal_blocks for s in stats)


def quality_rows(model, docs: np.ndarray, args, progress: bool | None = True,
                 configs: list[tuple[str, int | None]] | None = None,
                 after_config: Callable[[list[dict], list[dict], int, int], None] | None = None
                 ) -> tuple[list[dict], list[dict]]:
    """Perplexity rows and retrieval rows for every configuration (see the module docstring), or for the
    ``(attention, budget)`` pairs of ``configs`` when given (``sdpa``, ``dense`` or a selector; what
    ``python -m topo_attn.lm native`` evaluates); a progress bar when ``progress`` (None: when stderr is a
    terminal). ``after_config(perplexity, retrieval, done, total)`` is called with the rows so far after each
    configuration (so a caller can keep them if the run is cut short)."""
    from tqdm.auto import tqdm

    ids = torch.from_numpy(docs.astype(np.int64))
    probes = probe_set(docs, probe_distances(docs.shape[1]), args.probes, seed=args.seed)
    perplexity, retrieval = [], []
    configs = configurations(args.budgets, chosen_selectors(args)) if configs is None else configs
    for attention, budget in tqdm(configs, desc="perplexity and retrieval",
                                      disable=not cli.progress_enabled(progress)):
        started = time.perf_counter()
        name = use_attention(model, attention, budget, args)
        losses, scheduled, causal = [], 0, 0
        for start in range(0, len(ids), args.batch):
            losses.append(token_losses(model, ids[start:start + args.batch], batch=args.batch))
            s, c = _visited(name)
            scheduled, causal = scheduled + s, causal + c
        visited = scheduled / causal if causal else 1.0
        losses = torch.cat(losses)
        perplexity.append(dict(attention=attention, budget=budget, granularity=args.granularity,
                               visited_fraction=visited,
                               bits_per_byte=bits_per_byte(losses),
                               bits_per_byte_per_document=document_bits_per_byte(losses),
                               documents=len(ids),
                               seconds=time.perf_counter() - started))
        scores = passkey_scores(model, probes, batch=args.batch)
        for distance in sorted({r["distance"] for r in scores}):
            at = [r for r in scores if r["distance"] == distance]
            retrieval.append(dict(attention=attention, budget=budget, granularity=args.granularity,
                                  visited_fraction=visited, distance=distance,
                                  exact=sum(r["exact"] for r in at) / len(at), probes=len(at),
                                  loss=sum(r["loss"] for r in at) / len(at)))
        if after_config is not None:
            after_config(perplexity, retrieval, len(perplexity), len(configs))
    return perplexity, retrieval


def capture_qkv(model, ids: torch.Tensor) -> dict:
    """Per layer index, the ``(query, key, value)`` the model's attention received for ``ids`` ``[1, L]``
    (after RoPE; keys and values not repeated for GQA), from one SDPA forward."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    captured = {}

    def capture(module, query, key, value, attention_mask, **kwargs):
        captured[module.layer_idx] = (query.detach(), key.detach(), value.detach())
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(CAPTURE, capture)
    model.set_attn_implementation(CAPTURE)
    with torch.no_grad():
        model(ids.to(next(model.parameters()).device))
    model.set_attn_implementation("sdpa")
    return captured


def recall_rows(model, doc: np.ndarray, args, progress: bool | None = True) -> list[dict]:
    """Per selector, budget and layer: the attention-mass recall of each query head (mean over its rows) on
    ``doc``'s queries and keys."""
    from tqdm.auto import tqdm

    captured = capture_qkv(model, torch.from_numpy(doc.astype(np.int64))[None])
    rows = []
    for layer, (q, k, v) in tqdm(sorted(captured.items()), desc="recall",
                                   disable=not cli.progress_enabled(progress)):
        reference = full_attention(q, k, v, args.block_size)
        for attention, budget in configurations(args.budgets, chosen_selectors(args))[2:]:
            options = selection_options(attention, args)
            if attention == "oracle":
                options["scale"] = 1 / math.sqrt(q.shape[-1])
            schedule = select(attention, q, k, args.block_size, args.sinks, args.window, budget, **options)
            quality = schedule_quality(q, k, v, schedule, reference=reference)
            counts = schedule.counts()
            rows.append(dict(attention=attention, budget=budget, layer=layer,
                             visited_fraction=counts.scheduled_blocks / counts.causal_blocks,
                             recall=[float(r) for r in quality.recall.cpu()]))
    return rows


def speed_rows(model, args, after_row: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """The model's prefill at the documents' length with ``sdpa`` and the kit's backend
    (:func:`topo_attn.prefill_speed.prefill_speed_rows`, FlexAttention with ``--flex``); a GPU only. With
    ``--selectors``, the kit's rows are its ``dense`` and those selectors' (else every selector's).
    ``after_row(rows)``: called with the rows so far after each attention."""
    name = f"kit LM S{args.length // 1024}k b{args.block_size}"
    mode = getattr(args, "compile_mode", None)
    chosen = getattr(args, "selectors", None)
    return prefill_speed_rows(model, name, args.length, args.block_size, sinks=args.sinks, window=args.window,
                              with_flex=args.flex, selectors=None if chosen is None else ("dense", *chosen),
                              after_row=after_row,
                              compile=None if mode is None else partial(torch.compile, mode=mode))


def add_common_arguments(parser: argparse.ArgumentParser, documents_help: str) -> None:
    """The arguments every evaluation command of :mod:`topo_attn.lm` takes: the model and its held-out documents,
    the probes, the block sizes of the rule, the seed, device, dtype, output file and progress bar."""
    parser.add_argument("--model", default=str(DEFAULT_MODEL), help="model folder (default: data/lm)")
    parser.add_argument("--eval-set", default=None, help="documents .npz (default: <model>/eval_set.npz)")
    parser.add_argument("--documents", type=int, default=16, help=documents_help)
    parser.add_argument("--length", type=int, default=None, help="bytes per document (default: all)")
    parser.add_argument("--probes", type=int, default=16, help="passkey probes per distance")
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--sinks", type=int, default=1)
    parser.add_argument("--window", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, choices=DTYPES, help="default: bfloat16 on a GPU, float32 on the CPU")
    parser.add_argument("--out", default=None, help="JSON file for the results")
    cli.add_progress_argument(parser)


def check_model_folder(path: str | Path) -> Path:
    """``path`` as a ``Path`` when it is a model folder (a folder with ``config.json``), else a
    :class:`~topo_attn.cli.UsageError` for ``--model`` saying what is missing and what is expected (transformers
    would read a missing folder as a Hub repository name)."""
    folder = Path(path)
    if not folder.is_dir():
        raise cli.UsageError(f"argument --model: no folder {path}; expected {MODEL_EXPECTED}")
    if not (folder / "config.json").is_file():
        raise cli.UsageError(f"argument --model: {path} has no config.json; expected {MODEL_EXPECTED}")
    return folder


def eval_set_path(args: argparse.Namespace) -> Path:
    """``--eval-set``, or ``<model>/eval_set.npz`` by default."""
    return Path(args.eval_set) if args.eval_set else Path(args.model) / "eval_set.npz"


def check_eval_set(args: argparse.Namespace) -> Path:
    """The evaluation set's path (:func:`eval_set_path`) when the file exists and holds a ``documents`` array,
    else a :class:`~topo_attn.cli.UsageError` naming the file and what is expected there."""
    path = eval_set_path(args)
    given = "argument --eval-set:" if args.eval_set else "argument --eval-set (default <model>/eval_set.npz):"
    if not path.is_file():
        raise cli.UsageError(f"{given} no file {path}; expected {EVAL_SET_EXPECTED}")
    if not zipfile.is_zipfile(path):
        raise cli.UsageError(f"{given} {path} is not an .npz file; expected {EVAL_SET_EXPECTED}")
    with np.load(path, allow_pickle=False) as data:
        names = list(data.files)
    if "documents" not in names:
        raise cli.UsageError(f"{given} {path} holds the arrays {names}, no 'documents'; expected {EVAL_SET_EXPECTED}")
    return path


def check_common_arguments(args: argparse.Namespace, kernel_block_size: bool = True) -> None:
    """Raise :class:`~topo_attn.cli.UsageError` for a value of :func:`add_common_arguments` that would fail late
    or unclearly: a count below 1, a negative number, a block size the kit's kernels do not take
    (``kernel_block_size``; else any size >= 1), an unusable device, a missing model folder or evaluation set
    (the files last)."""
    cli.check_at_least("--documents", getattr(args, "documents", None), 1)
    cli.check_at_least("--length", args.length, 1)
    cli.check_at_least("--probes", getattr(args, "probes", None), 1)
    if kernel_block_size:
        cli.check_option("--block-size", lambda: check_kernel_block_size(args.block_size))
    else:
        cli.check_at_least("--block-size", args.block_size, 1)
    cli.check_at_least("--sinks", args.sinks, 0)
    cli.check_at_least("--window", args.window, 0)
    cli.check_at_least("--budgets", getattr(args, "budgets", None), 0, "budget")
    check_device("--device", args.device)
    check_model_folder(args.model)
    check_eval_set(args)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, "held-out documents for perplexity")
    parser.add_argument("--budgets", type=int, nargs="+", default=[2, 6, 14, 30],
                        help="extra key blocks per query block beyond sinks and window")
    parser.add_argument("--selectors", nargs="+", default=None, choices=SELECTORS,
                        help="selectors to evaluate (default: all, those of token granularity with it)")
    parser.add_argument("--dense-layers", type=int, nargs="*", default=[])
    parser.add_argument("--strict", action="store_true",
                        help="selection without look-ahead: each query block takes the blocks the query block "
                             "before it scored (topo_attn.selection.select(strict=True); not topology_22)")
    parser.add_argument("--per-query-head", action="store_true",
                        help="every query head chooses its own key blocks (default: the query heads of a "
                             "key/value head choose together, as the kernels' lanes do)")
    parser.add_argument("--granularity", choices=("block", "token"), default="block",
                        help="who chooses key blocks: each query block (the kit's kernels; default) or each query "
                             f"token from its own query (topo_attn.lm.token_attention; {', '.join(TOKEN_SELECTORS)}; "
                             "not with --strict; no recall or speed rows)")
    parser.add_argument("--batch", type=int, default=4, help="documents per forward")
    parser.add_argument("--no-recall", dest="recall", action="store_false")
    parser.add_argument("--no-speed", dest="speed", action="store_false")
    parser.add_argument("--flex", action="store_true", help="time transformers' flex_attention too (slow to compile)")
    parser.add_argument("--compile", choices=COMPILE_MODES, default=None, dest="compile_mode",
                        help="time the speed rows on torch.compile(model.forward, mode=...) (no FlexAttention; "
                             "selectors whose schedules wait for the host skipped)")


def check_args(args: argparse.Namespace) -> None:
    """Raise :class:`~topo_attn.cli.UsageError` for parsed ``args`` that :func:`evaluate` would reject late or
    unclearly (:func:`chosen_selectors`, ``--dense-layers``, ``--batch``, :func:`check_common_arguments`)."""
    try:
        chosen_selectors(args)
    except ValueError as error:
        raise cli.UsageError(str(error)) from error
    cli.check_at_least("--dense-layers", args.dense_layers, 0, "a dense layer")
    cli.check_at_least("--batch", args.batch, 1)
    check_common_arguments(args)


def evaluate(args: argparse.Namespace, argv: list[str] | None = None) -> dict:
    """Everything of the module docstring for parsed ``args``; the results as a dict. Raises ``ValueError``
    for token granularity with ``--strict`` or a selector it does not have (:func:`chosen_selectors`)."""
    chosen_selectors(args)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if args.device != "cpu" else torch.float32)
    model = load_model(args.model, args.device, dtype)
    docs = load_documents(eval_set_path(args), args.documents, args.length)
    args.length = docs.shape[1]
    started = time.perf_counter()
    result = dict(
        suite=LM_SUITE, model=str(args.model),
        **run_record(args.device, "python -m topo_attn.lm evaluate " + " ".join(argv if argv is not None
                                                                                else sys.argv[2:])),
        documents=len(docs), length=args.length, block_size=args.block_size, sinks=args.sinks,
        window=args.window, strict=args.strict, per_query_head=args.per_query_head, granularity=args.granularity,
        dense_layers=list(args.dense_layers),
        dtype=str(dtype).removeprefix("torch."),
        causal_blocks_per_lane=num_blocks(args.length, args.block_size) * (num_blocks(args.length, args.block_size)
                                                                            + 1) // 2,
        perplexity=[], retrieval=[])

    def keep(partial: str | None) -> None:
        """Write the result so far to ``--out`` (``partial`` says what is missing; None when complete)."""
        if not args.out:
            return
        result.pop("partial", None)
        if partial is not None:
            result["partial"] = partial
        Path(args.out).write_text(json.dumps(result, indent=1))

    def after_config(perplexity: list[dict], retrieval: list[dict], done: int, total: int) -> None:
        result.update(perplexity=perplexity, retrieval=retrieval)
        keep(f"perplexity and retrieval of {done} of {total} configurations so far")

    quality_rows(model, docs, args, args.progress, after_config=after_config)
    if args.granularity == "token":
        result["notes"] = [TOKEN_SKIPPED]
    else:
        timed = args.speed and args.device != "cpu"
        if args.recall or timed:
            keep("perplexity and retrieval done; the recall and speed rows not yet")
        if args.recall:
            result["recall"] = recall_rows(model, docs[0], args, args.progress)
        if timed:
            def after_row(rows: list[dict]) -> None:
                result["speed"] = rows
                keep(f"speed rows of {len(rows)} attentions so far")

            result["speed"] = speed_rows(model, args, after_row=after_row)
    result["seconds"] = time.perf_counter() - started
    keep(None)
    return result


def build_parser(add_help: bool = True) -> argparse.ArgumentParser:
    """``python -m topo_attn.lm evaluate``'s command line (``add_help=False``: as a parent parser)."""
    return cli.command_parser(PROG, __doc__, add_arguments, add_help)


def main(argv: list[str] | None = None) -> int:
    """The command line (``argv`` without ``evaluate``; ``sys.argv[2:]`` when None): print the summary table.
    Raises :class:`~topo_attn.cli.UsageError` for a bad value (:func:`check_args`) before anything loads."""
    argv = sys.argv[2:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    check_args(args)
    result = evaluate(args, argv)
    print(summary_table(result))
    for note in result.get("notes", []):
        print(f"note: {note}")
    return 0


def summary_table(result: dict) -> str:
    """Markdown: per configuration the visited fraction, bits per byte (all and per bucket) and the passkey
    exact-match rate per distance."""
    buckets = [k for k in result["perplexity"][0]["bits_per_byte"] if k != "all"]
    distances = sorted({r["distance"] for r in result["retrieval"]})
    head = ["attention", "budget", "visited", "bits/byte", *buckets, *[f"passkey @{d}" for d in distances]]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    exact = {(r["attention"], r["budget"], r["distance"]): r["exact"] for r in result["retrieval"]}
    for r in result["perplexity"]:
        cells = [r["attention"], "" if r["budget"] is None else str(r["budget"]), f"{r['visited_fraction']:.1%}",
                 f"{r['bits_per_byte']['all']:.3f}", *[f"{r['bits_per_byte'][b]:.3f}" for b in buckets],
                 *[f"{exact[(r['attention'], r['budget'], d)]:.0%}" for d in distances]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
