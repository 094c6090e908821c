"""The sample key sets (package data in topo_attn/sample_data/): reproduced exactly by data/make_key_sets.py,
and loaded by name."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from topo_attn import samples

SCRIPT = Path(__file__).resolve().parents[1] / "data" / "make_key_sets.py"


def test_script_reproduces_the_committed_files():
    made = runpy.run_path(str(SCRIPT))["make_key_sets"]()
    assert sorted(made) == samples.key_set_names() == ["clustered", "long", "outliers"]
    for name, keys in made.items():
        committed = samples.load_key_set(name)
        assert committed.dtype == torch.float16 and committed.ndim == 2
        assert np.array_equal(keys, committed.numpy()), f"{samples.DATA_DIR}/{name}.npy differs from the script's"


def test_script_writes_where_asked(tmp_path):
    # the repository on the path, so the script runs from a clone whether or not the package is installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SCRIPT.parents[1]), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert samples.key_set_names(tmp_path) == ["clustered", "long", "outliers"]
    assert torch.equal(samples.load_key_set("clustered", tmp_path), samples.load_key_set("clustered"))


def test_load_key_sets_and_unknown_name():
    sets = samples.load_key_sets()
    assert {k: tuple(v.shape) for k, v in sets.items()} == {
        "clustered": (1024, 64), "long": (16384, 16), "outliers": (1024, 64)}
    with pytest.raises(ValueError, match="no key set 'nope'.*clustered"):
        samples.load_key_set("nope")


def test_data_dir_is_package_data():
    """The sample data live inside the package (so a wheel carries them), and pyproject.toml ships them."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    package = Path(samples.__file__).resolve().parent
    assert samples.DATA_DIR.parent == package and samples.DATA_DIR.is_dir()
    assert {p.name for p in samples.DATA_DIR.iterdir() if p.suffix in (".npy", ".npz")} == {
        "clustered.npy", "long.npy", "outliers.npy", "minilm_qkv.npz"}
    shipped = tomllib.loads((SCRIPT.parents[1] / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    data = samples.DATA_DIR.relative_to(package)
    assert {f"{data}/*.npy", f"{data}/*.npz"} <= set(shipped["topo_attn"])
