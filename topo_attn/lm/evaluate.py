"""Scoring a causal byte-level language model: loss per position, bits per byte by position bucket, and the
passkey probe.

Losses are in nats per byte, per predicted position (the loss at index ``t`` of :func:`token_losses` is that of
byte ``t + 1`` given bytes ``0..t``); bits per byte are nats / ln 2. The model is any transformers causal LM
whose vocabulary holds the 256 byte values (the kit's own model: token id = byte).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from .probe import Passkey

BUCKETS: tuple[tuple[int, int | None], ...] = ((0, 1024), (1024, 4096), (4096, 8192), (8192, None))
"""Position buckets ``[start, end)`` of the predicted byte (``None``: to the end)."""


def bucket_name(start: int, end: int | None) -> str:
    """``"0-1k"``, ``"8k+"``: a bucket's label."""
    def k(n: int) -> str:
        return f"{n // 1024}k" if n % 1024 == 0 and n else str(n)
    return f"{k(start)}+" if end is None else f"{k(start)}-{k(end)}"


def token_losses(model, ids: torch.Tensor, batch: int = 1) -> torch.Tensor:
    """Per document and position, the loss of each next byte: float32 ``[N, L - 1]`` on the CPU, in nats.

    Arguments:
        model: a causal LM (``model(ids).logits`` is ``[n, L, vocab]``), already on its device and in eval mode.
        ids: integer ``[N, L]`` token ids, ``L >= 2``.
        batch: documents per forward.

    Raises:
        ValueError: ids is not ``[N, L]`` with ``L >= 2``, or holds ids outside the vocabulary.
    """
    if ids.ndim != 2 or ids.shape[1] < 2:
        raise ValueError(f"ids must be [N, L] with L >= 2, got shape {tuple(ids.shape)}")
    vocab = model.config.vocab_size
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise ValueError(f"ids must lie in 0..{vocab - 1} (the model's vocabulary)")
    device = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for start in range(0, ids.shape[0], batch):
            chunk = ids[start:start + batch].to(device=device, dtype=torch.long)
            logits = model(chunk).logits[:, :-1].float()
            loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), chunk[:, 1:], reduction="none")
            out.append(loss.cpu())
    return torch.cat(out)


def bits_per_byte(losses: torch.Tensor, buckets: Sequence[tuple[int, int | None]] = BUCKETS) -> dict[str, float]:
    """``{"all": ..., "0-1k": ..., ...}``: the mean loss of ``losses`` (``[N, L - 1]`` nats, from
    :func:`token_losses`) in bits per byte, overall and per position bucket of the predicted byte (buckets that
    hold no position are left out)."""
    positions = torch.arange(1, losses.shape[-1] + 1)
    result = {"all": float(losses.mean()) / math.log(2)}
    for start, end in buckets:
        inside = (positions >= start) & (positions < (end if end is not None else positions.max() + 1))
        if bool(inside.any()):
            result[bucket_name(start, end)] = float(losses[:, inside].mean()) / math.log(2)
    return result


def document_bits_per_byte(losses: torch.Tensor) -> list[float]:
    """Each document's mean loss of ``losses`` (``[N, L - 1]`` nats, from :func:`token_losses`) in bits per byte,
    in order: the items of a paired comparison (:func:`topo_attn.lm.intervals.paired_mean_difference`); their
    mean is ``bits_per_byte(losses)["all"]``, the documents being of equal length."""
    return (losses.double().mean(dim=1) / math.log(2)).tolist()


def passkey_scores(model, probes: Sequence[Passkey], batch: int = 1) -> list[dict]:
    """Per probe (in order): ``distance``, ``loss`` (mean nats per byte of the repeated value), ``exact``
    (every byte of the value is the model's most likely next byte given the true bytes before it: what greedy
    decoding from the line's prefix would reproduce), and that prediction split into finding and copying:
    ``lookups`` and ``lookups_right`` (the answer bytes that start a value, :attr:`Passkey.lookups`, and how many
    of them are right), ``copies`` and ``copies_right`` (the other bytes). Probes of equal length run ``batch``
    per forward."""
    device = next(model.parameters()).device
    rows = []
    with torch.no_grad():
        for start in range(0, len(probes), batch):
            group = probes[start:start + batch]
            if len({len(p.ids) for p in group}) > 1:
                raise ValueError("probes of one batch must have equal lengths; pass batch=1")
            ids = torch.from_numpy(np.stack([p.ids for p in group]).astype(np.int64)).to(device)
            logits = model(ids).logits.float()
            for row, probe in enumerate(group):
                targets = torch.from_numpy(probe.targets).to(device)
                predicted = logits[row, targets - 1]
                loss = torch.nn.functional.cross_entropy(predicted, ids[row, targets])
                right = (predicted.argmax(-1) == ids[row, targets]).cpu().numpy()
                lookup = np.zeros(len(right), bool)
                lookup[probe.lookups] = True
                rows.append(dict(distance=probe.distance, loss=float(loss), exact=bool(right.all()),
                                 lookups=int(lookup.sum()), lookups_right=int(right[lookup].sum()),
                                 copies=int((~lookup).sum()), copies_right=int(right[~lookup].sum())))
    return rows
