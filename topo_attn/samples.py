"""Deterministic sample keys for demos, notebooks and tests, and the sample data shipped with the package.

The sample data (the key sets ``<name>.npy`` and the captured MiniLM q, k, v ``minilm_qkv.npz``; the
repository's ``data/README.md`` describes them) are package data in :data:`DATA_DIR`, so they are found from a
wheel as from a checkout.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def clustered_keys(seq_len: int, dim: int, block_size: int = 64, clusters: int = 4, outlier_blocks: int = 2,
                   seed: int = 0) -> torch.Tensor:
    """Keys ``[seq_len, dim]`` float32 whose blocks sit in ``clusters`` well-separated clusters (runs of
    consecutive blocks share a cluster, as topics do in text), plus ``outlier_blocks`` blocks far from
    all clusters: the blocks that a 0-dimensional persistence salience should rank first."""
    gen = torch.Generator().manual_seed(seed)
    nb = -(-seq_len // block_size)
    centres = 4.0 * torch.randn(clusters, dim, generator=gen)
    run = max(1, nb // clusters)
    block_centre = centres[(torch.arange(nb) // run) % clusters]
    if outlier_blocks:
        picks = torch.randperm(max(nb - 1, 1), generator=gen)[:min(outlier_blocks, nb - 1)] + 1
        block_centre[picks] = 12.0 * torch.randn(len(picks), dim, generator=gen)
    keys = block_centre.repeat_interleave(block_size, dim=0)[:seq_len]
    return keys + torch.randn(seq_len, dim, generator=gen)


DATA_DIR = Path(__file__).resolve().parent / "sample_data"
"""The package's sample data folder, ``topo_attn/sample_data/`` (installed with the package): the key sets
written by ``data/make_key_sets.py`` and ``minilm_qkv.npz`` written by ``data/capture_real_qk.py``."""


def key_set_names(data_dir: str | Path | None = None) -> list[str]:
    """Names of the sample key sets in ``data_dir`` (default :data:`DATA_DIR`): the ``*.npy`` stems, sorted."""
    return sorted(p.stem for p in Path(data_dir or DATA_DIR).glob("*.npy"))


def load_key_set(name: str, data_dir: str | Path | None = None) -> torch.Tensor:
    """The sample key set ``name``: keys ``[S, D]`` float16 from ``data_dir/<name>.npy`` (default
    :data:`DATA_DIR`; see ``data/README.md``). Raises ``ValueError`` naming the file and the sets there when
    there is no such set."""
    path = Path(data_dir or DATA_DIR) / f"{name}.npy"
    if not path.is_file():
        raise ValueError(f"no key set {name!r}: {path} does not exist; expected one of "
                         f"{key_set_names(data_dir)} (python data/make_key_sets.py writes them)")
    return torch.from_numpy(np.load(path, allow_pickle=False))


def load_key_sets(data_dir: str | Path | None = None) -> dict[str, torch.Tensor]:
    """Every sample key set in ``data_dir`` (default :data:`DATA_DIR`), by name, sorted."""
    return {name: load_key_set(name, data_dir) for name in key_set_names(data_dir)}
