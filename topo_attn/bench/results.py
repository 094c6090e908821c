"""Reading the kernel benchmark results in ``data/benchmarks/`` (pandas is imported here, on use).

A kernel result is a JSON file whose top level has ``suite``, ``gpu``, ``torch``, ``triton``, ``command`` and
``rows``: a list of dicts with at least ``case``, ``seq_len``, ``{ours,sdpa,flex}_ms``, ``limit_ms`` and
``{ours,sdpa,flex}_tflops``. They are written by the benchmark runner, ``python -m topo_attn.bench``, on a
GPU. JSON files without ``rows`` (such as the CPU salience benchmark, ``salience_cpu.json``) are other
results, read separately; the language-model study's file (suite ``lm``, ``python -m topo_attn.lm evaluate``,
with sections ``perplexity``, ``retrieval``, ``recall`` and ``speed`` instead of ``rows``) is read by
:func:`load_lm_quality` and :func:`lm_quality_tables`.

A row may carry ``invalid``: a dict naming the columns found wrong after the measurement and why (for
example ``{"flex": "dynamo fell back to eager"}``). The loaders refuse such a file (``ValueError`` naming the
file, the case and the reason): an invalid figure is re-measured, never shown.

Every result file also says which code produced it (:data:`COMMIT_KEYS`): ``commit``, the short hash of the
repository's commit (``None`` when it is not known), ``dirty``, whether ``topo_attn/`` had uncommitted changes
(left out when not known), and ``commit_source``, how the commit was determined or why there is none. The
runner writes them from :func:`code_version`; :func:`commit_text` says them in words.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root (``topo_attn/bench/results.py`` is two folders below it)."""
RESULTS_DIR = ROOT / "data" / "benchmarks"
"""The committed results (in a checkout of the repository only; an installed package has none)."""
MEASURED_DIR = ROOT / "build" / "benchmarks"
"""Where a notebook run writes what it measured (not committed)."""
RUNNER = "topo_attn.bench"
PACKAGE_DIR = "topo_attn"
"""The package's folder in the repository: uncommitted changes under it make a result ``dirty``."""
COMMIT_KEYS = ("commit", "dirty", "commit_source")
"""The fields naming the code a result came from (see the module's docstring)."""
HEADER_KEYS = ("suite", "gpu", "torch", "triton", "command", "rows")
ROW_KEYS = ("case", "seq_len", "ours_ms", "sdpa_ms", "flex_ms", "limit_ms", "ours_tflops", "sdpa_tflops",
            "flex_tflops")
TABLE_EXTRAS = ("scheduled_blocks", "causal_blocks", "visited_fraction", "build_ms", "max_abs_error")
KERNEL_SUITES = ("pr", "llm")  # suites whose rows time one attention kernel against SDPA and FlexAttention
LM_SUITE = "lm"
"""The language-model study's suite (``python -m topo_attn.lm evaluate``): no ``rows``, sections of its own."""
LM_RESEARCH_SUITE = "lm_research"
"""The research step's suite (``python -m topo_attn.lm research``): ``rows`` of recall per selector and budget."""
LM_PASSKEY_SUITE = "lm_passkey_generate"
"""The suite of the passkey probe answered by generation (``python -m topo_attn.lm passkey``)."""
LM_KEYS = ("suite", "model", "gpu", "torch", "triton", "command", "perplexity", "retrieval")
LM_SECTIONS = ("perplexity", "retrieval", "recall", "speed")
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
        """The code the results came from, in words: :func:`commit_text` of the file's :data:`COMMIT_KEYS`
        (``"commit not recorded"`` when it had none)."""
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


def commit_text(info: Mapping) -> str:
    """The code a result came from, in words, from the :data:`COMMIT_KEYS` in ``info`` (a result file's top
    level, a run in it, or a :func:`load_suite` header): ``"commit abc1234"``, ``"commit abc1234 with
    uncommitted changes under topo_attn/"`` (``dirty``), ``"commit unknown (<commit_source>)"`` (``commit`` is
    None) or ``"commit not recorded"`` (no ``commit`` key)."""
    if "commit" not in info:
        return "commit not recorded"
    if info["commit"] is None:
        return f"commit unknown ({info.get('commit_source') or 'no reason given'})"
    changes = f" with uncommitted changes under {PACKAGE_DIR}/" if info.get("dirty") else ""
    return f"commit {info['commit']}{changes}"


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
    _check_commit(path, data)
    refuse_invalid_rows(path, data["rows"])
    return KernelBenchmark(Path(path), *(str(data[k]) for k in HEADER_KEYS[:-1]), list(data["rows"]),
                           *(data.get(k) for k in COMMIT_KEYS))


