"""The language-model study's result files and their loaders (pandas is imported here, on use).

The commands of :mod:`topo_attn.lm` write JSON results (to ``--out``; the committed ones are in
``data/benchmarks/``), each with its suite, the GPU, the versions, the command and the commit of the code
(:data:`~topo_attn.provenance.COMMIT_KEYS`):

- ``python -m topo_attn.lm evaluate``: suite :data:`LM_SUITE`, no ``rows`` but the sections of
  :data:`LM_SECTIONS` (:func:`load_lm_quality`, :func:`lm_quality_tables`, :func:`describe_lm_quality`, and
  :func:`combine_lm_quality` for a study run in parts);
- ``python -m topo_attn.lm research``: suite :data:`LM_RESEARCH_SUITE`, ``rows`` of recall per selector and
  budget (:func:`load_lm_research`, :func:`lm_research_table`);
- ``python -m topo_attn.lm passkey``: suite :data:`LM_PASSKEY_SUITE`, ``rows`` of the passkey probe answered
  by generation (:func:`load_lm_passkey`; :func:`topo_attn.lm.generation.markdown` renders it);
- ``python -m topo_attn.lm native``: suite :data:`LM_NATIVE_SUITE`, ``rows`` of one model trained per attention
  and ``after_training`` rows of the SDPA-trained model under the same attentions (:func:`load_lm_native`;
  :func:`topo_attn.lm.native.markdown` renders it);
- ``python -m topo_attn.lm retrieval``: suite :data:`LM_RETRIEVAL_SUITE`, ``rows`` of the retrieval suite per
  task, distance, attention and budget with intervals (:func:`load_lm_retrieval`;
  :func:`topo_attn.lm.retrieval_runner.markdown` renders it);
- ``python -m topo_attn.lm greedy``: suite :data:`LM_GREEDY_SUITE`, ``rows`` of where the kit's dense decode's
  greedy tokens first differ from SDPA's recipe (:func:`topo_attn.lm.greedy.markdown` renders it);
- ``python -m topo_attn.lm eviction``: suite :data:`LM_EVICTION_SUITE`, ``rows`` of KV-cache eviction per policy
  and cache fraction, with retrieval per task (:func:`load_lm_eviction`;
  :func:`topo_attn.lm.eviction_runner.markdown` renders it).

A relative path is taken from the repository's root, so ``"data/benchmarks/lm_quality_h200.json"`` works from
any folder. Importing this module imports neither transformers nor pandas (pandas is imported on use).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..provenance import ROOT, check_commit, commit_text

LM_SUITE = "lm"
"""The language-model study's suite (``python -m topo_attn.lm evaluate``): no ``rows``, sections of its own."""
LM_RESEARCH_SUITE = "lm_research"
"""The research step's suite (``python -m topo_attn.lm research``): ``rows`` of recall per selector and budget."""
LM_PASSKEY_SUITE = "lm_passkey_generate"
"""The suite of the passkey probe answered by generation (``python -m topo_attn.lm passkey``)."""
LM_GREEDY_SUITE = "lm_greedy"
"""The suite of greedy-token agreement of the kit's dense decode with SDPA's (``python -m topo_attn.lm greedy``)."""
LM_NATIVE_SUITE = "lm_native"
"""The suite of native sparse training (``python -m topo_attn.lm native``): ``rows`` per trained model and
``after_training`` rows."""
LM_RETRIEVAL_SUITE = "lm_retrieval"
"""The suite of the RULER-style retrieval suite (``python -m topo_attn.lm retrieval``): ``rows`` per task,
distance, attention and budget."""
LM_RETRIEVAL_ROW_KEYS = ("task", "distance", "attention", "selector", "budget", "accuracy", "n", "ci_low", "ci_high")
"""The keys every row of an :data:`LM_RETRIEVAL_SUITE` file has."""
LM_EVICTION_SUITE = "lm_eviction"
"""The suite of KV-cache eviction (``python -m topo_attn.lm eviction``): ``rows`` per policy and cache fraction."""
LM_EVICTION_ROW_KEYS = ("policy", "cache_fraction", "keep_blocks", "bits_per_byte", "n_bytes", "memory_fraction",
                        "retrieval")
"""The keys every row of an :data:`LM_EVICTION_SUITE` file has (``retrieval``: per task a dict of
:data:`LM_EVICTION_CELL_KEYS`)."""
LM_EVICTION_CELL_KEYS = ("accuracy", "n", "ci_low", "ci_high")
"""The keys of every task's retrieval cell of an :data:`LM_EVICTION_SUITE` row."""
LM_KEYS = ("suite", "model", "gpu", "torch", "triton", "command", "perplexity", "retrieval")
"""The top-level keys every :data:`LM_SUITE` file has."""
LM_SECTIONS = ("perplexity", "retrieval", "recall", "speed")
"""The sections of an :data:`LM_SUITE` file, each a list of rows (``recall`` and ``speed`` may be absent)."""


def _read_results(path: str | Path, what: str, written: str) -> tuple[Path, object]:
    """``(path, parsed JSON)`` of a results file, a relative ``path`` taken from the repository's root
    (:data:`~topo_attn.provenance.ROOT`); a missing file raises ``FileNotFoundError`` naming it, ``what`` it
    should hold and how it is ``written``."""
    path = Path(path)
    path = path if path.is_absolute() else ROOT / path
    if not path.is_file():
        raise FileNotFoundError(f"no {what} at {path} (written {written} --out {path.name}`)")
    return path, json.loads(path.read_text())


