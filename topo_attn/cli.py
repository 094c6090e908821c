"""What every ``python -m topo_attn...`` entry point shares: a user's mistake ends in a line on stderr and a
non-zero exit instead of a traceback, ``--debug`` shows the traceback, and progress bars appear only when stderr
is a terminal unless ``--progress`` / ``--no-progress`` says otherwise.

An entry point module has ``build_parser()`` (its whole command line as an :class:`ArgumentParser`, ``prog`` set to
how a user types it, with :func:`add_debug_argument` and, where a bar is drawn, :func:`add_progress_argument`) and
``main(argv) -> int``, which checks the values up front (:func:`check_option` around the kit's own validation,
:func:`check_at_least`, or a :class:`UsageError`), and ends with ``raise SystemExit(run(main, prog=...))``. Exit
codes: 0 done, 2 a usage error (argparse's own, :class:`UsageError`, or a ``ValueError`` / ``TypeError`` /
``FileNotFoundError`` / ``NotADirectoryError`` from the kit's validation, whose messages name the argument), 1 any
other failure, 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import NoReturn, TextIO, TypeVar

T = TypeVar("T")

DEBUG_FLAG = "--debug"


class UsageError(Exception):
    """A user's mistake on a command line (a bad value, a missing file, an unknown name); its message is the
    line the user sees, so it says what was given and what is expected."""


USAGE_ERRORS: tuple[type[Exception], ...] = (UsageError, ValueError, TypeError, FileNotFoundError, NotADirectoryError)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose errors are two short lines, ``{prog}: error: <message>`` and where to find the
    usage, instead of a usage block that wraps over many lines (subcommand parsers made by
    ``add_subparsers`` are of this class too). Exit code 2, as argparse's."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n{self.prog}: see {self.prog} --help\n")


def check_option(option: str, check: Callable[[], T]) -> T:
    """``check()``, a call of the kit's own validation; its ``ValueError`` / ``TypeError`` becomes a
    :class:`UsageError` ``argument {option}: <its message>`` (the option, what was given, what is expected)."""
    try:
        return check()
    except (ValueError, TypeError) as error:
        raise UsageError(f"argument {option}: {error}") from error


def check_at_least(option: str, values: int | Iterable[int] | None, minimum: int, name: str | None = None) -> None:
    """Each of ``values`` (an int, several, or None for an option left at a None default) is an int
    ``>= minimum`` (:func:`topo_attn._checks.check_int`), else a :class:`UsageError` naming ``option``."""
    from ._checks import check_int

    if values is None:
        return
    name = name or option.lstrip("-").replace("-", "_")
    for value in [values] if isinstance(values, int) else values:
        check_option(option, lambda: check_int(name, value, minimum))


def add_debug_argument(parser: argparse.ArgumentParser) -> None:
    """``--debug``: on an error, show the full traceback (:func:`run` reads the flag from anywhere in argv)."""
    parser.add_argument(DEBUG_FLAG, action="store_true", help="on an error, show the full traceback")


def command_parser(prog: str, description: str | None, add_arguments: Callable[[argparse.ArgumentParser], None],
                   add_help: bool = True) -> ArgumentParser:
    """A command's parser: ``prog`` as typed, ``description`` kept as written, the arguments ``add_arguments``
    adds, and ``--debug`` (``add_help=False``: to serve as a parent of a subcommand's parser)."""
    parser = ArgumentParser(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
                            add_help=add_help)
    add_arguments(parser)
    add_debug_argument(parser)
    return parser


def add_progress_argument(parser: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--no-progress`` into ``args.progress``: ``None`` (neither given) means a bar only when
    stderr is a terminal (:func:`progress_enabled`)."""
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bar on stderr (default: only when stderr is a terminal)")


def progress_enabled(progress: bool | None, stream: TextIO | None = None) -> bool:
    """Whether to draw a progress bar: ``progress`` when it is a bool, else whether ``stream`` (stderr) is a
    terminal, so that logs and CI output get no carriage-return frames."""
    if progress is not None:
        return bool(progress)
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (ValueError, OSError):  # a closed or odd stream
        return False


def error_message(error: BaseException) -> str:
    """The one line a user sees for ``error``: its message, with the file for an OS error."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{error.strerror}: {error.filename}"
    text = str(error).strip() or type(error).__name__
    if isinstance(error, KeyError) and len(error.args) == 1:
        text = str(error.args[0])
    if not isinstance(error, USAGE_ERRORS):
        text = f"{type(error).__name__}: {text}"
    return text


def run(main: Callable[[list[str]], int | None], argv: Sequence[str] | None = None, *, prog: str) -> int:
    """Call ``main(argv)`` (``sys.argv[1:]`` when None, ``--debug`` removed) and turn an exception into
    ``{prog}: error: <message>`` on stderr with an exit code (module docstring); with ``--debug`` its traceback
    is printed instead, with the same exit code. argparse's own errors exit 2 as usual."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in argv
    argv = [a for a in argv if a != DEBUG_FLAG]
    try:
        return int(main(argv) or 0)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - the one place that turns any failure into a message
        if debug:
            traceback.print_exc()
            return 2 if isinstance(error, USAGE_ERRORS) else 1
        print(f"{prog}: error: {error_message(error)}", file=sys.stderr)
        if not isinstance(error, USAGE_ERRORS):
            print(f"{prog}: (run again with {DEBUG_FLAG} for the traceback)", file=sys.stderr)
            return 1
        return 2
