"""Inputs for the selection harness: synthetic queries and values for a sample key set
(:func:`synthetic_qkv`), and the captured real q, k, v of a small language model (:func:`load_real_qkv`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .. import samples
from ..schedule import num_blocks
from ..topology import block_centroids

REAL_QKV = "minilm_qkv.npz"
"""File name of the captured real q, k, v in :data:`topo_attn.samples.DATA_DIR`."""


def synthetic_qkv(keys: torch.Tensor, block_size: int = 64, seed: int = 0,
                  sharpness: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries and values for a key set, with attention that concentrates on a few blocks, as in real heads.

    The keys are centred and scaled to unit mean norm times ``sqrt(D)``; each query block looks for one earlier
    key block chosen at random (its query tokens are that block's centroid times ``sharpness`` plus unit
    noise). Values are standard normal. Deterministic for a given ``seed`` (CPU generator).

    Arguments:
        keys: real ``[S, D]`` (e.g. :func:`topo_attn.samples.load_key_set`), on the CPU.
        block_size: tokens per block, ``>= 1``.
        seed: the generator seed.
        sharpness: scale of the query blocks' centroids against the unit noise.

    Returns:
        ``(q, k, v)``, float32 ``[S, D]`` each (``k`` the normalised keys).
    """
    gen = torch.Generator().manual_seed(seed)
    k = keys.to(torch.float32)
    k = k - k.mean(0)
    k = k / k.norm(dim=-1).mean() * k.shape[-1] ** 0.5
    seq, dim = k.shape
    nb = num_blocks(seq, block_size)
    centroids = block_centroids(k, block_size, torch.float32)
    target = (torch.rand(nb, generator=gen) * (torch.arange(nb) + 1)).long()  # a block <= qb
    q = (sharpness * centroids[target]).repeat_interleave(block_size, 0)[:seq]
    q = q + torch.randn(seq, dim, generator=gen)
    v = torch.randn(seq, dim, generator=gen)
    return q, k, v


def load_real_qkv(path: str | Path | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """The captured real queries, keys and values (written by ``data/capture_real_qk.py``).

    Arguments:
        path: an ``.npz`` file with arrays ``q``, ``k``, ``v`` and metadata; :data:`REAL_QKV` in
            :data:`topo_attn.samples.DATA_DIR` when None.

    Returns:
        ``(q, k, v, info)``: float16 ``[layers, heads, S, head_dim]`` CPU tensors (each captured layer a batch
        entry) and a dict of what made them (``model``, ``package``, ``package_version``, ``layers``, text).

    Raises:
        FileNotFoundError: the file does not exist.
    """
    with np.load(samples.DATA_DIR / REAL_QKV if path is None else path, allow_pickle=False) as data:
        q, k, v = (torch.from_numpy(data[name]) for name in ("q", "k", "v"))
        info = {name: data[name].tolist() for name in data.files if name not in ("q", "k", "v")}
    return q, k, v, info