def _check_commit(path: Path, data: dict) -> None:
    """Raise ``ValueError`` naming ``path`` when its :data:`COMMIT_KEYS` have the wrong types (absent keys
    are fine: the file predates them or comes from elsewhere)."""
    expected = {"commit": (str, type(None)), "dirty": (bool,), "commit_source": (str,)}
    for key, types in expected.items():
        if key in data and not isinstance(data[key], types):
            raise ValueError(f"{path}: {key!r} must be {' or '.join(t.__name__ for t in types)}, "
                             f"got {data[key]!r}")


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
    the :data:`COMMIT_KEYS` present in the file, path) and its rows as a pandas DataFrame (:func:`commit_text`
    of the header says the commit in words). Empty when none has been committed; a missing ``results_dir``
    raises ``FileNotFoundError`` naming it; :data:`COMMIT_KEYS` of the wrong type and rows marked
    :data:`INVALID_KEY` raise ``ValueError``."""
    import pandas as pd

    found = []
    for path, data in _json_files(results_dir):
        if isinstance(data, dict) and data.get("suite") == suite and isinstance(data.get("rows"), list):
            _check_commit(path, data)
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
    DataFrame with one column per file and one row per scalar field (lists are left out); empty if none. A
    missing ``results_dir`` raises ``FileNotFoundError`` naming it."""
    import pandas as pd

    columns = {p.name: {k: v for k, v in data.items() if not isinstance(v, (list, dict))}
               for p, data in _json_files(results_dir)
               if isinstance(data, dict) and "rows" not in data and data.get("suite") not in (LM_SUITE,
                                                                                               LM_RESEARCH_SUITE)}
    return pd.DataFrame(columns)



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


# ------------------------------------------------------------------------------------ the language-model study
def _read_results(path: str | Path, what: str, written: str) -> tuple[Path, object]:
    """``(path, parsed JSON)`` of a results file, a relative ``path`` taken from :data:`ROOT`; a missing file
    raises ``FileNotFoundError`` naming it, ``what`` it should hold and how it is ``written``."""
    path = Path(path)
    path = path if path.is_absolute() else ROOT / path
    if not path.is_file():
        raise FileNotFoundError(f"no {what} at {path} (written {written} --out {path.name}`)")
    return path, json.loads(path.read_text())


def load_lm_quality(path: str | Path) -> dict:
    """The language-model study's results (``python -m topo_attn.lm evaluate --out path``) as the parsed JSON;
    a relative ``path`` is taken from the repository's root (:data:`ROOT`), so
    ``"data/benchmarks/lm_quality_h200.json"`` works from any folder.

    Raises:
        FileNotFoundError: there is no such file (the message names it).
        ValueError: the file is not of suite ``lm``, lacks one of :data:`LM_KEYS`, has a section that is not a
            list, or has :data:`COMMIT_KEYS` of the wrong type.
    """
    path, data = _read_results(path, "language-model results", "on a GPU by `python -m topo_attn.lm evaluate")
    if not isinstance(data, dict) or data.get("suite") != LM_SUITE:
        suite = data.get("suite") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{path}: expected the language-model study's results (suite {LM_SUITE!r}), got {suite!r}")
    missing = [k for k in LM_KEYS if k not in data]
    if missing:
        raise ValueError(f"{path}: lacks {missing}; expected top-level keys {list(LM_KEYS)}")
    wrong = [k for k in LM_SECTIONS if k in data and not isinstance(data[k], list)]
    if wrong:
        raise ValueError(f"{path}: {wrong} must be lists of rows")
    _check_commit(path, data)
    return data


def combine_lm_quality(results: Sequence[Mapping]) -> dict:
    """Several :func:`load_lm_quality` results of one study run in parts (e.g. one process per selector) as one:
    the first one's header, and the ``perplexity`` and ``retrieval`` rows of all of them, a configuration
    (``attention``, ``budget``) taken from the first result that has it (``sdpa`` and ``dense`` appear in
    every part). Other sections (``recall``, ``speed``) come from the first result only.

    Raises:
        ValueError: no results, or parts of different settings (``length``, ``block_size``, ``sinks``,
            ``window``, ``documents``, ``granularity``, ``strict``).
    """
    if not results:
        raise ValueError("results must hold at least one language-model result")
    keys = ("length", "block_size", "sinks", "window", "documents", "granularity", "strict")
    first = results[0]
    for other in results[1:]:
        differ = [k for k in keys if other.get(k) != first.get(k)]
        if differ:
            raise ValueError(f"results differ in {differ}: they are not parts of one study")
    combined = dict(first)
    seen = set()
    for section in ("perplexity", "retrieval"):
        combined[section] = []
    for result in results:
        configs = {(r["attention"], r["budget"]) for r in result["perplexity"]} - seen
        for section in ("perplexity", "retrieval"):
            combined[section] += [r for r in result[section] if (r["attention"], r["budget"]) in configs]
        seen |= configs
    return combined


