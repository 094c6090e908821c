"""Training the kit's byte-level long-context language model (``python -m topo_attn.lm train``).

A Llama-architecture model (transformers' ``LlamaForCausalLM``: RoPE, grouped-query attention, SwiGLU) over
bytes (vocabulary 256, no special tokens), trained with dense attention (SDPA; or, with
``TrainSettings.attention``, the kit's sparse attention from the first step: :func:`use_attention`) on
:mod:`.corpus`: random windows of ``context + 1`` bytes of the training files (packed in a seeded order of their
contents, :func:`.corpus.packing_order`). A share ``copy_fraction`` of the windows get copy content
(:func:`.training_copies.copy_window`): 1 to ``max_copies`` probes of the retrieval tasks of :mod:`.retrieval`
(a needle among decoys, an ordinary assignment, multi-key, multi-value, variable tracking) in their **training**
formats only, built into the window's own text, so that the model learns to copy and retrieve across distance;
the held-out formats stay for the evaluation (``python -m topo_attn.lm retrieval``). AdamW, linear warm-up then
cosine decay to 10%, bfloat16 autocast on a GPU. Everything is seeded; the run writes, into its output folder,
the checkpoint (``config.json``, ``model.safetensors`` in bfloat16), ``train_log.jsonl`` (one JSON line per
logged step and evaluation), ``corpus_manifest.json.gz`` and the evaluation set of
:func:`.corpus.build_eval_set` (``eval_set.npz`` and ``eval_set.json``, :func:`.corpus.save_eval_set`): one
window of ``context`` bytes per deduplicated validation file, ``eval_documents`` files of at least
:func:`eval_packages` packages and the standard library, with its file list.
"""

from __future__ import annotations

import gzip
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from numbers import Real
from pathlib import Path

import numpy as np
import torch

from .._checks import check_int, check_kernel_block_size
from ..cli import progress_enabled
from .corpus import (EVAL_FILES, MIN_PACKAGES, SEPARATOR, build_eval_set, find_sources, manifest, pack,
                     save_eval_set)
from .evaluate import bits_per_byte, passkey_scores, token_losses
from .init_weights import batch_seed, check_folder, load_init
from .probe import passkey_document
from .training_copies import copy_window, task_weights


@dataclass(frozen=True)
class ModelShape:
    """The model's shape (a ``LlamaConfig`` with vocabulary 256 and no special tokens)."""

    layers: int = 8
    hidden: int = 512
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 64
    intermediate: int = 1536
    rope_theta: float = 100000.0


