"""Reading the kernel benchmark results in ``data/benchmarks/`` (pandas is imported here, on use).

A kernel result is a JSON file whose top level has ``suite``, ``gpu``, ``torch``, ``triton``, ``command`` and
``rows``: a list of dicts with at least ``case``, ``seq_len``, ``{ours,sdpa,flex}_ms``, ``limit_ms`` and
``{ours,sdpa,flex}_tflops``. They are written by the benchmark runner, ``python -m topo_attn.bench``, on a
GPU. JSON files without ``rows`` (such as the CPU salience benchmark, ``salience_cpu.json``) are other
results, read separately (:func:`other_results_table`). Files written by another command of the package
(``python -m topo_attn.<module>`` other than the runner, such as the language-model study's) are read by that
command's own loaders (:mod:`topo_attn.lm.results`), not here.

A row may carry ``invalid``: a dict naming the columns found wrong after the measurement and why (for
example ``{"flex": "dynamo fell back to eager"}``). The loaders refuse such a file (``ValueError`` naming the
file, the case and the reason): an invalid figure is re-measured, never shown.

Every result file also says which code produced it (:data:`~topo_attn.provenance.COMMIT_KEYS`, written by the
runner and the language-model commands by :func:`~topo_attn.provenance.run_record`);
:func:`~topo_attn.provenance.commit_text` says them in words.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..provenance import COMMIT_KEYS, ROOT, check_commit, commit_text

RESULTS_DIR = ROOT / "data" / "benchmarks"
"""The committed results (in a checkout of the repository only; an installed package has none)."""
MEASURED_DIR = ROOT / "build" / "benchmarks"
"""Where a notebook run writes what it measured (not committed)."""
RUNNER = "topo_attn.bench"
HEADER_KEYS = ("suite", "gpu", "torch", "triton", "command", "rows")
ROW_KEYS = ("case", "seq_len", "ours_ms", "sdpa_ms", "flex_ms", "limit_ms", "ours_tflops", "sdpa_tflops",
            "flex_tflops")
TABLE_EXTRAS = ("scheduled_blocks", "causal_blocks", "visited_fraction", "build_ms", "max_abs_error")
KERNEL_SUITES = ("pr", "llm")  # suites whose rows time one attention kernel against SDPA and FlexAttention
INVALID_KEY = "invalid"
"""A row's field naming the columns found wrong after the measurement, and why (see the module docstring)."""


@dataclass(frozen=True)
class KernelBenchmark:
    """One results file: where it is, what ran it, and its rows."""

    path: Path
    suite: str
    gpu: str
    torch: str
    triton: str
    command: str
    rows: list[dict]
    commit: str | None = None
    dirty: bool | None = None
    commit_source: str | None = None

    def code(self) -> str:
        """The code the results came from, in words: :func:`~topo_attn.provenance.commit_text` of the file's
        :data:`~topo_attn.provenance.COMMIT_KEYS` (``"commit not recorded"`` when it had none)."""
        info = {k: getattr(self, k) for k in COMMIT_KEYS if getattr(self, k) is not None}
        if self.commit_source is not None:
            info.setdefault("commit", None)
        return commit_text(info)

    def describe(self) -> str:
        """One Markdown line naming the suite, the GPU, the versions, the command and the commit."""
        path = self.path.resolve()
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        return (f"suite **{self.suite}** on **{self.gpu}**, torch {self.torch}, triton {self.triton}: "
                f"`{self.command}` ({len(self.rows)} rows, `{shown}`); {self.code()}")

    def table(self, all_columns: bool = False):
        """The rows as a pandas DataFrame: the required columns, then those of ``scheduled_blocks``,
        ``causal_blocks``, ``visited_fraction``, ``build_ms`` and ``max_abs_error`` that are present (every
        column with ``all_columns``), indexed by case."""
        import pandas as pd

        frame = pd.DataFrame(self.rows)
        rest = [c for c in frame.columns if c not in ROW_KEYS and (all_columns or c in TABLE_EXTRAS)]
        return frame[list(ROW_KEYS) + rest].set_index("case")


