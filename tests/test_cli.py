"""Every ``python -m topo_attn...`` entry point (issue 38): a user's mistake ends in a line or two on stderr and exit
code 2, no traceback (``--debug`` shows it); ``--help`` names the program as a user types it; ``build_parser()``
gives the whole command line without importing triton or transformers; progress bars only on a terminal unless
``--progress`` forces one (no carriage-return frames in logs). The bad command lines run as subprocesses, each
failing in its checks before any real work."""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib
import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from topo_attn import cli

ROOT = Path(__file__).resolve().parents[1]
DOCTOR = (ROOT / "topo_attn" / "doctor.py").is_file()

# module run by ``python -m``, the module holding build_parser / main, and the prog a user types
ENTRY_POINTS = {
    "topo_attn.demo": ("topo_attn.demo", "python -m topo_attn.demo"),
    "topo_attn.notebooks": ("topo_attn.notebooks", "python -m topo_attn.notebooks"),
    "topo_attn.selection": ("topo_attn.selection.__main__", "python -m topo_attn.selection"),
    "topo_attn.bench": ("topo_attn.bench.__main__", "python -m topo_attn.bench"),
    "topo_attn.bench.tune": ("topo_attn.bench.tune", "python -m topo_attn.bench.tune"),
    "topo_attn.lm": ("topo_attn.lm.__main__", "python -m topo_attn.lm"),
    **({"topo_attn.doctor": ("topo_attn.doctor", "python -m topo_attn.doctor")} if DOCTOR else {}),
}


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def run_module(module: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


def run_in_process(module: str, args: list[str], capsys) -> subprocess.CompletedProcess:
    """What ``python -m module *args`` does, in this process: ``cli.run(main, args, prog=...)`` (argparse's own
    errors end in SystemExit, as there)."""
    entry, prog = ENTRY_POINTS[module]
    capsys.readouterr()
    try:
        code = cli.run(importlib.import_module(entry).main, args, prog=prog)
    except SystemExit as done:
        code = done.code
    captured = capsys.readouterr()
    return subprocess.CompletedProcess([module, *args], code, captured.out, captured.err)


# (python -m module, arguments, an option the message must name, more text it must hold); the first ones, one
# per entry point and the cases of issue 38, run as subprocesses, the others in this process through cli.run
SUBPROCESS_CASES = [
    ("topo_attn.demo", ["--block-size", "30"], "--block-size", "power of two"),
    ("topo_attn.selection", ["--key-set", "nosuchset"], "--key-set", "outliers"),
    ("topo_attn.selection", ["--budgets", "-1"], "--budgets", ">= 0, got -1"),
    ("topo_attn.bench", ["--cases", "nosuchcase"], "--cases", "nosuchcase"),
    ("topo_attn.bench.tune", ["--dtype", "float8"], "--dtype", "invalid choice"),
    ("topo_attn.notebooks", ["--notebooks", "/nonexistent/notebooks"], "--notebooks", "not a folder"),
    ("topo_attn.lm", ["evaluate", "--model", "/nonexistent/model"], "--model", "config.json"),
    ("topo_attn.lm", ["evaluate", "--eval-set", "/nonexistent.npz"], "--eval-set", "'documents' array"),
    *([("topo_attn.doctor", ["--no-such-option"], "--no-such-option", "")] if DOCTOR else []),
]
IN_PROCESS_CASES = [
    ("topo_attn.demo", ["--topk", "-1"], "--topk", ">= 0"),
    ("topo_attn.demo", ["--seq-len", "0"], "--seq-len", ">= 1"),
    ("topo_attn.demo", ["--dim", "48"], "--dim", "choose from"),
    ("topo_attn.selection", ["--budgets", "1", "2", "--report-budget", "4"], "--report-budget", "[1, 2]"),
    ("topo_attn.selection", ["--clusters", "0"], "--clusters", ">= 1"),
    ("topo_attn.bench", ["--suite", "bogus"], "--suite", "invalid choice"),
    ("topo_attn.notebooks", ["-p", "nosuchparameter", "1"], "--parameter", "nosuchparameter"),
    ("topo_attn.lm", ["evaluate", "--budgets", "-1"], "--budgets", ">= 0"),
    ("topo_attn.lm", ["evaluate", "--block-size", "30"], "--block-size", "power of two"),
    ("topo_attn.lm", ["evaluate", "--granularity", "token", "--strict"], "--strict", "token granularity"),
    ("topo_attn.lm", ["evaluate", "--dtype", "float8"], "--dtype", "invalid choice"),
    ("topo_attn.lm", ["research", "--model", "/nonexistent/model"], "--model", "config.json"),
    ("topo_attn.lm", ["research", "--eval-documents", "0"], "--eval-documents", ">= 1"),
    ("topo_attn.lm", ["passkey", "--block-size", "30"], "--block-size", "power of two"),
    ("topo_attn.lm", ["passkey", "--eval-set", "README.md"], "--eval-set", "not an .npz"),
    ("topo_attn.lm", ["train", "--out", "/nonexistent/out", "--context", "100"], "--context", "> 128"),
    ("topo_attn.lm", ["train", "--out", "/nonexistent/out", "--layers", "0"], "--layers", ">= 1"),
    ("topo_attn.lm", ["train", "--out", "/nonexistent/out", "--init", "/nonexistent/model"], "--init",
     "not a model folder"),
    ("topo_attn.lm", ["train"], "--out", "required"),
    ("topo_attn.lm", ["bogus"], "command", "invalid choice"),
]
if not has_cuda():
    IN_PROCESS_CASES += [
        ("topo_attn.lm", ["evaluate", "--device", "cuda"], "--device", "no CUDA GPU"),
        ("topo_attn.lm", ["train", "--out", "/nonexistent/out"], "--device", "no CUDA GPU"),
    ]

# a mistake per entry point that main() finds (not argparse): --debug shows its traceback
DEBUG_CASES = [
    ("topo_attn.demo", ["--block-size", "30"]),
    ("topo_attn.selection", ["--key-set", "nosuchset"]),
    ("topo_attn.bench", ["--cases", "nosuchcase"]),
    ("topo_attn.notebooks", ["--notebooks", "/nonexistent/notebooks"]),
    ("topo_attn.lm", ["evaluate", "--model", "/nonexistent/model"]),
    *([("topo_attn.bench.tune", [])] if not has_cuda() else []),  # without a GPU: the sweep's own message
]
HELP_CASES = [(module, [], prog) for module, (_, prog) in ENTRY_POINTS.items()] + [
    ("topo_attn.lm", [command], f"python -m topo_attn.lm {command}") for command in ("train", "evaluate", "research",
                                                                                    "passkey")]
HELP_SUBPROCESS = "topo_attn.bench"  # (issue 38: its --help named the program __main__.py); the others in process

SUBPROCESS_RUNS = ([(m, tuple(a)) for m, a, _, _ in SUBPROCESS_CASES] + [(m, (*a, "--debug")) for m, a in DEBUG_CASES]
                   + [(HELP_SUBPROCESS, ("--help",))])


@pytest.fixture(scope="module")
def subprocess_results() -> dict:
    """Every subprocess of this module, run two or four at a time (each mostly starts Python and imports torch)."""
    with concurrent.futures.ThreadPoolExecutor(max(2, min(4, os.cpu_count() or 2))) as pool:
        futures = {key: pool.submit(run_module, key[0], *key[1]) for key in SUBPROCESS_RUNS}
        return {key: future.result() for key, future in futures.items()}


def check_short_message(result: subprocess.CompletedProcess, module: str, option: str, text: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert 1 <= len(lines) <= 3, result.stderr
    assert option in result.stderr and text in result.stderr
    assert lines[0].startswith(ENTRY_POINTS[module][1]) and ": error: " in lines[0]
    assert "Repo id" not in result.stderr  # transformers never reads a missing model folder as a Hub name
    if module == "topo_attn.demo":
        assert result.stdout == ""  # the demo fails before it prints anything


@pytest.mark.parametrize("module, args, option, text", SUBPROCESS_CASES,
                         ids=[f"{m} {' '.join(a)}" for m, a, _, _ in SUBPROCESS_CASES])
def test_a_mistake_is_a_short_message_and_exit_2(module, args, option, text, subprocess_results):
    check_short_message(subprocess_results[(module, tuple(args))], module, option, text)


@pytest.mark.parametrize("module, args, option, text", IN_PROCESS_CASES,
                         ids=[f"{m} {' '.join(a)}" for m, a, _, _ in IN_PROCESS_CASES])
def test_more_mistakes_through_cli_run(module, args, option, text, capsys):
    check_short_message(run_in_process(module, args, capsys), module, option, text)


def test_the_selection_harness_lists_the_key_sets(subprocess_results):
    from topo_attn import samples

    err = subprocess_results[("topo_attn.selection", ("--key-set", "nosuchset"))].stderr
    assert samples.key_set_names() and all(name in err for name in samples.key_set_names())


@pytest.mark.parametrize("module, args", DEBUG_CASES, ids=[f"{m} {' '.join(a)}" for m, a in DEBUG_CASES])
def test_debug_shows_the_traceback(module, args, subprocess_results):
    shown = subprocess_results[(module, (*args, "--debug"))]
    assert shown.returncode == 2
    assert "Traceback (most recent call last)" in shown.stderr and "UsageError" in shown.stderr
    without = subprocess_results.get((module, tuple(args)))
    if without is not None:
        assert "Traceback" not in without.stderr


@pytest.mark.parametrize("module, args, prog", HELP_CASES, ids=[f"{m} {' '.join(a)}" for m, a, _ in HELP_CASES])
def test_help_names_the_program_as_typed(module, args, prog, subprocess_results, capsys):
    if module == HELP_SUBPROCESS:
        result = subprocess_results[(module, ("--help",))]
    else:
        result = run_in_process(module, [*args, "--help"], capsys)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {prog} ") and "__main__" not in result.stdout
    assert "--debug" in result.stdout


# ------------------------------------------------------------------------------------------------ build_parser
def test_build_parser_gives_the_whole_command_line_without_triton_or_transformers():
    """Each entry point's build_parser(): prog as typed, --debug, --progress where it draws a bar, the lm
    subcommands with their real arguments; importing and parsing loads neither triton nor transformers."""
    code = textwrap.dedent(f"""
        import importlib, sys
        entry_points = {ENTRY_POINTS!r}
        for name, (module, prog) in entry_points.items():
            parser = importlib.import_module(module).build_parser()
            assert parser.prog == prog, (parser.prog, prog)
            parser.parse_args(["--debug"] if name != "topo_attn.lm" else ["evaluate", "--debug"])
        from topo_attn.lm.__main__ import build_parser
        args = build_parser().parse_args(["evaluate", "--granularity", "token", "--selectors", "quest",
                                          "--no-progress"])
        assert args.command == "evaluate" and args.granularity == "token" and args.progress is False
        assert build_parser().parse_args(["research", "--tune-budget", "2", "--progress"]).progress is True
        assert build_parser().parse_args(["passkey", "--probes", "8"]).probes == 8
        assert build_parser().parse_args(["train", "--out", "x", "--steps", "3"]).steps == 3
        loaded = [m for m in ("triton", "transformers") if m in sys.modules]
        assert not loaded, loaded
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                            env=dict(os.environ, TRITON_INTERPRET="1"))
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


@pytest.mark.parametrize("module", [m for m, _ in ENTRY_POINTS.values()])
def test_build_parser_rejects_what_main_rejects_as_a_flag(module, capsys):
    parser = importlib.import_module(module).build_parser()
    with pytest.raises(SystemExit) as done:
        parser.parse_args(["--no-such-option"])
    assert done.value.code == 2


@pytest.mark.parametrize("module, argv", [
    ("topo_attn.lm.__main__", ["evaluate", "--granularity", "bogus"]),
    ("topo_attn.lm.__main__", ["research", "--budgets", "x"]),
    ("topo_attn.lm.__main__", ["passkey", "--selectors", "oracle"]),
    ("topo_attn.lm.__main__", ["train", "--out", "x", "--steps", "1.5"]),
    ("topo_attn.selection.__main__", ["--budgets"]),
    ("topo_attn.bench.__main__", ["--timer", "slow"]),
])
def test_build_parser_checks_the_flags_of_each_command(module, argv, capsys):
    with pytest.raises(SystemExit) as done:
        importlib.import_module(module).build_parser().parse_args(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 2 and ": error: " in err  # cli.ArgumentParser: no wrapped usage block


@pytest.mark.parametrize("module", [m for m, _ in ENTRY_POINTS.values()])
def test_progress_options_where_a_bar_is_drawn(module):
    parser = importlib.import_module(module).build_parser()
    has_bar = module in ("topo_attn.notebooks", "topo_attn.selection.__main__", "topo_attn.bench.__main__")
    if module == "topo_attn.lm.__main__":
        for command in ("train", "evaluate", "research", "passkey"):
            base = [command, "--out", "x"]
            assert parser.parse_args(base).progress is None
            assert parser.parse_args(base + ["--no-progress"]).progress is False
            assert parser.parse_args(base + ["--progress"]).progress is True
    elif has_bar:
        assert parser.parse_args([]).progress is None
        assert parser.parse_args(["--no-progress"]).progress is False
        assert parser.parse_args(["--progress"]).progress is True


# ------------------------------------------------------------------------------------------------ cli itself
class Terminal(io.StringIO):
    def isatty(self) -> bool:
        super().isatty()  # (a closed stream raises ValueError, as a closed file does)
        return True


def test_progress_enabled():
    assert cli.progress_enabled(None, io.StringIO()) is False
    assert cli.progress_enabled(None, Terminal()) is True
    assert cli.progress_enabled(True, io.StringIO()) is True
    assert cli.progress_enabled(False, Terminal()) is False
    closed = Terminal()
    closed.close()
    assert cli.progress_enabled(None, closed) is False
    assert cli.progress_enabled(None, object()) is False  # a stream without isatty


def test_run_turns_errors_into_messages_and_exit_codes(capsys):
    def failing(error):
        def main(argv):
            raise error
        return main

    assert cli.run(lambda argv: 0, [], prog="prog") == 0
    assert cli.run(lambda argv: None, [], prog="prog") == 0
    seen = []
    assert cli.run(lambda argv: seen.append(argv) or 3, ["a", "--debug", "b"], prog="prog") == 3
    assert seen == [["a", "b"]]  # --debug removed wherever it is
    capsys.readouterr()
    assert cli.run(failing(cli.UsageError("argument --x: bad")), [], prog="prog") == 2
    assert capsys.readouterr().err == "prog: error: argument --x: bad\n"
    assert cli.run(failing(FileNotFoundError(2, "No such file or directory", "/nope")), [], prog="prog") == 2
    assert capsys.readouterr().err == "prog: error: No such file or directory: /nope\n"
    assert cli.run(failing(RuntimeError("boom")), [], prog="prog") == 1
    err = capsys.readouterr().err
    assert err.splitlines() == ["prog: error: RuntimeError: boom", "prog: (run again with --debug for the traceback)"]
    assert cli.run(failing(cli.UsageError("bad")), ["--debug"], prog="prog") == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "UsageError: bad" in err
    assert cli.run(failing(KeyboardInterrupt()), [], prog="prog") == 130


def test_check_option_and_check_at_least():
    from topo_attn._checks import check_kernel_block_size

    cli.check_option("--block-size", lambda: check_kernel_block_size(64))
    with pytest.raises(cli.UsageError, match="^argument --block-size: block_size must be a power of two >= 16, "
                                             "got 30$"):
        cli.check_option("--block-size", lambda: check_kernel_block_size(30))
    cli.check_at_least("--budgets", [0, 3], 0)
    cli.check_at_least("--length", None, 1)
    with pytest.raises(cli.UsageError, match="^argument --budgets: budget must be >= 0, got -1$"):
        cli.check_at_least("--budgets", [2, -1], 0, "budget")
    with pytest.raises(cli.UsageError, match="^argument --seq-len: seq_len must be >= 1, got 0$"):
        cli.check_at_least("--seq-len", 0, 1)


def test_argument_parser_errors_are_two_lines(capsys):
    parser = cli.ArgumentParser(prog="python -m tool")
    for i in range(30):
        parser.add_argument(f"--option-number-{i}", type=int)
    with pytest.raises(SystemExit) as done:
        parser.parse_args(["--option-number-3", "x"])
    assert done.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "python -m tool: error: argument --option-number-3: invalid int value: 'x'",
        "python -m tool: see python -m tool --help"]


# ------------------------------------------------------------------------------------------------ progress bars
def test_no_carriage_return_frames_without_a_terminal():
    """The package's bars (here the benchmark runner's and compare_selectors') write nothing to a stderr that is
    not a terminal unless forced; forced, the frames appear."""
    code = textwrap.dedent("""
        import sys, torch
        from topo_attn.bench.cases import Case
        from topo_attn.bench.runner import run_cases
        from topo_attn.selection import compare_selectors
        forced = sys.argv[1] == "forced"
        cases = [Case(f"c{i}", 1, 1, 1, 64, 16, 16, "float16") for i in range(3)]
        run_cases(cases, lambda c: {"case": c.name}, progress=True if forced else None, description="cases")
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(64, 16, generator=gen) for _ in range(3))
        compare_selectors(q, k, v, 16, [1], selectors=["window"], progress=True if forced else None)
        print("done")
    """)
    for mode in ("auto", "forced"):
        result = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, timeout=120, cwd=ROOT,
                                env=dict(os.environ, TRITON_INTERPRET="1"))  # bytes: "\r" kept as written
        out, err = result.stdout.decode(), result.stderr.decode()
        assert result.returncode == 0 and out == "done\n", err
        if mode == "auto":
            assert err == ""
        else:
            assert "\r" in err and "cases" in err and "compare_selectors" in err


def test_the_notebooks_job_draws_no_bar_without_a_terminal(monkeypatch, capsys, tmp_path):
    import nbformat

    import topo_attn.notebooks as main_job

    nbformat.write(nbformat.v4.new_notebook(), tmp_path / "first.ipynb")
    monkeypatch.setattr(main_job, "run_notebook", lambda path, out_dir, *a, **k: [Path(out_dir) / path.name])
    monkeypatch.setattr(main_job, "kernel_name", lambda: "python3")
    assert main_job.main(["--notebooks", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().err == ""
    assert main_job.main(["--notebooks", str(tmp_path), "--out", str(tmp_path / "out"), "--progress"]) == 0
    assert "first.ipynb" in capsys.readouterr().err


def test_library_progress_takes_a_bool_or_none(monkeypatch):
    """Library functions keep ``progress: bool`` (True draws a bar wherever stderr goes) and take None for
    'only on a terminal'."""
    from topo_attn.bench.runner import run_cases

    monkeypatch.setattr(sys, "stderr", Terminal())
    run_cases([], lambda c: {}, progress=None, description="auto on a terminal")
    assert "auto on a terminal" in sys.stderr.getvalue()


def test_every_tqdm_goes_through_progress_enabled():
    """No bar in the package decides by itself whether to draw: each tqdm's ``disable=`` asks
    :func:`topo_attn.cli.progress_enabled`."""
    found = []
    for path in sorted((ROOT / "topo_attn").rglob("*.py")):
        text = path.read_text()
        start = text.find("tqdm(")
        while start >= 0:
            depth, end = 0, start + len("tqdm")
            for end in range(start + len("tqdm"), len(text)):  # the call's balanced parentheses
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                if depth == 0:
                    break
            call = text[start:end + 1]
            found.append(path.name)
            assert "progress_enabled(" in call, f"{path}: {call}"
            start = text.find("tqdm(", end)
    assert len(found) >= 8, found


def test_parser_class_is_argparse():
    for module, _ in ENTRY_POINTS.values():
        assert isinstance(importlib.import_module(module).build_parser(), argparse.ArgumentParser)
