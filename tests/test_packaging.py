"""Packaging: the pip and conda dependency lists agree; the package imports without a GPU or triton; a wheel,
installed apart from the repository, carries its sample data and runs the demo."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
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


# run inside the installed copy, from a folder outside the repository
INSTALLED_CHECK = """
import sys
from pathlib import Path

import topo_attn
from topo_attn.samples import DATA_DIR, load_key_set
from topo_attn.selection import load_real_qkv

site = Path(sys.argv[1]).resolve()
assert Path(topo_attn.__file__).resolve().is_relative_to(site), topo_attn.__file__
assert DATA_DIR.resolve().is_relative_to(site), DATA_DIR
keys = load_key_set("clustered")
assert tuple(keys.shape) == (1024, 64) and str(keys.dtype) == "torch.float16", (keys.shape, keys.dtype)
q, k, v, info = load_real_qkv()
assert tuple(q.shape) == tuple(k.shape) == tuple(v.shape) == (2, 12, 512, 32), q.shape
print("installed at", Path(topo_attn.__file__).parent)
"""


def test_wheel_installed_apart_from_the_repository_finds_its_data_and_runs_the_demo(tmp_path):
    """Build a wheel from a copy of the sources, install it (no dependencies) into a fresh virtual environment
    that sees this environment's site-packages only for torch, triton, numpy and scipy (a ``.pth`` file, which
    does not run the editable install's finder), and from a folder outside the repository load a sample key
    set and the captured MiniLM q, k, v and run the demo."""
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "topo_attn", source / "topo_attn", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    run = lambda *args, **kw: subprocess.run(args, capture_output=True, text=True, timeout=120, **kw)  # noqa: E731
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                "-w", str(tmp_path / "dist"), str(source))
    assert built.returncode == 0, built.stdout + built.stderr
    wheel, = (tmp_path / "dist").glob("topo_attn-*.whl")

    venv = tmp_path / "venv"
    made = run(sys.executable, "-m", "venv", "--without-pip", str(venv))
    assert made.returncode == 0, made.stderr
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = Path(run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    ours = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}  # torch, triton, numpy, scipy
    (site / "dependencies.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))
    installed = run(sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                    "-q", str(wheel))
    assert installed.returncode == 0, installed.stdout + installed.stderr

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "TRITON_INTERPRET")}
    checked = run(str(python), "-c", INSTALLED_CHECK, str(site), cwd=elsewhere, env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    demo = run(str(python), "-m", "topo_attn.demo", "--seq-len", "128", "--heads", "1", cwd=elsewhere, env=env)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "vs float64 reference" in demo.stdout and demo.stdout.rstrip().endswith("OK")