@dataclass(frozen=True)
class TrainSettings:
    """What a training run does. Its defaults are the committed model's schedule and sizes; its copy content
    and evaluation set have changed since (issue 41: retrieval tasks in training formats, the per-file set), so
    the committed model (``data/lm``) predates them. ``steps``: the length of the learning-rate schedule;
    ``stop_after``: stop after this many steps all the same (None: run them all); ``max_minutes``: stop after
    the first step that ends past this training time (the committed model was trained with ``steps=4000,
    max_minutes=6.3`` and stopped after 3358 steps; ``stop_after=3358`` repeats that length without the clock).
    Neither shortens the schedule: a run they stop early ends at a higher learning rate (its log's ``stopped``
    and ``final`` events record ``lr`` / ``last_lr`` and ``schedule_steps``; a stop by the clock says so on
    stderr).

    Copy content (:func:`training_batch`): ``copy_fraction``, a number in [0, 1], is the share of training
    windows that get copy content (:func:`.training_copies.copy_window`: retrieval probes in the training
    formats of every task of :mod:`.retrieval`); each such window holds 1 to ``max_copies`` (at least 1) of
    them, the number drawn uniformly; ``copy_tasks`` (None: every task equally often) weighs the tasks drawn,
    ``"TASK=WEIGHT,..."`` (:func:`.training_copies.task_weights`; a task it does not name weighs 1).
    ``eval_documents``: the documents of the evaluation set, one per
    validation file (:func:`eval_packages` says how many packages they must span; default
    :data:`.corpus.EVAL_FILES`).

    Native sparse training: ``attention`` is one of :data:`ATTENTIONS`: ``"sdpa"`` (the default, torch's SDPA,
    as the committed model was trained), ``"dense"`` (the kit's kernels over every causal block) or a selector
    of the kit, through the transformers backend (:func:`use_attention`) from the first step, forward and
    backward; ``block_size`` (a power of two >= 16), ``sinks`` and ``window`` are its rule's, and ``budget``
    the key blocks it adds per query block beyond the sinks and the window (None: n/8, an eighth of the
    context's ``ceil(context / block_size)`` blocks: 16 at context 8192 with 64-token blocks; see
    :func:`attention_budget`). ``budget`` must stay None for ``sdpa``, ``dense`` and ``window`` (they add no
    blocks); ``block_size``, ``sinks`` and ``window`` are unused by ``sdpa``.

    Continued training: ``init``, a model folder written by :func:`train`, is the weights the run starts from
    instead of a random initialisation, with a fresh optimizer and learning-rate schedule and batches of its own
    (:mod:`.init_weights`: the checkpoint's shape, positions and evaluation set must be the run's).

    ``lookup_weight`` (a finite number >= 0; 1, the default, is the plain loss): the weight in the training loss
    of the copy content's lookup bytes, the answer bytes that start a value and must be found by their key
    (:attr:`.training_copies.CopyWindow.lookup_positions`); every other byte weighs 1 (:func:`training_loss`).
    A window holds a few lookup bytes among thousands, so the plain loss barely asks for the skill that dense
    retrieval misses (issue 41: the model copies a value once started, but often fails to find it)."""

    context: int = 8192
    batch: int = 8
    steps: int = 4000
    stop_after: int | None = 3358
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.1
    copy_fraction: float = 0.5
    max_copies: int = 4
    copy_tasks: str | None = None
    lookup_weight: float = 1.0
    eval_every: int = 500
    eval_documents: int = EVAL_FILES
    log_every: int = 25
    seed: int = 0
    max_minutes: float | None = None
    attention: str = "sdpa"
    budget: int | None = None
    block_size: int = 64
    sinks: int = 1
    window: int = 1
    init: str | None = None


ATTENTIONS = ("sdpa", "dense", "window", "quest", "centroid", "topology", "topology_22")
"""The values of ``TrainSettings.attention`` (issue 42's list): ``sdpa``, the kit's ``dense``, and the
selectors ``window`` (the sinks and the window only), ``quest``, ``centroid`` (query-aware), ``topology`` and
``topology_22`` (query-blind: the elder-rule salience of the key blocks; #22's rule)."""
FULL_ATTENTIONS = ("sdpa", "dense")
"""The attentions of :data:`ATTENTIONS` that visit every causal block (no budget)."""
TRAIN_BACKEND = "topo_attn_train"
"""The name under which :func:`use_attention` registers the kit's backend for training."""