def load_lm_quality(path: str | Path) -> dict:
    """The language-model study's results (``python -m topo_attn.lm evaluate --out path``) as the parsed JSON;
    a relative ``path`` is taken from the repository's root (:data:`~topo_attn.provenance.ROOT`), so
    ``"data/benchmarks/lm_quality_h200.json"`` works from any folder.

    Raises:
        FileNotFoundError: there is no such file (the message names it).
        ValueError: the file is not of suite ``lm``, lacks one of :data:`LM_KEYS`, has a section that is not a
            list, or has :data:`~topo_attn.provenance.COMMIT_KEYS` of the wrong type.
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
    check_commit(path, data)
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
    - ``speed``: as written (:func:`topo_attn.prefill_speed.prefill_speed_rows`' rows).
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


def _load_rows(path: str | Path, suite: str, what: str, command: str, row_keys: tuple[str, ...] = ()) -> dict:
    """The parsed JSON of a result file of ``suite`` with a list of ``rows`` (``what`` and ``command`` name it in
    the messages), its commit checked, each row a dict holding ``row_keys``."""
    path, data = _read_results(path, f"{what} results", f"by `{command}")
    if not isinstance(data, dict) or data.get("suite") != suite or not isinstance(data.get("rows"), list):
        raise ValueError(f"{path}: expected the {what} results (suite {suite!r} with rows)")
    check_commit(path, data)
    for i, row in enumerate(data["rows"]):
        missing = [k for k in row_keys if not isinstance(row, dict) or k not in row]
        if missing:
            raise ValueError(f"{path}: row {i} lacks {missing}; expected keys {list(row_keys)}")
    return data


def load_lm_research(path: str | Path) -> dict:
    """The research step's results (``python -m topo_attn.lm research --out path``) as the parsed JSON; a
    relative ``path`` is taken from the repository's root.

    Raises:
        FileNotFoundError: there is no such file (the message names it).
        ValueError: the file is not of suite ``lm_research`` or has no list of ``rows``.
    """
    return _load_rows(path, LM_RESEARCH_SUITE, "research step's", "python -m topo_attn.lm research")


def load_lm_passkey(path: str | Path) -> dict:
    """The passkey probe answered by generation (``python -m topo_attn.lm passkey --out path``) as the parsed
    JSON; a relative ``path`` is taken from the repository's root (``topo_attn.lm.generation.markdown`` renders
    it).

    Raises:
        FileNotFoundError: there is no such file (the message names it).
        ValueError: the file is not of suite ``lm_passkey_generate`` or has no list of ``rows``.
    """
    return _load_rows(path, LM_PASSKEY_SUITE, "passkey-by-generation", "python -m topo_attn.lm passkey")


def load_lm_native(path: str | Path) -> dict:
    """Native sparse training's results (``python -m topo_attn.lm native --out path``) as the parsed JSON; a
    relative ``path`` is taken from the repository's root.

    Raises:
        FileNotFoundError: there is no such file (the message names it).
        ValueError: the file is not of suite ``lm_native``, has no list of ``rows`` or of ``after_training``
            rows, or has :data:`~topo_attn.provenance.COMMIT_KEYS` of the wrong type.
    """
    data = _load_rows(path, LM_NATIVE_SUITE, "native sparse training", "python -m topo_attn.lm native")
    if not isinstance(data.get("after_training"), list):
        raise ValueError(f"{path}: expected the native sparse training results with a list of after_training rows")
    return data


def load_lm_retrieval(path: str | Path) -> dict:
    """The retrieval suite's results (``python -m topo_attn.lm retrieval --out path``) as the parsed JSON; a
    relative ``path`` is taken from the repository's root.

    Raises:
        FileNotFoundError: there is no such file (the message names it).
        ValueError: the file is not of suite ``lm_retrieval``, has no list of ``rows``, a row lacks one of
            :data:`LM_RETRIEVAL_ROW_KEYS`, or :data:`~topo_attn.provenance.COMMIT_KEYS` have the wrong type.
    """
    return _load_rows(path, LM_RETRIEVAL_SUITE, "retrieval suite", "python -m topo_attn.lm retrieval",
                      LM_RETRIEVAL_ROW_KEYS)


def load_lm_eviction(path: str | Path) -> dict:
    """KV-cache eviction's results (``python -m topo_attn.lm eviction --out path``) as the parsed JSON; a relative
    ``path`` is taken from the repository's root.

    Raises:
        FileNotFoundError: there is no such file (the message names it).
        ValueError: the file is not of suite ``lm_eviction``, has no list of ``rows``, a row lacks one of
            :data:`LM_EVICTION_ROW_KEYS`, a row's ``retrieval`` is not a dict of tasks whose cells have
            :data:`LM_EVICTION_CELL_KEYS`, or :data:`~topo_attn.provenance.COMMIT_KEYS` have the wrong type.
    """
    data = _load_rows(path, LM_EVICTION_SUITE, "KV-cache eviction", "python -m topo_attn.lm eviction",
                      LM_EVICTION_ROW_KEYS)
    for i, row in enumerate(data["rows"]):
        cells = row["retrieval"]
        if not isinstance(cells, dict):
            raise ValueError(f"{path}: row {i}: retrieval must be a dict of tasks, got {type(cells).__name__}")
        bad = [task for task, cell in cells.items()
               if not isinstance(cell, dict) or any(k not in cell for k in LM_EVICTION_CELL_KEYS)]
        if bad:
            raise ValueError(f"{path}: row {i}: the retrieval cells of {bad} lack one of "
                             f"{list(LM_EVICTION_CELL_KEYS)}")
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
