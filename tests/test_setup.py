"""The two commands of README.md's "Set up and run": `.ci/run` is exactly its set-up script and its test
command, the script installs the Debian packages the README lists, and the script's system-package step does
what it says as root, with sudo, and without either (run with fake `id`, `dpkg-query`, `apt-get` and `sudo` on
a PATH of their own, `TOPO_ATTN_SETUP_ONLY=system`; nothing is installed and pip is never run)."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / ".ci" / "setup"
RUN = ROOT / ".ci" / "run"
BROWSER_TEST = ROOT / "tests" / "notebooks" / "test_explorer_browser.py"
BASH = shutil.which("bash")
# what the script's system step runs besides bash's builtins and the fakes
TOOLS = ("dirname", "mktemp", "rm", "cat", "env", "true")
# the lines of .ci/run that are not commands of the README: the shebang, strict mode, the repository root
RUN_PREAMBLE = ("#!/usr/bin/env bash", "set -euo pipefail", 'cd "$(dirname "$0")/.."')


def _setup_section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Set up and run")
    end = readme.find("\n## ", start + 1)
    return readme[start:end if end >= 0 else None]


def _readme_commands() -> tuple[str, str]:
    """(the set-up command, the test command) from the set-up section's two bash blocks."""
    blocks = re.findall(r"```bash\n(.*?)\n```", _setup_section(), flags=re.S)
    assert len(blocks) == 2, f"the set-up section should show two commands, shows {blocks}"
    setup_then_notebooks, test = (b.strip() for b in blocks)
    setup, _, notebooks = setup_then_notebooks.partition(" && ")
    assert notebooks == ".venv/bin/python -m topo_attn.notebooks", setup_then_notebooks
    return setup, test


def _readme_packages() -> list[str]:
    """The Debian packages in the set-up section's table (first column)."""
    return re.findall(r"^\s*\| `([a-z0-9.+-]+)` \|", _setup_section(), flags=re.M)


def _script_packages() -> list[str]:
    match = re.search(r"^SYSTEM_PACKAGES=\(([^)]*)\)$", SETUP.read_text(), flags=re.M)
    assert match, "SYSTEM_PACKAGES=(...) not found in .ci/setup"
    return match.group(1).split()


def _needed_by() -> dict[str, str]:
    return dict(re.findall(r'^\s*\[([a-z0-9.+-]+)\]="([^"]*)"$', SETUP.read_text(), flags=re.M))


def test_ci_run_is_the_readme_setup_then_the_readme_tests():
    setup, test = _readme_commands()
    assert setup == ".ci/setup"
    assert test == ".venv/bin/python -m pytest"
    lines = [line.strip() for line in RUN.read_text().splitlines()]
    commands = [line for line in lines if line and not line.startswith("#") or line == RUN_PREAMBLE[0]]
    assert commands == [*RUN_PREAMBLE, setup, test]


@pytest.mark.parametrize("script", [SETUP, RUN], ids=lambda p: p.name)
def test_scripts_are_executable_and_parse(script):
    assert os.access(script, os.X_OK), f"{script} is not executable"
    subprocess.run([BASH, "-n", str(script)], check=True)


def test_script_installs_the_packages_the_readme_lists():
    assert _readme_packages(), "no Debian package table in the README's set-up section"
    assert sorted(_script_packages()) == sorted(_readme_packages())
    assert sorted(_needed_by()) == sorted(_script_packages()), "every package says what needs it"


def test_browser_test_message_names_what_the_script_installs_for_it():
    """The browser test's hint names `.ci/setup` and each package that the script installs for that test."""
    tree = ast.parse(BROWSER_TEST.read_text())
    hint = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == "INSTALL_HINT" for t in node.targets))
    for_browser = [p for p, why in _needed_by().items() if "browser test" in why]
    assert sorted(for_browser) == ["chromium", "fonts-dejavu-core"]
    assert "`.ci/setup`" in hint and "root" in hint and "sudo" in hint
    assert f"sudo apt-get install {' '.join(for_browser)}" in hint
    for package in for_browser:
        assert f"`{package}`" in hint


# ---------------------------------------------------------------------------- the system-package step
FAKES = {
    "id": 'echo "$FAKE_UID"',
    # dpkg-query -W -f=${db:Status-Status} PACKAGE: installed for the packages in $FAKE_INSTALLED
    "dpkg-query": 'for p in $FAKE_INSTALLED; do [ "$p" = "$3" ] && { printf installed; exit 0; }; done\n'
                  'echo "dpkg-query: no packages found matching $3" >&2; exit 1',
    "apt-get": 'echo "apt-get $*" >> "$FAKE_LOG"; [ "$FAKE_APT" != fails ] || { echo "E: no network" >&2; exit 100; }',
    "sudo": 'echo "sudo $*" >> "$FAKE_LOG"; [ "$FAKE_SUDO" = works ] || exit 1; shift; exec "$@"',
}


