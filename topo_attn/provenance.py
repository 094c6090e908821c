"""Which code produced a result: the commit record that every result file of the kit carries.

A result file (the benchmark runner's, ``python -m topo_attn.bench``, and the language-model study's commands,
``python -m topo_attn.lm ...``) records the code it came from in :data:`COMMIT_KEYS`: ``commit``, the short hash
of the repository's commit (``None`` when it is not known), ``dirty``, whether ``topo_attn/`` had uncommitted
changes (left out when not known), and ``commit_source``, how the commit was determined or why there is none.
The commands write them from :func:`code_version`; :func:`commit_text` says them in words and
:func:`check_commit` refuses a file whose keys have the wrong types. :func:`run_record` is the whole header a
result file starts with (the machine, the versions, the command, the date and the commit);
:func:`package_version` is how every part of the kit reads an installed package's version.

This module sits below both ``bench`` and ``lm``, which import it; it imports nothing of the package.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import platform
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The repository's root (``topo_attn/provenance.py`` is one folder below it)."""
PACKAGE_DIR = "topo_attn"
"""The package's folder in the repository: uncommitted changes under it make a result ``dirty``."""
COMMIT_KEYS = ("commit", "dirty", "commit_source")
"""The fields naming the code a result came from (see the module's docstring)."""


def code_version(root: str | Path = ROOT) -> dict:
    """What to record about the code in ``root`` (default :data:`ROOT`, the repository of this package), as
    the :data:`COMMIT_KEYS` of a result file.

    Returns:
        ``{"commit": <git rev-parse --short HEAD>, "dirty": <whether git status shows changes under
        topo_attn/, untracked files included>, "commit_source": <how>}`` when ``root`` is the top of a git
        checkout; otherwise ``{"commit": None, "commit_source": <why not>}``: ``root`` is not a checkout (an
        installed package lies in site-packages, possibly inside another repository's folder), the checkout
        has no commit yet, or git is not installed.
    """
    root = Path(root).resolve()

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              check=True).stdout.strip()

    try:
        top = Path(git("rev-parse", "--show-toplevel")).resolve()
    except FileNotFoundError:
        return {"commit": None, "commit_source": f"git is not installed, so the commit of {root} is unknown"}
    except subprocess.CalledProcessError:
        return {"commit": None, "commit_source": f"{root} is not in a git checkout (an installed package?)"}
    if top != root:
        return {"commit": None, "commit_source": f"{root} is not the top of a git checkout (it lies inside "
                                                 f"{top}; an installed package?)"}
    try:
        commit = git("rev-parse", "--short", "HEAD")
    except subprocess.CalledProcessError:
        return {"commit": None, "commit_source": f"the git checkout {root} has no commit yet"}
    dirty = bool(git("status", "--porcelain", "--", PACKAGE_DIR))
    return {"commit": commit, "dirty": dirty, "commit_source": f"git rev-parse --short HEAD when it ran; dirty: "
                                                               f"git status --porcelain -- {PACKAGE_DIR}/"}


def package_version(name: str) -> str | None:
    """The version of the installed package ``name``: the ``__version__`` of the module when it is imported
    already (a build installed under another distribution name, such as ``pytorch-triton``, included), else
    its distribution's version (:mod:`importlib.metadata`); ``None`` when it is not installed."""
    version = getattr(sys.modules.get(name), "__version__", None)
    if isinstance(version, str):
        return version
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def run_record(device, command: str, root: str | Path = ROOT) -> dict:
    """The header of a result file: ``gpu`` (the name of ``device``'s GPU, or ``"cpu"`` when ``device`` is
    not a CUDA device), the ``torch``, ``triton`` and ``transformers`` versions (:func:`package_version`),
    ``command`` as given (the command line that produced the result), ``date`` (today, ISO) and the
    :data:`COMMIT_KEYS` of ``root`` (:func:`code_version`). ``device`` is a ``torch.device`` or a string
    such as ``"cuda"``, ``"cuda:1"`` or ``"cpu"``."""
    import torch

    device = torch.device(device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return dict(gpu=gpu, torch=package_version("torch"), triton=package_version("triton"),
                transformers=package_version("transformers"), command=command,
                date=datetime.date.today().isoformat(), **code_version(root))


def commit_text(info: Mapping) -> str:
    """The code a result came from, in words, from the :data:`COMMIT_KEYS` in ``info`` (a result file's top
    level, a run in it, or a header of :func:`topo_attn.bench.results.load_suite`): ``"commit abc1234"``,
    ``"commit abc1234 with uncommitted changes under topo_attn/"`` (``dirty``), ``"commit unknown
    (<commit_source>)"`` (``commit`` is None) or ``"commit not recorded"`` (no ``commit`` key)."""
    if "commit" not in info:
        return "commit not recorded"
    if info["commit"] is None:
        return f"commit unknown ({info.get('commit_source') or 'no reason given'})"
    changes = f" with uncommitted changes under {PACKAGE_DIR}/" if info.get("dirty") else ""
    return f"commit {info['commit']}{changes}"


def check_commit(path: str | Path, data: Mapping) -> None:
    """Raise ``ValueError`` naming ``path`` when the :data:`COMMIT_KEYS` of ``data`` (a result file's parsed
    top level) have the wrong types; absent keys are fine (the file predates them or comes from elsewhere)."""
    expected = {"commit": (str, type(None)), "dirty": (bool,), "commit_source": (str,)}
    for key, types in expected.items():
        if key in data and not isinstance(data[key], types):
            raise ValueError(f"{path}: {key!r} must be {' or '.join(t.__name__ for t in types)}, "
                             f"got {data[key]!r}")


def cpu_model() -> str:
    """The CPU's model name, as a CPU-measured result records it: from ``/proc/cpuinfo``, else what
    :mod:`platform` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"
