"""The commit record of a result (topo_attn.provenance): what ``code_version`` finds in a checkout, how
``commit_text`` says it, ``check_commit``'s refusals, the header ``run_record`` writes and the versions
``package_version`` reads, and that every committed result names a commit of this history."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from topo_attn import provenance

RESULTS_DIR = provenance.ROOT / "data" / "benchmarks"


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_root_is_the_repository():
    assert provenance.ROOT == Path(__file__).resolve().parents[1]
    assert (provenance.ROOT / provenance.PACKAGE_DIR / "provenance.py").is_file()


def test_package_version_prefers_the_imported_module_then_the_distribution(monkeypatch):
    import numpy as np

    assert provenance.package_version("numpy") == np.__version__
    assert provenance.package_version("pytest") == importlib.metadata.version("pytest")
    assert provenance.package_version("no_such_package_of_topo_attn") is None
    # a module imported under another distribution's name (pytorch-triton for triton) reports its own version
    monkeypatch.setitem(sys.modules, "no_such_package_of_topo_attn", types.SimpleNamespace(__version__="9.8.7"))
    assert provenance.package_version("no_such_package_of_topo_attn") == "9.8.7"


def test_run_record_is_the_header_of_a_result(tmp_path):
    import torch

    record = provenance.run_record("cpu", "python -m topo_attn.lm retrieval --probes 2")
    assert record["gpu"] == "cpu" and record["torch"] == torch.__version__
    assert record["triton"] == provenance.package_version("triton") is not None
    assert record["command"] == "python -m topo_attn.lm retrieval --probes 2"
    assert record["date"] == datetime.date.today().isoformat()
    assert {k: record[k] for k in provenance.COMMIT_KEYS if k in record} == provenance.code_version()
    elsewhere = provenance.run_record(torch.device("cpu"), "x", root=tmp_path)
    assert elsewhere["commit"] is None and "not in a git checkout" in elsewhere["commit_source"]


@pytest.mark.cuda
def test_run_record_names_the_gpu_of_a_cuda_device():
    import torch

    for device in ("cuda", torch.device("cuda", torch.cuda.current_device())):
        assert provenance.run_record(device, "x")["gpu"] == torch.cuda.get_device_name()


def test_code_version_names_the_commit_and_uncommitted_changes(tmp_path):
    repo = tmp_path / "repo"
    (repo / "topo_attn").mkdir(parents=True)
    (repo / "topo_attn" / "a.py").write_text("x = 1\n")
    (repo / "README.md").write_text("r\n")
    assert provenance.code_version(repo)["commit"] is None  # not a checkout
    assert "not in a git checkout" in provenance.code_version(repo)["commit_source"]
    git(repo, "init", "-q")
    assert "no commit yet" in provenance.code_version(repo)["commit_source"]
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "first")
    version = provenance.code_version(repo)
    assert set(version) == set(provenance.COMMIT_KEYS)
    assert version["commit"] == git(repo, "rev-parse", "--short", "HEAD") and version["dirty"] is False
    assert provenance.commit_text(version) == f"commit {version['commit']}"
    (repo / "README.md").write_text("changed outside the package\n")
    assert provenance.code_version(repo)["dirty"] is False
    (repo / "topo_attn" / "new.py").write_text("")  # untracked, under the package
    version = provenance.code_version(repo)
    assert version["dirty"] is True
    assert provenance.commit_text(version) == f"commit {version['commit']} with uncommitted changes under topo_attn/"
    inside = provenance.code_version(repo / "topo_attn")  # an installed package inside another repository
    assert inside["commit"] is None and "not the top of a git checkout" in inside["commit_source"]
    assert provenance.commit_text(inside).startswith("commit unknown (") and provenance.commit_text({}) == (
        "commit not recorded")


@pytest.mark.parametrize("field, value", [("commit", 1234567), ("dirty", "no"), ("commit_source", None)])
def test_check_commit_refuses_wrong_types(field, value):
    with pytest.raises(ValueError, match=f"x.json: '{field}' must be"):
        provenance.check_commit("x.json", {"commit": "abc1234", field: value})
    provenance.check_commit("x.json", {"commit": None, "commit_source": "an installed package"})
    provenance.check_commit("x.json", {})  # a file from before the commit was recorded


def committed_commits() -> dict[str, str]:
    """Every commit named in data/benchmarks: where (file, and run inside it) -> commit, or None where there is
    none; a missing or empty ``commit_source`` gives that place ``"no commit_source"``."""
    found = {}
    for path in sorted(RESULTS_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        for i, run in enumerate([data] + data.get("runs", [])):
            where = path.name + (f", run {i}" if i else "")
            source = run.get("commit_source")
            found[where] = run.get("commit") if isinstance(source, str) and source else "no commit_source"
    return found


def test_every_committed_result_names_the_commit_of_its_code():
    """Every file in data/benchmarks (the benchmark runner's and the language-model study's alike), and every
    run inside one, names a commit and how it was determined."""
    found = committed_commits()
    assert len(found) >= 8
    missing = {where: c for where, c in found.items() if not re.fullmatch(r"[0-9a-f]{7,40}", str(c))}
    assert not missing, f"results without a commit (or without commit_source): {missing}"


def test_committed_results_name_commits_of_this_history():
    """Each commit named in data/benchmarks is one that HEAD descends from (needs the clone's history)."""
    here = provenance.code_version()
    if here["commit"] is None or git(provenance.ROOT, "rev-parse", "--is-shallow-repository") == "true":
        pytest.skip(f"no git history to check the commits against ({here['commit_source']})")
    for commit in sorted(set(committed_commits().values())):
        result = subprocess.run(["git", "merge-base", "--is-ancestor", commit, "HEAD"], cwd=provenance.ROOT,
                                capture_output=True, text=True)
        assert result.returncode == 0, f"{commit} is not a commit that HEAD descends from: {result.stderr}"
