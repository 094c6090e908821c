"""Starting a training run from a checkpoint's weights (``python -m topo_attn.lm train --init FOLDER``).

A run of :func:`.train.train` is one learning-rate schedule inside one process; a GPU job that must end within
minutes bounds it. ``--init`` continues training across such jobs: the new run loads the weights of an earlier
run's output folder instead of a random initialisation and trains them with a fresh optimizer and a fresh
schedule (warm-up included: a warm restart, not a resumption of the optimizer's state, which is not saved).

:func:`load_init` refuses, before the run writes anything, a folder that is not such a checkpoint, one of
another shape or with positions shorter than the context, and one whose evaluation set differs from the run's:
the evaluation documents come from held-out files that depend on the corpus, the context and the seed, so a
model trained with other ones may have trained on the new run's held-out files. The new run draws its batches
from a stream seeded by ``(seed, steps before)`` (:func:`batch_seed`), so it does not repeat the batches of the
run it continues.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "tie_word_embeddings")
"""The ``config.json`` fields that must equal the new run's model's."""


@dataclass(frozen=True)
class InitModel:
    """The checkpoint a run starts from.

    Attributes:
        path: its folder, as given.
        state: its weights (``state_dict`` names), float32 on the CPU.
        steps, bytes: the training steps and bytes behind it, its own run's and those of every run it continued
            (from its ``train_log.jsonl``'s final record; 0 when it has none).
        runs: the runs behind it (1 for a model trained from scratch).
    """

    path: str
    state: dict
    steps: int
    bytes: int
    runs: int

    def summary(self) -> dict:
        """What a run's log records of it."""
        return dict(path=self.path, steps=self.steps, bytes=self.bytes, runs=self.runs)


def batch_seed(seed: int, init: InitModel | None) -> list[int] | int:
    """The seed of a run's batch stream: ``seed`` from scratch, ``[seed, steps before]`` when continuing (so a
    continued run does not repeat the batches of the run before it)."""
    return seed if init is None else [seed, init.steps]


def _final_record(folder: Path) -> dict:
    log = folder / "train_log.jsonl"
    if not log.is_file():
        return {}
    finals = [json.loads(line) for line in log.read_text().splitlines() if '"event": "final"' in line]
    return finals[-1] if finals else {}


def check_folder(path, label: str = "init") -> Path:
    """``path`` as a :class:`~pathlib.Path` when it is a folder with a model's ``config.json`` and the
    ``eval_set.npz`` of the run that wrote it; ``label`` names the argument in messages.

    Raises:
        TypeError: ``path`` is not a str or a path.
        ValueError: no such folder or files.
    """
    if not isinstance(path, (str, Path)):
        raise TypeError(f"{label} must be a model folder (a str), got {type(path).__name__}")
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise ValueError(f"{label}: {str(path)!r} is not a model folder of python -m topo_attn.lm train "
                         f"(no config.json)")
    if not (folder / "eval_set.npz").is_file():
        raise ValueError(f"{label}: {str(path)!r} has no eval_set.npz, so its held-out files cannot be checked "
                         f"against this run's")
    return folder


def load_init(path: str, config, eval_names: list[str], eval_documents: np.ndarray, label: str = "init") -> InitModel:
    """The checkpoint in folder ``path`` (an output folder of :func:`.train.train`) for a run whose model has the
    ``LlamaConfig`` ``config`` and whose evaluation set has files ``eval_names`` and documents
    ``eval_documents``; ``label`` names the argument in messages.

    Raises:
        TypeError: ``path`` is not a str or a path.
        ValueError: no such folder, no ``config.json`` / ``eval_set.npz`` (:func:`check_folder`) or weights
            there, a shape field of :data:`SHAPE_FIELDS` that differs, ``max_position_embeddings`` below the
            run's, or an evaluation set that differs from the run's (the message says which).
    """
    folder = check_folder(path, label)
    theirs = json.loads((folder / "config.json").read_text())
    ours = config.to_dict()
    for field in SHAPE_FIELDS:
        if theirs.get(field) != ours.get(field):
            raise ValueError(f"{label}: the model in {str(path)!r} has {field}={theirs.get(field)}, this run's "
                             f"model {ours.get(field)}; give the run the checkpoint's shape")
    if theirs.get("rope_parameters") != ours.get("rope_parameters"):
        raise ValueError(f"{label}: the model in {str(path)!r} has rope_parameters={theirs.get('rope_parameters')}, "
                         f"this run's model {ours.get('rope_parameters')}")
    if theirs.get("max_position_embeddings", 0) < ours["max_position_embeddings"]:
        raise ValueError(f"{label}: the model in {str(path)!r} was trained on {theirs.get('max_position_embeddings')} "
                         f"positions, fewer than this run's context of {ours['max_position_embeddings']}")
    with np.load(folder / "eval_set.npz") as data:
        same = list(data["names"]) == list(eval_names) and np.array_equal(data["documents"], eval_documents)
    if not same:
        raise ValueError(f"{label}: the evaluation set of {str(path)!r} differs from this run's (another corpus, "
                         f"context or seed), so that model may have trained on this run's held-out files; "
                         f"continue it with the settings it was trained with")
    from transformers import LlamaForCausalLM

    try:
        model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    except OSError as error:  # no weights file
        raise ValueError(f"{label}: no weights in {str(path)!r}: {error}") from error
    final = _final_record(folder)
    before = final.get("init") or {}
    return InitModel(str(path), {k: v.detach().cpu() for k, v in model.state_dict().items()},
                     int(final.get("steps", 0)) + int(before.get("steps", 0)),
                     int(final.get("bytes", 0)) + int(before.get("bytes", 0)), 1 + int(before.get("runs", 0)))