def _json_files(results_dir: str | Path | None) -> list[tuple[Path, object]]:
    """Every ``*.json`` in ``results_dir`` (default :data:`RESULTS_DIR`), parsed, sorted by name; a missing
    folder raises ``FileNotFoundError`` naming it."""
    folder = Path(results_dir or RESULTS_DIR)
    if not folder.is_dir():
        raise FileNotFoundError(f"benchmark results folder {folder} does not exist (the committed results are in "
                                f"data/benchmarks/ of a repository checkout, not in an installed package; "
                                f"pass results_dir)")
    return [(p, json.loads(p.read_text())) for p in sorted(folder.glob("*.json"))]


def _kernel_benchmark(path: Path, data: object) -> KernelBenchmark | None:
    """``data`` (the parsed JSON of ``path``) as a :class:`KernelBenchmark`; ``None`` without ``rows`` or for
    another suite than ``pr`` and ``llm`` (read those with :func:`load_suite`)."""
    if not isinstance(data, dict) or "rows" not in data:
        return None
    if data.get("suite") not in KERNEL_SUITES and "suite" in data:
        return None
    missing = [k for k in HEADER_KEYS if k not in data]
    if missing:
        raise ValueError(f"{path}: has 'rows' but lacks {missing}; expected top-level keys {list(HEADER_KEYS)}")
    if not isinstance(data["rows"], list):
        raise ValueError(f"{path}: 'rows' must be a list of dicts, got {type(data['rows']).__name__}")
    for i, row in enumerate(data["rows"]):
        lacking = [k for k in ROW_KEYS if not isinstance(row, dict) or k not in row]
        if lacking:
            raise ValueError(f"{path}: row {i} lacks {lacking}; every row needs {list(ROW_KEYS)}")
    check_commit(path, data)
    refuse_invalid_rows(path, data["rows"])
    return KernelBenchmark(Path(path), *(str(data[k]) for k in HEADER_KEYS[:-1]), list(data["rows"]),
                           *(data.get(k) for k in COMMIT_KEYS))


def refuse_invalid_rows(path: str | Path, rows: Sequence) -> None:
    """Raise ``ValueError`` naming ``path``, the case and the reason when a row of ``rows`` carries
    :data:`INVALID_KEY` (a figure found wrong after it was measured is re-measured, not shown)."""
    for i, row in enumerate(rows):
        if isinstance(row, dict) and row.get(INVALID_KEY):
            raise ValueError(f"{path}: row {i} ({row.get('case', '?')}) is marked invalid: {row[INVALID_KEY]}; "
                             f"re-measure it with python -m {RUNNER} instead of showing it")


def load_kernel_benchmarks(results_dir: str | Path | None = None) -> list[KernelBenchmark]:
    """Every kernel result in ``results_dir`` (default ``data/benchmarks``), sorted by file name. Files
    without a ``rows`` key are skipped; a file with ``rows`` but without the other header keys, with rows
    that lack a required column, or with a row marked :data:`INVALID_KEY`, raises ``ValueError`` naming the
    file and what is wrong; a missing ``results_dir`` raises ``FileNotFoundError`` naming it."""
    found = (_kernel_benchmark(path, data) for path, data in _json_files(results_dir))
    return [b for b in found if b is not None]


def load_suite(suite: str, results_dir: str | Path | None = None) -> list[tuple[dict, object]]:
    """Results of the runner's suite ``suite`` (e.g. ``build``, ``train``, ``select``) in ``results_dir``
    (default ``data/benchmarks``): per file, its header (GPU, versions, command, date, the file's note or None,
    the :data:`~topo_attn.provenance.COMMIT_KEYS` present in the file, path) and its rows as a pandas DataFrame
    (:func:`~topo_attn.provenance.commit_text` of the header says the commit in words). Empty when none has been
    committed; a missing ``results_dir`` raises ``FileNotFoundError`` naming it; commit keys of the wrong type
    and rows marked :data:`INVALID_KEY` raise ``ValueError``."""
    import pandas as pd

    found = []
    for path, data in _json_files(results_dir):
        if isinstance(data, dict) and data.get("suite") == suite and isinstance(data.get("rows"), list):
            check_commit(path, data)
            refuse_invalid_rows(path, data["rows"])
            header = ({k: data.get(k) for k in ("gpu", "torch", "triton", "command", "date", "note")}
                      | {k: data[k] for k in COMMIT_KEYS if k in data} | {"path": path.name})
            found.append((header, pd.DataFrame(data["rows"])))
    return found


