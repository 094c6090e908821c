"""Training the kit's byte-level long-context language model (``python -m topo_attn.lm train``).

A Llama-architecture model (transformers' ``LlamaForCausalLM``: RoPE, grouped-query attention, SwiGLU) over
bytes (vocabulary 256, no special tokens), trained with dense attention (SDPA) on :mod:`.corpus`: random
windows of ``context + 1`` bytes of the training files (packed in a seeded order of their contents,
:func:`.corpus.packing_order`), a share of them with key lines copied from far
back (:func:`.probe.insert_copies`) so that the model learns to retrieve. AdamW, linear warm-up then cosine
decay to 10%, bfloat16 autocast on a GPU. Everything is seeded; the run writes, into its output folder, the
checkpoint (``config.json``, ``model.safetensors`` in bfloat16), ``train_log.jsonl`` (one JSON line per logged
step and evaluation), ``corpus_manifest.json.gz`` and ``eval_set.npz`` (the held-out documents, full context:
consecutive windows of the deduplicated validation files, :func:`.corpus.split_corpus`; the one-window-per-file
set of :func:`.corpus.build_eval_set` is written by ``python -m topo_attn.lm corpus --out``).
"""

from __future__ import annotations

import gzip
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from .._checks import check_int
from ..cli import progress_enabled
from .corpus import documents, find_sources, manifest, pack, split_corpus
from .evaluate import bits_per_byte, passkey_scores, token_losses
from .probe import insert_copies, passkey_document


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
    """What a training run does (its defaults are the committed model's). ``steps``: the length of the
    learning-rate schedule; ``stop_after``: stop after this many steps all the same (None: run them all);
    ``max_minutes``: stop after the first step that ends past this training time (the committed model was
    trained with ``steps=4000, max_minutes=6.3`` and stopped after 3358 steps; ``stop_after=3358`` repeats
    that run without the clock)."""

    context: int = 8192
    batch: int = 8
    steps: int = 4000
    stop_after: int | None = 3358
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.1
    copy_fraction: float = 0.5
    max_pairs: int = 4
    eval_every: int = 500
    eval_documents: int = 64
    log_every: int = 25
    seed: int = 0
    max_minutes: float | None = None


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


def training_batch(stream: np.ndarray, settings: TrainSettings, rng: np.random.Generator) -> torch.Tensor:
    """``[batch, context + 1]`` int64: random windows of ``stream``, each with key-line pairs
    (1..``max_pairs``) copied in with probability ``copy_fraction``."""
    length = settings.context + 1
    starts = rng.integers(0, len(stream) - length, settings.batch)
    rows = []
    for start in starts:
        row = stream[start:start + length]
        if rng.random() < settings.copy_fraction:
            row = insert_copies(row, rng, int(rng.integers(1, settings.max_pairs + 1)))
        rows.append(row)
    return torch.from_numpy(np.stack(rows).astype(np.int64))


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
    """Raise ``ValueError`` / ``TypeError`` for settings :func:`train` cannot run with: a count below 1, a
    context too short for the passkey probe. ``label(field)`` is how a message names a field (e.g. its
    command-line option)."""
    for name in ("context", "batch", "steps", "warmup", "eval_every", "eval_documents", "log_every"):
        check_int(label(name), getattr(settings, name), 1)
    try:
        probe_distances(settings.context)  # raises for a context too short for the passkey probe
    except ValueError as error:
        raise ValueError(str(error).replace("context", label("context"), 1)) from error
    if settings.stop_after is not None:
        check_int(label("stop_after"), settings.stop_after, 1)


