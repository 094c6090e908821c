"""Write the sample key sets, package data in ``topo_attn/sample_data/`` (``topo_attn.samples.DATA_DIR``):
``python data/make_key_sets.py [--out DIR]``.

Deterministic: every set comes from ``topo_attn.samples.clustered_keys`` with a fixed seed and is stored as
float16 ``[S, D]`` in ``<name>.npy``. data/README.md describes the sets; a test checks that this script
reproduces the committed files exactly.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from topo_attn.samples import DATA_DIR, clustered_keys

# name -> arguments of clustered_keys (blocks of 64 tokens share a cluster or sit apart as outliers)
KEY_SETS: dict[str, dict[str, int]] = {
    "clustered": dict(seq_len=1024, dim=64, block_size=64, clusters=4, outlier_blocks=0, seed=0),
    "outliers": dict(seq_len=1024, dim=64, block_size=64, clusters=4, outlier_blocks=3, seed=1),
    "long": dict(seq_len=16384, dim=16, block_size=64, clusters=8, outlier_blocks=8, seed=2),
}


def make_key_sets() -> dict[str, np.ndarray]:
    """Every sample key set, by name: float16 ``[S, D]`` numpy arrays."""
    return {name: clustered_keys(**kwargs).to(torch.float16).numpy()
            for name, kwargs in KEY_SETS.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DATA_DIR, help=f"folder to write to (default {DATA_DIR})")
    out = parser.parse_args(argv).out
    out.mkdir(parents=True, exist_ok=True)
    for name, keys in make_key_sets().items():
        np.save(out / f"{name}.npy", keys, allow_pickle=False)
        print(f"{out / name}.npy: {keys.shape[0]} x {keys.shape[1]} {keys.dtype}")


if __name__ == "__main__":
    main()
