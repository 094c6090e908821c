"""Which value a model looks up in ``multi_value``: at the lookup of the ``k``-th value of the key (the first byte
of that value in the answer, :attr:`~topo_attn.lm.retrieval.RetrievalProbe.lookups`), the probability its
next-byte distribution puts on the first byte of each value ``j`` of the same key.

A model that finds the key but not the ``k``-th setting of it spreads its mass over the row; one that repeats
the first value it found puts it in column 0. Mass that lands on no value of the key (decoys, anything else) is
the last column. Teacher-forced, as :func:`~topo_attn.lm.evaluate.passkey_scores` scores: the bytes before each
lookup are the true ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .retrieval import RetrievalProbe


def _firsts(probe: RetrievalProbe) -> list[int]:
    """The first byte of each value of ``probe``'s answer: the answer bytes at its lookups."""
    return probe.ids[probe.targets[probe.lookups]].tolist()


def value_confusion(model, probes: Sequence[RetrievalProbe]) -> dict:
    """The mean lookup mass of ``model`` over ``multi_value`` ``probes`` (see the module docstring).

    Arguments:
        model: a causal byte LM (``model(ids).logits`` is ``[1, L, 256]``), on its device, in eval mode.
        probes: ``multi_value`` probes that all have the same number of values ``V``.

    Returns:
        ``{"mass": float64 [V, V + 1], "probes": int [V, V]}``: ``mass[k, j]`` for ``j < V`` is the mean
        probability, at the lookup of value ``k``, of value ``j``'s first byte; ``mass[k, V]`` the mean
        probability of every byte that starts no value of the key. A probe where value ``j != k`` starts with
        the same byte as value ``k`` cannot tell them apart: it counts for ``k`` only and leaves out column
        ``j`` of row ``k`` (``probes[k, j]`` says how many probes each mean has; ``NaN`` where none).

    Raises:
        ValueError: no probes, a probe of another task, or probes with different numbers of values.
    """
    if not probes:
        raise ValueError("probes must hold at least one multi_value probe, got none")
    tasks = sorted({p.task for p in probes} - {"multi_value"})
    if tasks:
        raise ValueError(f"probes must all be multi_value probes, got tasks {tasks}")
    counts = sorted({len(p.lookups) for p in probes})
    if len(counts) > 1:
        raise ValueError(f"probes must all have the same number of values, got {counts}")
    v = counts[0]
    total, seen = np.zeros((v, v + 1)), np.zeros((v, v + 1), np.int64)
    device = next(model.parameters()).device
    with torch.no_grad():
        for probe in probes:
            ids = torch.from_numpy(probe.ids.astype(np.int64))[None].to(device)
            at = torch.from_numpy(probe.targets[probe.lookups] - 1).to(device)
            prob = torch.softmax(model(ids).logits[0, at].double(), -1).cpu().numpy()  # [V, 256]
            firsts = _firsts(probe)
            for k in range(v):
                for j in range(v):
                    if j == k or firsts[j] != firsts[k]:
                        total[k, j] += prob[k, firsts[j]]
                        seen[k, j] += 1
                total[k, v] += 1.0 - prob[k, sorted(set(firsts))].sum()
                seen[k, v] += 1
    with np.errstate(invalid="ignore"):
        return {"mass": total / np.where(seen, seen, np.nan), "probes": seen[:, :v]}


def confusion_markdown(found: dict) -> str:
    """A Markdown table of a :func:`value_confusion` result: a row per value looked up, a column per value of
    the key and one for the rest, each cell its mean mass (``-`` where no probe could tell)."""
    mass = found["mass"]
    v = mass.shape[0]
    head = "| lookup of | " + " | ".join(f"value {j}" for j in range(v)) + " | no value of the key |"
    rows = [head, "| --- |" + " ---: |" * (v + 1)]
    for k in range(v):
        cells = ["-" if np.isnan(x) else f"{x:.2f}" for x in mass[k]]
        rows.append(f"| value {k} | " + " | ".join(cells) + " |")
    return "\n".join(rows)
