"""Packaging: the pip and conda dependency lists agree; the package imports without a GPU or triton."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CONDA_TO_PIP = {"pytorch": "torch"}
NOT_PACKAGES = {"python", "pip", "tomli", "topo_attn"}  # the interpreter, the installer, a Python 3.10 backport,
# the project itself (the test extra pulls in the notebooks extra)


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement.strip(), maxsplit=1)[0].lower()


def _pip_names() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs += extra
    return {_name(r) for r in reqs} - NOT_PACKAGES


def _conda_names() -> set[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    names = {CONDA_TO_PIP.get(_name(d), _name(d)) for d in env["dependencies"] if isinstance(d, str)}
    # packages that conda-forge lacks come from PyPI through the pip section (the project itself aside)
    pip_section = [r for d in env["dependencies"] if isinstance(d, dict) for r in d.get("pip", [])]
    names |= {_name(r) for r in pip_section if not r.startswith("-")}
    return names - NOT_PACKAGES


def test_environment_yml_names_the_same_dependencies_as_pyproject():
    pip, conda = _pip_names(), _conda_names()
    assert pip == conda, f"only in pyproject: {sorted(pip - conda)}; only in environment.yml: {sorted(conda - pip)}"
    assert {"torch", "triton", "numpy", "scipy", "gudhi", "papermill", "pytest", "hypothesis"} <= pip


def test_environment_yml_installs_the_package_itself():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = [d for d in env["dependencies"] if isinstance(d, dict)]
    assert pip_section and "-e ." in pip_section[0]["pip"]


def test_package_imports_without_gpu_and_without_triton():
    """``import topo_attn`` works with no GPU visible and does not import triton (the kernel module loads on
    first use, so TRITON_INTERPRET can still be set after importing the package)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    code = ("import sys, topo_attn; assert 'triton' not in sys.modules, 'triton imported'; "
            "s = topo_attn.dense_causal_schedule(100, 16); print(s.counts())")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "28 / 28 causal blocks" in result.stdout


def test_public_api_is_exported():
    import topo_attn

    for name in topo_attn.__all__:
        assert getattr(topo_attn, name) is not None
    assert {"BlockSchedule", "topology_schedule", "scheduled_attention", "dense_masked_attention",
            "block_salience", "persistence_barcode", "block_centroids", "dense_causal_schedule"} <= set(topo_attn.__all__)