def summary(benchmarks: Sequence[KernelBenchmark], results_dir: str | Path | None = None) -> str:
    """A plain Markdown statement of what results there are (or that there are none yet)."""
    where = Path(results_dir or RESULTS_DIR)
    if not benchmarks:
        return (f"**No kernel benchmark results yet.** `{where}` holds no JSON file with `rows`. They are "
                f"measured on a GPU by `python -m {RUNNER}` and committed there; until then this notebook has "
                f"no kernel timings to show.")
    lines = [f"Kernel benchmark results: {len(benchmarks)} file(s)."]
    return "\n".join(lines + [f"- {b.describe()}" for b in benchmarks])


def other_results_table(results_dir: str | Path | None = None):
    """The JSON files in ``results_dir`` without ``rows`` (such as the CPU salience benchmark), as a pandas
    DataFrame with one column per file and one row per scalar field (lists are left out); empty if none. Files
    written by another command of the package (:func:`written_by_another_command`) are left out: their own
    loaders read them. A missing ``results_dir`` raises ``FileNotFoundError`` naming it."""
    import pandas as pd

    columns = {p.name: {k: v for k, v in data.items() if not isinstance(v, (list, dict))}
               for p, data in _json_files(results_dir)
               if isinstance(data, dict) and "rows" not in data and not written_by_another_command(data)}
    return pd.DataFrame(columns)


def written_by_another_command(data: object) -> bool:
    """Whether ``data`` (a result file's parsed top level) was written by a command of the package other than
    the runner: its ``command`` starts ``python -m topo_attn.<module>`` with another module than
    :data:`RUNNER` (the language-model study's ``python -m topo_attn.lm evaluate``, for example). Such a file
    is that command's own, read by its loaders; measurement scripts (``python tests/bench_salience.py``) and
    shell loops are not commands of the package."""
    command = data.get("command") if isinstance(data, dict) else None
    words = command.split() if isinstance(command, str) else []
    package = RUNNER.partition(".")[0]
    return (len(words) > 2 and words[:2] == ["python", "-m"] and words[2].startswith(f"{package}.")
            and words[2] != RUNNER)


def run_small_benchmark(args: Sequence[str], run: bool = True,
                        out_dir: str | Path = MEASURED_DIR) -> tuple[str, list[KernelBenchmark]]:
    """With a CUDA GPU, ``run`` set and the runner present, run ``python -m topo_attn.bench *args --out
    out_dir/measured_here.json`` (``args`` keep it small, e.g. ``--suite pr``; committed results are left
    alone). Returns a sentence saying what ran, or why nothing ran, and the measured results (none when
    nothing ran). A failing runner raises ``subprocess.CalledProcessError``."""
    import torch

    if not run:
        return "Not measuring (run_benchmark is False): showing the committed results.", []
    if not torch.cuda.is_available():
        return "No CUDA GPU here: showing the committed results instead of measuring.", []
    if importlib.util.find_spec(RUNNER) is None:
        return f"The benchmark runner ({RUNNER}) is not in this checkout: showing the committed results.", []
    out = Path(out_dir) / "measured_here.json"
    command = [sys.executable, "-m", RUNNER, *map(str, args), "--out", str(out)]
    subprocess.run(command, check=True, cwd=ROOT)
    measured = _kernel_benchmark(out, json.loads(out.read_text()))
    return (f"Ran `python {' '.join(command[1:])}` on {torch.cuda.get_device_name()}.",
            [] if measured is None else [measured])
