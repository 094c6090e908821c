"""The documentation runs as written: README.md and every page under docs/ (the conventions are on
docs/development.md; in short):

- every ```python block runs: a page's blocks in order in one fresh process (state carries from block to block,
  like a notebook), from the repository root, in Triton's interpreter when there is no GPU, so they use small
  shapes; a block preceded by the line ``<!-- gpu -->`` runs only on a GPU (skipped, and reported so, without);
- the README's first example runs alone on a CPU exactly as written and prints what the README says it prints;
- every ``python -m topo_attn...`` line of a bash block parses with that entry point's ``build_parser()`` (the
  commands are not run), so no documented flag is misspelt or gone;
- relative links resolve, every page is reachable from the front page, and the README stays a front page.
"""


from __future__ import annotations

import importlib
import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import DEVICE

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
GPU_MARK = "<!-- gpu -->"
FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)[ \t]*$")
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
COMMAND = re.compile(r"^(?:\.venv/bin/)?python3? -m (topo_attn(?:\.[a-z_]+)*)(?:\s|$)")
PAGE_TIMEOUT_S = 600


@dataclass(frozen=True)
class Block:
    """A fenced code block: its language, text, first line number (1-based) and whether `<!-- gpu -->` marks it."""
    language: str
    text: str
    line: int
    gpu: bool


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, in order."""
    found, lines = [], page.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != "```":
            j += 1
        assert j < len(lines), f"{page.name}:{i + 1}: a code fence is never closed"
        before = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        found.append(Block(opening.group(1).lower(), "\n".join(lines[i + 1:j]) + "\n", i + 1, before == GPU_MARK))
        i = j + 1
    return found


def _id(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


PAGES_WITH_PYTHON = [p for p in pages() if any(b.language == "python" for b in blocks(p))]


def _script(page: Path, with_gpu_blocks: bool) -> str:
    """A page's python blocks as one script: each block announced on stderr, so a failure names its line."""
    parts = []
    for b in blocks(page):
        if b.language != "python" or (b.gpu and not with_gpu_blocks):
            continue
        parts.append(f"import sys as _s; print('--- {page.name}:{b.line}', file=_s.stderr, flush=True)\n{b.text}")
    return "\n".join(parts)


def _run_page(page: Path, with_gpu_blocks: bool) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
    if DEVICE != "cuda":
        env["TRITON_INTERPRET"] = "1"
    result = subprocess.run([sys.executable, "-c", _script(page, with_gpu_blocks)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=PAGE_TIMEOUT_S)
    assert result.returncode == 0, (f"{_id(page)}: a python block failed (the last '---' line names it)\n"
                                    f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}")


@pytest.mark.parametrize("page", PAGES_WITH_PYTHON, ids=_id)
def test_python_blocks_run_as_written(page):
    """Every python block not marked `<!-- gpu -->` runs, in order, in one fresh process on this machine (the
    kernels compiled on a GPU, in Triton's interpreter on a CPU)."""
    _run_page(page, with_gpu_blocks=False)


GPU_PAGES = [p for p in PAGES_WITH_PYTHON if any(b.language == "python" and b.gpu for b in blocks(p))]


@pytest.mark.cuda
@pytest.mark.parametrize("page", GPU_PAGES, ids=_id)
def test_gpu_blocks_run_on_a_gpu(page):
    """On a GPU, every python block of the page runs in order, the `<!-- gpu -->` ones included."""
    _run_page(page, with_gpu_blocks=True)


def test_readme_first_example_runs_on_a_cpu_as_written():
    """The README's first python block is the one a newcomer pastes: it is not GPU-only, picks its device itself
    and runs alone, exactly as written, in a fresh process without TRITON_INTERPRET in the environment (the
    example must handle that itself) and with CUDA hidden. Where Triton's interpreter cannot run with this
    machine's triton and numpy (``launch.interpreter_unsupported_reason``), it stops with that reason instead."""
    from topo_attn.launch import interpreter_unsupported_reason

    first = next(b for b in blocks(README) if b.language == "python")
    assert not first.gpu, "the README's first example must run on a CPU"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    result = subprocess.run([sys.executable, "-c", first.text], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=PAGE_TIMEOUT_S)
    problem = interpreter_unsupported_reason()
    if problem is not None:
        assert result.returncode != 0 and result.stderr.strip().splitlines()[-1] == f"RuntimeError: {problem}", (
            result.stdout + result.stderr)
        return
    assert result.returncode == 0, result.stdout + result.stderr
    printed = result.stdout.strip().splitlines()
    assert printed, "the first example prints nothing a reader could compare with"
    assert f"`{printed[0]}`" in README.read_text(), f"the README no longer states what its example prints: {printed[0]}"


def _commands(page: Path) -> list[tuple[int, list[str]]]:
    """(line, argv) of each `python -m topo_attn...` line in the page's bash blocks (continuations joined)."""
    found = []
    for b in blocks(page):
        if b.language not in ("bash", "sh", "shell", "console"):
            continue
        for k, line in enumerate(b.text.replace("\\\n", " ").splitlines()):
            for command in line.split("&&"):
                words = shlex.split(command.strip().removeprefix("$ "), comments=True)
                while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):  # VAR=value before the command
                    words = words[1:]
                if words and COMMAND.match(" ".join(words)):
                    found.append((b.line + 1 + k, words[2:]))
    return found