def _system_step(tmp_path: Path, uid: int, installed: tuple[str, ...] = (), sudo: str | None = None,
                 apt: str = "works", debian: bool = True):
    """Run `.ci/setup`'s system step with only TOOLS and the fakes on PATH (sudo: None absent, "fails" or
    "works"; apt: "works" or "fails"; debian=False: no dpkg-query or apt-get); returns the completed process
    and the fake apt-get and sudo calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    for name, body in FAKES.items():
        if name == "sudo" and sudo is None or name in ("dpkg-query", "apt-get") and not debian:
            continue
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls.log"
    env = {"PATH": str(bin_dir), "TOPO_ATTN_SETUP_ONLY": "system", "FAKE_UID": str(uid),
           "FAKE_INSTALLED": " ".join(installed), "FAKE_SUDO": sudo or "", "FAKE_APT": apt, "FAKE_LOG": str(log)}
    proc = subprocess.run([BASH, str(SETUP)], env=env, capture_output=True, text=True, timeout=60)
    return proc, log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("sudo, why", [(None, "not root, and there is no sudo"),
                                       ("fails", "not root, and sudo needs a password")])
def test_without_root_or_sudo_it_names_the_missing_packages_and_goes_on(tmp_path, sudo, why):
    proc, calls = _system_step(tmp_path, uid=1000, installed=("python3-venv",), sudo=sudo)
    assert proc.returncode == 0, proc.stderr
    assert not [c for c in calls if c.startswith("apt-get")], calls
    err = proc.stderr
    assert "could not install the Debian packages chromium fonts-dejavu-core" in err
    assert why in err
    for package in ("chromium", "fonts-dejavu-core"):
        assert f"  {package}: needed by {_needed_by()[package]}" in err
    assert "python3-venv" not in err  # installed: not named
    assert "sudo apt-get install chromium fonts-dejavu-core" in err
    assert "goes on" in err


def test_with_sudo_it_installs_the_missing_packages_through_sudo(tmp_path):
    proc, calls = _system_step(tmp_path, uid=1000, installed=("fonts-dejavu-core",), sudo="works")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ".ci/setup: system packages: installing python3-venv chromium (with sudo)\n"
    assert proc.stderr == ""
    assert calls == ["sudo -n true",
                     "sudo -n env DEBIAN_FRONTEND=noninteractive apt-get -qq update",
                     "apt-get -qq update",
                     "sudo -n env DEBIAN_FRONTEND=noninteractive apt-get -qq install -y --no-install-recommends "
                     "python3-venv chromium",
                     "apt-get -qq install -y --no-install-recommends python3-venv chromium"]


def test_as_root_it_installs_with_apt_get(tmp_path):
    proc, calls = _system_step(tmp_path, uid=0, sudo="works")
    assert proc.returncode == 0, proc.stderr
    assert calls == ["apt-get -qq update",
                     "apt-get -qq install -y --no-install-recommends python3-venv chromium fonts-dejavu-core"]


def test_with_everything_installed_it_does_nothing(tmp_path):
    proc, calls = _system_step(tmp_path, uid=1000, installed=tuple(_script_packages()))
    assert proc.returncode == 0, proc.stderr
    assert calls == []
    assert proc.stdout == (".ci/setup: system packages: python3-venv chromium fonts-dejavu-core already "
                           "installed\n")


def test_when_apt_get_fails_it_shows_why_and_goes_on(tmp_path):
    proc, calls = _system_step(tmp_path, uid=0, installed=("python3-venv", "fonts-dejavu-core"), apt="fails")
    assert proc.returncode == 0, proc.stderr
    assert calls == ["apt-get -qq update"]
    assert "E: no network" in proc.stderr
    assert "could not install the Debian packages chromium: apt-get failed" in proc.stderr
    assert f"  chromium: needed by {_needed_by()['chromium']}" in proc.stderr


def test_off_debian_it_says_what_to_install(tmp_path):
    proc, calls = _system_step(tmp_path, uid=0, debian=False)
    assert proc.returncode == 0, proc.stderr
    assert calls == []
    assert "not a Debian system" in proc.stdout and "python3-venv chromium fonts-dejavu-core" in proc.stdout


def test_an_unknown_step_is_refused(tmp_path):
    proc = subprocess.run([BASH, str(SETUP)], env={**os.environ, "TOPO_ATTN_SETUP_ONLY": "everything"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "TOPO_ATTN_SETUP_ONLY must be one of system, venv, torch, package (got 'everything')" in proc.stderr