def lm_config(shape: ModelShape, context: int):
    """The ``LlamaConfig`` of a byte-level model of ``shape`` for ``context`` bytes (SDPA attention)."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=256, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                       num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                       num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim, max_position_embeddings=context,
                       rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
                       bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False,
                       attention_dropout=0.0, attn_implementation="sdpa")


def learning_rate(step: int, settings: TrainSettings) -> float:
    """Linear warm-up over ``settings.warmup`` steps, then cosine decay to 10% at ``settings.steps``."""
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    progress = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
    return settings.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress))))


@dataclass(frozen=True)
class TrainingBatch:
    """One training batch (:func:`training_batch`).

    Attributes:
        ids: ``int64 [batch, context + 1]``: the windows; position ``j`` of ``ids[:, 1:]`` is predicted from the
            logits at ``j``.
        lookups: ``bool [batch, context]``: True where ``ids[:, 1:]`` is a lookup byte of copy content
            (:attr:`.training_copies.CopyWindow.lookup_positions`), in the coordinates of ``ids[:, 1:]``.
    """

    ids: torch.Tensor
    lookups: torch.Tensor


def training_batch(stream: np.ndarray, settings: TrainSettings, rng: np.random.Generator) -> TrainingBatch:
    """Random windows of ``stream`` (``uint8``, longer than ``context + 1``) of ``context + 1`` bytes, each,
    with probability ``copy_fraction``, replaced by a window of copy content
    (:func:`.training_copies.copy_window` with 1 to ``max_copies`` probes, tasks weighed by ``copy_tasks``)
    built into the ``2 * (context + 1)`` bytes of ``stream`` from the same start (fewer at the stream's end),
    with the copy content's lookup bytes marked. Everything is drawn from ``rng``."""
    length = settings.context + 1
    starts = rng.integers(0, len(stream) - length, settings.batch)
    rows, weights = [], task_weights(settings.copy_tasks)
    lookups = np.zeros((settings.batch, settings.context), bool)
    for i, start in enumerate(starts):
        row = stream[start:start + length]
        if rng.random() < settings.copy_fraction:
            copies = int(rng.integers(1, settings.max_copies + 1))
            window = copy_window(stream[start:start + 2 * length], length, rng, copies, weights)
            row = window.ids
            lookups[i, window.lookup_positions - 1] = True  # a target at p is predicted at p - 1 (p >= 1)
        rows.append(row)
    return TrainingBatch(torch.from_numpy(np.stack(rows).astype(np.int64)), torch.from_numpy(lookups))


def training_loss(logits: torch.Tensor, batch: TrainingBatch, lookup_weight: float = 1.0) -> dict:
    """The training loss of ``logits`` (``[batch, context, 256]``, on the batch's device) over ``batch``: the
    mean over every predicted byte of its cross-entropy (nats) weighted by ``lookup_weight`` at the batch's
    lookup bytes and by 1 elsewhere, divided by the number of bytes (not by the weights' sum, so the other
    bytes keep the plain loss's scale). Returns tensors, nothing read back: ``loss`` (to backpropagate),
    ``plain`` (the unweighted mean), ``lookup_sum`` and ``lookups`` (the cross-entropy summed over the lookup
    bytes, and their count)."""
    scores, targets = logits.float().transpose(1, 2), batch.ids[:, 1:]
    plain = torch.nn.functional.cross_entropy(scores, targets)  # with weight 1, the loss as it always was
    with torch.set_grad_enabled(torch.is_grad_enabled() and lookup_weight != 1):
        mask = batch.lookups.to(scores.dtype)
        lookup_sum = (torch.nn.functional.cross_entropy(scores, targets, reduction="none") * mask).sum()
    loss = plain if lookup_weight == 1 else plain + (lookup_weight - 1) * lookup_sum / targets.numel()
    return dict(loss=loss, plain=plain, lookup_sum=lookup_sum, lookups=mask.sum())


def eval_packages(eval_documents: int) -> int:
    """The packages besides the standard library that ``train``'s evaluation set of ``eval_documents``
    documents must span: :data:`.corpus.MIN_PACKAGES` (20), or ``eval_documents - 1`` for fewer than 21
    documents (then every document but the standard library's comes from a package of its own)."""
    return min(MIN_PACKAGES, check_int("eval_documents", eval_documents, 1) - 1)


def probe_set(eval_docs: np.ndarray, distances: list[int], per_distance: int, seed: int) -> list:
    """Passkey probes (:func:`.probe.passkey_document`): ``per_distance`` documents of ``eval_docs`` per
    distance, seeded; distances that do not fit are left out."""
    rng = np.random.default_rng(seed)
    probes = []
    for distance in distances:
        for i in range(per_distance):
            doc = eval_docs[(i * 7 + distance) % len(eval_docs)]
            try:
                probes.append(passkey_document(doc, distance, rng))
            except ValueError:
                break
    return probes


def probe_distances(context: int) -> list[int]:
    """1k, 2k, 4k, ... up to ``context``, and the longest that fits (``context - 128``).

    Raises:
        ValueError: ``context`` is 128 or less (no probe fits).
    """
    if check_int("context", context, 1) <= 128:
        raise ValueError(f"context must be > 128 bytes for a passkey probe, got {context}")
    out, d = [], 1024
    while d < context - 128:
        out.append(d)
        d *= 2
    return out + [context - 128]


def _log(path: Path, record: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def check_settings(settings: TrainSettings, label: Callable[[str], str] = str) -> None:
    """Raise ``ValueError`` / ``TypeError`` for settings :func:`train` cannot run with: a count below 1
    (``max_copies`` included), a ``copy_tasks`` that :func:`.training_copies.task_weights` refuses, a context
    too short for the passkey probe, a ``copy_fraction`` that is not a number in [0, 1], an attention outside
    :data:`ATTENTIONS`, a block size that is not a power of two >= 16, negative sinks, window or budget, a budget
    given to an attention that adds no blocks, an ``init`` that is not a model folder with its evaluation set
    (:func:`.init_weights.check_folder`). ``label(field)`` is how a message names a field (e.g. its command-line
    option)."""
    for name in ("context", "batch", "steps", "warmup", "eval_every", "eval_documents", "log_every"):
        check_int(label(name), getattr(settings, name), 1)
    try:
        probe_distances(settings.context)  # raises for a context too short for the passkey probe
    except ValueError as error:
        raise ValueError(str(error).replace("context", label("context"), 1)) from error
    if settings.stop_after is not None:
        check_int(label("stop_after"), settings.stop_after, 1)
    check_int(label("max_copies"), settings.max_copies, 1)
    task_weights(settings.copy_tasks, label("copy_tasks"))
    weight = settings.lookup_weight
    if isinstance(weight, bool) or not isinstance(weight, Real):
        raise TypeError(f"{label('lookup_weight')} must be a finite number >= 0, got {type(weight).__name__}")
    if not 0 <= weight < math.inf:  # (NaN fails too)
        raise ValueError(f"{label('lookup_weight')} must be a finite number >= 0 (the loss weight of the copy "
                         f"content's lookup bytes; 1: the plain loss), got {weight}")
    if settings.init is not None:
        check_folder(settings.init, label("init"))
    fraction = settings.copy_fraction
    if isinstance(fraction, bool) or not isinstance(fraction, Real):
        raise TypeError(f"{label('copy_fraction')} must be a number in [0, 1], got {type(fraction).__name__}")
    if not 0 <= fraction <= 1:  # (NaN fails too)
        raise ValueError(f"{label('copy_fraction')} must be in [0, 1] (the share of windows with copy content), "
                         f"got {fraction}")
    check_attention(settings, label)


def check_attention(settings: TrainSettings, label: Callable[[str], str] = str) -> None:
    """The attention part of :func:`check_settings`: ``attention``, ``budget``, ``block_size``, ``sinks`` and
    ``window`` (``ValueError`` / ``TypeError`` naming the field as ``label(field)``)."""
    attention = settings.attention
    if not isinstance(attention, str):
        raise TypeError(f"{label('attention')} must be a str, one of {list(ATTENTIONS)}, got "
                        f"{type(attention).__name__}")
    if attention not in ATTENTIONS:
        raise ValueError(f"{label('attention')} must be one of {list(ATTENTIONS)}, got {attention!r}")
    block_size = check_int(label("block_size"), settings.block_size, 1)
    try:
        check_kernel_block_size(block_size)
    except ValueError as error:
        raise ValueError(str(error).replace("block_size", label("block_size"), 1)) from error
    check_int(label("sinks"), settings.sinks)
    check_int(label("window"), settings.window)
    if settings.budget is not None:
        check_int(label("budget"), settings.budget)
        if not adds_blocks(attention):
            full = attention in FULL_ATTENTIONS
            what = "visits every causal block" if full else "adds no blocks (sinks and window only)"
            raise ValueError(f"{label('budget')} is for a selector that adds blocks; attention {attention!r} "
                             f"{what}, so leave {label('budget')} unset")


def adds_blocks(attention: str) -> bool:
    """Whether ``attention`` (of :data:`ATTENTIONS`) adds ``budget`` blocks per query block (a selector whose
    registry entry says so; not ``sdpa``, ``dense`` or ``window``)."""
    if attention in FULL_ATTENTIONS:
        return False
    from ..selection import SELECTORS

    return SELECTORS[attention].adds_blocks


def attention_budget(settings: TrainSettings) -> int | None:
    """The blocks ``settings.attention`` adds per query block beyond the sinks and the window: None for
    ``sdpa`` and ``dense`` (every causal block), 0 for ``window`` (it adds none), else ``settings.budget``, or
    when that is None n/8: ``ceil(context / block_size) // 8`` (16 at context 8192 with 64-token blocks).
    Assumes :func:`check_settings` passed."""
    if settings.attention in FULL_ATTENTIONS:
        return None
    if not adds_blocks(settings.attention):
        return 0
    if settings.budget is not None:
        return settings.budget
    return -(-settings.context // settings.block_size) // 8


def use_attention(model, settings: TrainSettings, name: str = TRAIN_BACKEND) -> str | None:
    """Switch ``model`` (a transformers model) to ``settings.attention`` and return the backend's name, or None
    for ``sdpa`` (the model is left as it is).

    Otherwise the kit's transformers backend (:func:`topo_attn.integrations.transformers.register`) is
    (re-)registered under ``name`` with ``selector=settings.attention``, the settings' ``block_size``,
    ``sinks`` and ``window``, and :func:`attention_budget`'s budget, and the model's ``attn_implementation``
    set to it. Every forward over a whole sequence (each training step, each evaluation) then runs, per layer,
    the selection on that layer's own queries and keys of that very forward (detached: no gradient flows
    through the choice; nothing is kept between steps, so each step chooses afresh from the current weights)
    and :func:`topo_attn.scheduled_attention`'s Triton kernels over the chosen blocks, whose backward gives the
    gradients of the queries, keys and values. ``tests/lm/test_native.py`` checks this: one selection per layer
    and forward, on the query and key the kernel then receives. ``dense`` runs every causal block through the
    same kernels. Whether a selector's scores wait for the host is its registry flag
    (``topo_attn.selection.SELECTORS[name].sync_free``): none of :data:`ATTENTIONS` waits (``topology_22``'s
    schedule is padded, its entry count left on the device)."""
    if settings.attention == "sdpa":
        return None
    from ..integrations import transformers as tat

    budget = attention_budget(settings)
    tat.register(selector=settings.attention, block_size=settings.block_size, sinks=settings.sinks,
                 window=settings.window, budget=budget or 0, name=name)
    model.set_attn_implementation(name)
    return name


def option(field: str) -> str:
    """The command-line option of a settings field: ``eval_every`` -> ``--eval-every``."""
    return f"--{field.replace('_', '-')}"


OPTION_TYPES = {"max_minutes": float, "stop_after": int, "budget": int, "init": str, "copy_tasks": str}
"""The command-line types of the :class:`TrainSettings` fields whose default is None (the others: the default's
type)."""


OPTION_HELP = {
    "attention": f"the attention trained with from the first step: {', '.join(ATTENTIONS)} (default sdpa)",
    "budget": "extra key blocks per query block of a selector that adds blocks (default n/8: ceil(context / "
              "block size) // 8, 16 at context 8192 with 64-token blocks)",
    "block_size": "tokens per block of the kit's attention (a power of two >= 16)",
    "sinks": "sink blocks every query block visits (the kit's attention)",
    "window": "blocks before the diagonal every query block visits (the kit's attention)",
    "copy_fraction": "share of training windows with copy content: retrieval probes in the training formats "
                     "of every task (0 to 1; default %(default)s)",
    "max_copies": "the most retrieval probes in a window with copy content (1 to this many; default %(default)s)",
    "copy_tasks": "weights of the retrieval tasks in the copy content, TASK=WEIGHT pairs joined by commas (e.g. "
                  "multi_value=3; a task not named weighs 1; default: every task equally often)",
    "lookup_weight": "loss weight of the copy content's lookup bytes (the answer bytes that start a value, found "
                     "by their key); every other byte weighs 1 (default %(default)s: the plain loss)",
    "eval_documents": "documents of the evaluation set, one window per validation file (default %(default)s)",
    "init": "a model folder of an earlier run to continue training from (its weights; a fresh optimizer and "
            "schedule; same shape, context, corpus and seed)",
    "steps": "the length of the learning-rate schedule (warm-up, then cosine decay to 10%% at its end; "
             "default %(default)s)",
    "stop_after": "stop after this many steps, on the same schedule",
    "max_minutes": "stop after the first step that ends past this many minutes of training; the schedule keeps "
                   "its --steps, so set --steps to the steps that fit to end annealed",
}
"""The help of the command-line options of the schedule, attention, copy-content and evaluation-set fields of
:class:`TrainSettings`."""


def add_arguments(parser, skip: tuple[str, ...] = ()) -> None:
    """One option per field of :class:`TrainSettings` and :class:`ModelShape` (:func:`option`; defaults the
    dataclasses'), those named in ``skip`` left out."""
    for field in fields(TrainSettings) + fields(ModelShape):
        if field.name not in skip:
            kind = OPTION_TYPES.get(field.name, type(field.default))
            parser.add_argument(option(field.name), type=kind, default=field.default,
                                help=OPTION_HELP.get(field.name))


def settings_from_args(args, **values) -> TrainSettings:
    """The :class:`TrainSettings` of parsed ``args`` (:func:`add_arguments`; ``--stop-after 0``: run every step),
    fields in ``values`` taken from there instead."""
    given = {f.name: values[f.name] if f.name in values else getattr(args, f.name) for f in fields(TrainSettings)}
    given["stop_after"] = given["stop_after"] or None
    return TrainSettings(**given)


def shape_from_args(args) -> ModelShape:
    """The :class:`ModelShape` of parsed ``args`` (:func:`add_arguments`)."""
    return ModelShape(**{f.name: getattr(args, f.name) for f in fields(ModelShape)})


def check_device(option: str, device: str) -> None:
    """Raise :class:`~topo_attn.cli.UsageError` for a ``device`` torch does not know, or a CUDA device where
    there is none (``option`` names the argument)."""
    from .. import cli

    kind = cli.check_option(option, lambda: torch.device(device).type)
    if kind == "cuda" and not torch.cuda.is_available():
        raise cli.UsageError(f"argument {option}: {device} asked, but torch sees no CUDA GPU here; expected "
                             f"cpu (or run on a machine with a GPU)")


def check_arguments(args, settings: TrainSettings) -> None:
    """Raise :class:`~topo_attn.cli.UsageError` for command-line values that would fail late (after the corpus
    is read) or unclearly: ``settings`` that :func:`check_settings` rejects (named by their options), a model
    shape of parsed ``args`` below 1, a ``--device`` without CUDA."""
    from .. import cli

    try:
        check_settings(settings, option)
    except (ValueError, TypeError) as error:
        raise cli.UsageError(str(error)) from error
    for field in fields(ModelShape):
        if field.type in (int, "int"):
            cli.check_at_least(option(field.name), getattr(args, field.name), 1, field.name)
    check_device("--device", args.device)


def train(out_dir: str | Path, settings: TrainSettings = TrainSettings(), shape: ModelShape = ModelShape(),
          device: str = "cuda", roots=None, progress: bool | None = True, max_shard_size: str = "100MB") -> dict:
    """Train a model and write the checkpoint, log, corpus manifest and evaluation set into ``out_dir``
    (created; files of an earlier run there are replaced; the weights in files of at most ``max_shard_size``,
    one file for the default model). ``roots``: the corpus roots (:func:`.corpus.find_sources`). A progress bar
    over the steps when ``progress`` (None: when stderr is a terminal). The model trains, is validated and is
    probed with ``settings.attention`` (:func:`use_attention`); the checkpoint does not record it (it loads
    with SDPA). Returns the final evaluation: validation bits per byte (overall and by position bucket) and
    the passkey probe under that attention, with ``steps``, ``bytes`` (trained on), ``seconds`` (the whole run),
    ``train_seconds`` (the training steps only, the validations between them left out),
    ``first_step_seconds`` (the first step: on a GPU it includes compiling the kernels), ``attention``,
    ``budget`` (:func:`attention_budget`) and ``visited_fraction`` (the kit's scheduled over causal block pairs
    summed over every layer call until the end of training, validations between steps included; None for
    ``sdpa``).

    The evaluation set (``eval_set.npz`` with its file list, and ``eval_set.json``) is
    :func:`.corpus.build_eval_set`'s for ``context`` bytes, ``eval_documents`` files, :func:`eval_packages`
    packages and ``seed``; its documents are the held-out documents validated on (the first 16) and probed. A
    corpus that cannot give it (too few validation files of at least ``context`` bytes, too few packages, no
    standard-library file: a tiny corpus) is an error raised before anything is written; there is no fallback
    to consecutive windows.

    Raises:
        ValueError: a setting out of range, or a corpus that cannot give the evaluation set (the message says
            what it has) or one training window.
    """
    from tqdm.auto import tqdm
    from transformers import LlamaForCausalLM

    check_settings(settings)
    started = time.perf_counter()
    try:  # before anything is written: a corpus that cannot give the evaluation set fails here
        eval_set = build_eval_set(find_sources(roots), settings.context, settings.eval_documents,
                                  eval_packages(settings.eval_documents), settings.seed)
    except ValueError as error:
        raise ValueError(f"eval_documents={settings.eval_documents} documents of context={settings.context} bytes: "
                         f"{error}") from error
    config = lm_config(shape, settings.context)
    init = None
    if settings.init is not None:  # also before anything is written
        init = load_init(settings.init, config, [f.name for f in eval_set.files], eval_set.documents)
    split = eval_set.split  # validation deduplicated against training
    train_files, validation_files = split.train, split.validation
    train_bytes = sum(f.size + len(SEPARATOR) for f in train_files)  # the packed stream's length
    if train_bytes <= settings.context + 1:
        raise ValueError(f"the training files hold {train_bytes} bytes, fewer than one training window of "
                         f"context + 1 = {settings.context + 1}; use a larger corpus or a shorter context")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "train_log.jsonl"
    log_path.write_text("")
    with gzip.open(out / "corpus_manifest.json.gz", "wt") as f:
        json.dump(manifest(train_files, validation_files, split.duplicates), f, indent=1)
    save_eval_set(eval_set, out)
    eval_docs = eval_set.documents
    stream = pack(train_files, seed=settings.seed)
    _log(log_path, dict(event="corpus", train_files=len(train_files), train_bytes=int(len(stream)),
                        validation_files=len(validation_files), duplicate_files=len(split.duplicates),
                        eval_documents=len(eval_docs), eval_set=eval_set.summary(),
                        seconds=time.perf_counter() - started, settings=asdict(settings), shape=asdict(shape),
                        init=None if init is None else init.summary()))
    print(f"corpus: {len(train_files)} train files ({len(stream) / 1e6:.0f} MB), {len(validation_files)} "
          f"validation files, {len(eval_docs)} held-out documents of {settings.context} bytes (one per file, "
          f"{len(set(eval_set.packages))} packages with the standard library)", file=sys.stderr)

    torch.manual_seed(settings.seed)
    rng = np.random.default_rng(batch_seed(settings.seed, init))
    with torch.device(device):
        model = LlamaForCausalLM(config)
    if init is not None:
        model.load_state_dict(init.state)
    backend = use_attention(model, settings)  # None: sdpa, the model as built
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    rest = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([dict(params=decay, weight_decay=settings.weight_decay),
                                   dict(params=rest, weight_decay=0.0)], lr=settings.lr, betas=(0.9, 0.95),
                                  fused=device.startswith("cuda"))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda") else \
        torch.autocast("cpu", enabled=False)
    eval_ids = torch.from_numpy(eval_docs[: min(16, len(eval_docs))].astype(np.int64))

    def validate(step: int) -> dict:
        model.eval()
        with autocast:
            result = bits_per_byte(token_losses(model, eval_ids))
        model.train()
        _log(log_path, dict(event="validation", step=step, seconds=time.perf_counter() - started, bits_per_byte=result))
        return result

    def synchronize() -> None:  # for the clock only: the GPU's queued steps finish before a time is taken
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)

    train_started, seen, step, paused, first_step = time.perf_counter(), 0, 0, 0.0, 0.0
    lookup_sum, lookup_count = torch.zeros((), device=device), torch.zeros((), device=device)
    bar = tqdm(range(settings.steps), desc="train", unit="step", disable=not progress_enabled(progress))
    model.train()
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, settings)
        batch = training_batch(stream, settings, rng)
        batch = TrainingBatch(batch.ids.to(device), batch.lookups.to(device))
        with autocast:
            logits = model(batch.ids[:, :-1]).logits
        losses = training_loss(logits, batch, settings.lookup_weight)
        optimizer.zero_grad(set_to_none=True)
        losses["loss"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        seen += batch.ids[:, 1:].numel()
        lookup_sum += losses["lookup_sum"].detach()
        lookup_count += losses["lookups"]
        if step % settings.log_every == 0 or step == settings.steps - 1:
            bits = losses["plain"].item() / math.log(2)
            count = lookup_count.item()  # the lookup bytes' mean since the last log (few per batch)
            lookup_bits = lookup_sum.item() / count / math.log(2) if count else None
            lookup_sum, lookup_count = torch.zeros((), device=device), torch.zeros((), device=device)
            elapsed = time.perf_counter() - train_started
            bar.set_postfix(bits=f"{bits:.3f}", MBps=f"{seen / elapsed / 1e6:.2f}")
            _log(log_path, dict(event="step", step=step, bits_per_byte=bits, lookup_bits=lookup_bits,
                                lookup_bytes=int(count), lr=learning_rate(step, settings),
                                bytes_per_second=seen / elapsed, seconds=time.perf_counter() - started))
        if step == 0:  # logged, so its loss was read back: the step is done
            first_step = time.perf_counter() - train_started
        if step and step % settings.eval_every == 0:
            synchronize()
            pause = time.perf_counter()
            validate(step)
            paused += time.perf_counter() - pause
        reason = None
        if settings.max_minutes is not None and time.perf_counter() - train_started > 60 * settings.max_minutes:
            reason = f"max_minutes={settings.max_minutes} reached"
        if settings.stop_after is not None and step + 1 >= settings.stop_after and step + 1 < settings.steps:
            reason = f"stop_after={settings.stop_after} reached"
        if reason:
            lr = learning_rate(step, settings)
            _log(log_path, dict(event="stopped", step=step, reason=reason, lr=lr, schedule_steps=settings.steps))
            print(f"stopped after step {step}: {reason}", file=sys.stderr)
            if reason.startswith("max_minutes"):
                print(f"the learning rate was still {lr:.3g} ({lr / settings.lr:.0%} of lr), {step + 1} of the "
                      f"schedule's {settings.steps} steps: --steps sets the schedule's length (it decays to 10% "
                      f"at its end), --max-minutes only stops the run", file=sys.stderr)
            break
    bar.close()
    synchronize()
    train_seconds = time.perf_counter() - train_started - paused
    visited = None
    if backend is not None:
        from ..integrations import transformers as tat

        scheduled, causal = map(sum, zip(*((s, c) for s, c, _ in tat.visited_totals(backend).values())))
        visited = scheduled / causal

    model.eval()
    final = validate(step + 1)
    probes = probe_set(eval_docs, probe_distances(settings.context), 8, seed=settings.seed + 1)
    with autocast:
        scores = passkey_scores(model, probes)
    retrieval = {}
    for row in scores:
        entry = retrieval.setdefault(row["distance"], dict(exact=0, probes=0, loss=0.0))
        entry["exact"] += row["exact"]
        entry["probes"] += 1
        entry["loss"] += row["loss"]
    for entry in retrieval.values():
        entry["loss"] /= entry["probes"]
    summary = dict(event="final", steps=step + 1, schedule_steps=settings.steps, last_lr=learning_rate(step, settings),
                   bytes=seen, seconds=time.perf_counter() - started,
                   train_seconds=train_seconds, first_step_seconds=first_step, attention=settings.attention,
                   budget=attention_budget(settings), visited_fraction=visited,
                   bits_per_byte=final, passkey={str(k): v for k, v in retrieval.items()},
                   init=None if init is None else init.summary())
    _log(log_path, summary)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True, max_shard_size=max_shard_size)
    return summary