COMMANDS = [(page, line, argv) for page in pages() for line, argv in _commands(page)]


@pytest.mark.parametrize("page, line, argv", COMMANDS, ids=[f"{_id(p)}:{n}" for p, n, _ in COMMANDS])
def test_documented_command_lines_parse(page, line, argv):
    """Every `python -m topo_attn...` line of a bash block names an entry point whose `build_parser()` accepts
    its arguments, so no documented flag is misspelt or gone (the commands themselves are not run)."""
    module_name = argv[0]
    module = importlib.import_module(module_name)
    if not hasattr(module, "build_parser"):
        module = importlib.import_module(f"{module_name}.__main__")
    parser = module.build_parser()
    try:
        parser.parse_args(argv[1:])
    except SystemExit as exit_:
        if exit_.code not in (0, None):  # --help exits 0
            pytest.fail(f"{_id(page)}:{line}: `python -m {' '.join(argv)}` does not parse")


@pytest.mark.parametrize("page", pages(), ids=_id)
def test_relative_links_resolve(page):
    """Every relative link of a page points to a file or folder of the repository."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    missing = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.exists():
            missing.append(target)
    assert not missing, f"{_id(page)} links to missing files: {missing}"


def test_every_docs_page_is_reachable_from_the_front_page():
    """Each page under docs/ is linked from README.md or from docs/README.md (the index), and the README links
    the index."""
    linked = set()
    for page in (README, DOCS / "README.md"):
        if page.exists():
            for target in LINK.findall(page.read_text()):
                linked.add((page.parent / target.split("#")[0]).resolve())
    assert (DOCS / "README.md").resolve() in linked, "README.md does not link docs/README.md"
    orphans = [p.name for p in DOCS.glob("*.md") if p.resolve() not in linked and p.name != "README.md"]
    assert not orphans, f"docs pages linked from neither README.md nor docs/README.md: {orphans}"


def test_readme_is_a_front_page():
    """The README stays a front page: the rest lives in docs/ (about 200 lines at most)."""
    lines = README.read_text().count("\n")
    assert lines <= 220, f"README.md has {lines} lines; move reference material to docs/"


def test_fence_parser_sees_gpu_marks_and_languages(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(textwrap.dedent("""\
        # T
        ```python
        a = 1
        ```

        <!-- gpu -->
        ```python
        b = 2
        ```
        ```bash
        python -m topo_attn.demo --seq-len 64 \\
            --block-size 16 && echo done
        ```
        """))
    found = blocks(page)
    assert [(b.language, b.gpu, b.line) for b in found] == [("python", False, 2), ("python", True, 7),
                                                            ("bash", False, 10)]
    assert _commands(page) == [(11, ["topo_attn.demo", "--seq-len", "64", "--block-size", "16"])]
    assert "b = 2" not in _script(page, with_gpu_blocks=False) and "b = 2" in _script(page, True)