def train(out_dir: str | Path, settings: TrainSettings = TrainSettings(), shape: ModelShape = ModelShape(),
          device: str = "cuda", roots=None, progress: bool | None = True, max_shard_size: str = "100MB") -> dict:
    """Train a model and write the checkpoint, log, corpus manifest and evaluation set into ``out_dir``
    (created; files of an earlier run there are replaced; the weights in files of at most ``max_shard_size``,
    one file for the default model). ``roots``: the corpus roots (:func:`.corpus.find_sources`). A progress bar
    over the steps when ``progress`` (None: when stderr is a terminal). Returns the
    final evaluation: validation bits per byte (overall and by position bucket) and the passkey probe under
    dense attention.

    Raises:
        ValueError: a setting out of range, or a corpus too small for one window.
    """
    from tqdm.auto import tqdm
    from transformers import LlamaForCausalLM

    check_settings(settings)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "train_log.jsonl"
    log_path.write_text("")

    started = time.perf_counter()
    split = split_corpus(find_sources(roots))  # validation deduplicated against training
    train_files, validation_files = split.train, split.validation
    with gzip.open(out / "corpus_manifest.json.gz", "wt") as f:
        json.dump(manifest(train_files, validation_files, split.duplicates), f, indent=1)
    stream = pack(train_files, seed=settings.seed)
    held_out = pack(validation_files)
    if len(held_out) < settings.context:
        raise ValueError(f"the validation files hold {len(held_out)} bytes, fewer than one evaluation document of "
                         f"context={settings.context} bytes; use a larger corpus or a shorter context")
    eval_docs = documents(held_out, settings.context, min(settings.eval_documents, len(held_out) // settings.context))
    np.savez_compressed(out / "eval_set.npz", documents=eval_docs)
    _log(log_path, dict(event="corpus", train_files=len(train_files), train_bytes=int(len(stream)),
                        validation_files=len(validation_files), duplicate_files=len(split.duplicates),
                        eval_documents=len(eval_docs),
                        seconds=time.perf_counter() - started, settings=asdict(settings), shape=asdict(shape)))
    print(f"corpus: {len(train_files)} train files ({len(stream) / 1e6:.0f} MB), {len(validation_files)} "
          f"validation files, {len(eval_docs)} held-out documents of {settings.context} bytes", file=sys.stderr)

    torch.manual_seed(settings.seed)
    rng = np.random.default_rng(settings.seed)
    config = lm_config(shape, settings.context)
    with torch.device(device):
        model = LlamaForCausalLM(config)
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

    train_started, seen, step = time.perf_counter(), 0, 0
    bar = tqdm(range(settings.steps), desc="train", unit="step", disable=not progress_enabled(progress))
    model.train()
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, settings)
        ids = training_batch(stream, settings, rng).to(device)
        with autocast:
            logits = model(ids[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), ids[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        seen += ids[:, 1:].numel()
        if step % settings.log_every == 0 or step == settings.steps - 1:
            bits = loss.item() / math.log(2)
            elapsed = time.perf_counter() - train_started
            bar.set_postfix(bits=f"{bits:.3f}", MBps=f"{seen / elapsed / 1e6:.2f}")
            _log(log_path, dict(event="step", step=step, bits_per_byte=bits, lr=learning_rate(step, settings),
                                bytes_per_second=seen / elapsed, seconds=time.perf_counter() - started))
        if step and step % settings.eval_every == 0:
            validate(step)
        reason = None
        if settings.max_minutes is not None and time.perf_counter() - train_started > 60 * settings.max_minutes:
            reason = f"max_minutes={settings.max_minutes} reached"
        if settings.stop_after is not None and step + 1 >= settings.stop_after and step + 1 < settings.steps:
            reason = f"stop_after={settings.stop_after} reached"
        if reason:
            _log(log_path, dict(event="stopped", step=step, reason=reason))
            print(f"stopped after step {step}: {reason}", file=sys.stderr)
            break
    bar.close()

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
    summary = dict(event="final", steps=step + 1, bytes=seen, seconds=time.perf_counter() - started,
                   bits_per_byte=final, passkey={str(k): v for k, v in retrieval.items()})
    _log(log_path, summary)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True, max_shard_size=max_shard_size)
    return summary