def describe_lm_quality(result: Mapping) -> str:
    """One Markdown line: the model, the GPU, the versions, the settings, the command and the commit."""
    dense = result.get("dense_layers") or []
    settings = ", ".join(f"{k} {result[k]}" for k in ("documents", "length", "block_size", "sinks", "window",
                                                       "dtype") if k in result)
    return (f"model `{result['model']}` on **{result['gpu']}**, torch {result['torch']}, triton {result['triton']}"
            f"{', ' + result['date'] if result.get('date') else ''}: {settings}"
            f"{', dense layers ' + str(list(dense)) if dense else ''}; `{result['command']}`; {commit_text(result)}")


def lm_quality_tables(result: Mapping) -> dict:
    """The sections of a :func:`load_lm_quality` result as pandas DataFrames, keyed by section name (``speed``
    and ``recall`` only when present); budgets as nullable integers (``<NA>`` for ``sdpa`` and ``dense``).

    - ``perplexity``: ``attention``, ``budget``, ``visited_fraction``, one ``bpb_<bucket>`` column per entry of
      ``bits_per_byte`` (``bpb_all``, ``bpb_0-1k``, ...), ``documents``, ``seconds``;
    - ``retrieval``: as written (``distance``, ``exact``, ``probes``, ``loss``, ...);
    - ``recall``: ``attention``, ``budget``, ``layer``, ``visited_fraction``, ``recall_mean`` and ``recall_min``
      over the query heads, and ``recall`` (the list per head);
    - ``speed``: as written (:func:`topo_attn.bench.model.run_model_case`'s rows).
    """
    import pandas as pd

    def frame(rows: list[dict]):
        table = pd.DataFrame(rows)
        if "budget" in table:
            table["budget"] = table["budget"].astype("Int64")
        return table

    perplexity = [{k: v for k, v in r.items() if k != "bits_per_byte"}
                  | {f"bpb_{b}": v for b, v in r["bits_per_byte"].items()} for r in result["perplexity"]]
    first = ["attention", "budget", "visited_fraction"]
    tables = {"perplexity": frame(perplexity), "retrieval": frame(list(result["retrieval"]))}
    bits = [c for c in tables["perplexity"] if c.startswith("bpb_")]
    tables["perplexity"] = tables["perplexity"][first + bits + [c for c in tables["perplexity"]
                                                                if c not in first + bits]]
    if result.get("recall"):
        tables["recall"] = frame([{k: v for k, v in r.items() if k != "recall"}
                                  | {"recall_mean": sum(r["recall"]) / len(r["recall"]),
                                     "recall_min": min(r["recall"]), "recall": list(r["recall"])}
                                  for r in result["recall"]])
    if result.get("speed"):
        tables["speed"] = pd.DataFrame(result["speed"])
    return tables


def load_lm_research(path: str | Path) -> dict:
    """The research step's results (``python -m topo_attn.lm research --out path``) as the parsed JSON; a
    relative ``path`` is taken from the repository's root.

    Raises:
        FileNotFoundError: there is no such file (the message names it).
        ValueError: the file is not of suite ``lm_research`` or has no list of ``rows``.
    """
    path, data = _read_results(path, "research results", "by `python -m topo_attn.lm research")
    if not isinstance(data, dict) or data.get("suite") != LM_RESEARCH_SUITE or not isinstance(data.get("rows"), list):
        raise ValueError(f"{path}: expected the research step's results (suite {LM_RESEARCH_SUITE!r} with rows)")
    _check_commit(path, data)
    return data


def load_lm_passkey(path: str | Path) -> dict:
    """The passkey probe answered by generation (``python -m topo_attn.lm passkey --out path``) as the parsed
    JSON; a relative ``path`` is taken from the repository's root (``topo_attn.lm.generation.markdown`` renders
    it).

    Raises:
        FileNotFoundError: there is no such file (the message names it).
        ValueError: the file is not of suite ``lm_passkey_generate`` or has no list of ``rows``.
    """
    path, data = _read_results(path, "passkey-by-generation results", "by `python -m topo_attn.lm passkey")
    if not isinstance(data, dict) or data.get("suite") != LM_PASSKEY_SUITE or not isinstance(data.get("rows"), list):
        raise ValueError(f"{path}: expected the passkey-by-generation results (suite {LM_PASSKEY_SUITE!r} with rows)")
    _check_commit(path, data)
    return data


def lm_research_table(result: Mapping):
    """A :func:`load_lm_research` result as a pandas DataFrame: one row per selector (in the file's order), one
    column per budget, each cell ``"all / late"`` mean recall to three decimals."""
    import pandas as pd

    cells = {(r["selector"], r["budget"]): f"{r['recall']:.3f} / {r['late_recall']:.3f}" for r in result["rows"]}
    selectors = list(dict.fromkeys(r["selector"] for r in result["rows"]))
    budgets = sorted({r["budget"] for r in result["rows"]})
    return pd.DataFrame([[cells.get((s, b), "") for b in budgets] for s in selectors], index=selectors,
                        columns=[f"budget {b}" for b in budgets])
