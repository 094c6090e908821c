"""Every notebook under notebooks/ runs headless with papermill (Triton interpreter without a GPU); committed
notebooks carry no outputs; the main job, ``python -m topo_attn.notebooks``, writes executed notebooks and
HTML copies and runs them in this interpreter's kernel."""

from __future__ import annotations

import ast
import html
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from topo_attn.notebooks import NOTEBOOK_DIR, notebook_parameters, notebook_paths, run_notebook
from topo_attn.viz.explorer import LIVE_KERNEL_NOTE

NOTEBOOKS = notebook_paths(NOTEBOOK_DIR)
# small settings, passed to each notebook that has the parameter; no GPU benchmark runs in the tests
SMALL = {"block_size": 64, "topk": 2, "run_benchmark": False}
# text that a notebook's outputs must contain (notebooks not listed are only required to run)
EXPECTED = {
    "02_persistence_barcodes": ["gudhi agrees"],
    "03_schedule_explorer": ["causal blocks scheduled", "max |kernel - reference|"],
    # with the committed results: the decode suite's table, timed both ways
    "04_benchmark": ["showing the committed results", "| B8 H32 kv8 q1 S128k D128 b64 | ours 1/8 |",
                     "| Llama-1B-shape B1 S128k b64 | topo_attn centroid | 32 |",
                     "timer: cuda graph replay", "timer: eager"],
    # with the committed results: the summary, the pooled-strict comparison and the research table
    "06_language_model": ["bits/byte", "max |logit(dense) - logit(sdpa)|", "passkey @8064",
                          "bits per byte at positions 4k-8k", "topology_causal", "| quest | 30 | 25.8% |",
                          "per key/value head  per query head", "| tokens/s after step 1 | / sdpa |"],
}
MIN_FIGURES = {"01_key_block_centroids": 2, "02_persistence_barcodes": 2, "03_schedule_explorer": 1,
               "06_language_model": 9}
# text that the HTML copy must show as text (outside scripts and styles), for the notebooks listed: the explorer's
# sliders need the widget JavaScript from a CDN, so the page says in words what they need
EXPECTED_HTML = {"03_schedule_explorer": [LIVE_KERNEL_NOTE]}


def ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


def outputs_text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            parts.extend(str(v) for k, v in out.get("data", {}).items() if k.startswith("text/"))
    return "\n".join(parts)


def figures(nb) -> int:
    return sum("image/png" in out.get("data", {}) for cell in nb.cells for out in cell.get("outputs", []))


def visible_text(page: str) -> str:
    """The text of an HTML page as a browser shows it without running its scripts: scripts and styles dropped,
    tags dropped, entities decoded, white space collapsed."""
    page = re.sub(r"<(script|style)\b.*?</\1\s*>", " ", page, flags=re.S | re.I)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def test_the_four_notebooks_are_found():
    assert {"01_key_block_centroids", "02_persistence_barcodes", "03_schedule_explorer",
            "04_benchmark"} <= set(ids(NOTEBOOKS))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_committed_notebook_is_clean(path):
    """No outputs or execution counts; a tagged parameters cell; no functions or classes of its own."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    dirty = [i for i, c in enumerate(code) if c.outputs or c.execution_count is not None]
    assert not dirty, (f"{path.name}: code cells {dirty} have outputs; clear them with "
                       f"`jupyter nbconvert --clear-output --inplace {path.relative_to(NOTEBOOK_DIR.parent)}`")
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: expected one code cell tagged 'parameters'"
    assert notebook_parameters(path), f"{path.name}: the parameters cell defines nothing"
    for cell in code:
        defined = [n for n in ast.walk(ast.parse(cell.source)) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        assert not defined, f"{path.name}: defines {[d.name for d in defined]}; put helpers in topo_attn"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_notebook_runs_headless(path, tmp_path):
    """papermill runs every cell (any cell error raises) with small parameters; the HTML copies of the
    notebooks in EXPECTED_HTML show their text."""
    out, *page = run_notebook(path, tmp_path, SMALL, html=path.stem in EXPECTED_HTML)
    nb = nbformat.read(out, as_version=4)
    assert nb.metadata.papermill.exception is None
    text = outputs_text(nb)
    for expected in EXPECTED.get(path.stem, []):
        assert expected in text, f"{path.name}: no output contains {expected!r}"
    assert figures(nb) >= MIN_FIGURES.get(path.stem, 0)
    shown = visible_text(page[0].read_text(encoding="utf-8")) if page else ""
    for expected in EXPECTED_HTML.get(path.stem, []):
        assert " ".join(expected.split()) in shown, f"{page[0].name} does not show {expected!r}"
    if path.stem == "03_schedule_explorer":  # the note is the output right after the explorer's widgets
        cell, = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("ScheduleExplorer(")]
        kinds = [next(iter(o.get("data", {})), o.output_type) for o in cell.outputs]
        assert kinds == ["application/vnd.jupyter.widget-view+json", "text/html"], kinds
        assert LIVE_KERNEL_NOTE in cell.outputs[1].data["text/html"]


def kernel_results(tmp_path: Path) -> Path:
    tmp_path.mkdir()
    rows = [dict(case=f"S{s}", seq_len=s, ours_ms=s / 1e5, sdpa_ms=s / 6e4, flex_ms=s / 8e4, limit_ms=s / 3e5,
                 ours_tflops=5.0, sdpa_tflops=8.0, flex_tflops=3.0) for s in (1024, 2048, 4096)]
    (tmp_path / "kernel.json").write_text(json.dumps(dict(
        suite="pr", gpu="NVIDIA Test GPU", torch="9.9.9", triton="8.8.8", command="python -m topo_attn.bench",
        commit="abc1234", dirty=False, commit_source="test", rows=rows)))
    build_columns = ("num_blocks", "sdpa_ms", "shared_build_ms", "shared_attn_ms", "shared_build_over_attn",
                     "lane_build_ms", "lane_attn_ms", "lane_build_over_attn", "shared_total_over_sdpa",
                     "lane_total_over_sdpa")
    (tmp_path / "build.json").write_text(json.dumps(dict(
        suite="build", gpu="NVIDIA Test GPU", torch="9.9.9", triton="8.8.8",
        command="python -m topo_attn.bench --suite build", commit="def5678", dirty=True, commit_source="test",
        rows=[{"case": "B1 S2k", **{c: 1.0 for c in build_columns}}])))
    (tmp_path / "salience_cpu.json").write_text(json.dumps({"command": "python tests/bench_salience.py",
                                                            "speedup": 18.5}))
    header = dict(gpu="NVIDIA Test GPU", torch="9.9.9", triton="8.8.8", commit="abc1234", dirty=False,
                  commit_source="test")
    (tmp_path / "generate.json").write_text(json.dumps(dict(
        suite="generate", command="python -m topo_attn.bench --suite generate", **header,
        rows=[dict(case="B3 S7k", attention="kit quest", budget_tokens=2048, ms_per_token=2.5, attention_ms=0.7,
                   vs_recipe=0.123, new_tokens=32)])))  # a row with its time only, as read from a log
    (tmp_path / "step.json").write_text(json.dumps(dict(
        suite="step", command="python -m topo_attn.bench --suite step", **header,
        rows=[dict(case="B5 S9k", selector="quest", budget_tokens=2048, update_table_us=21.5, completing_us=30.0,
                   decode_us=13.5, dense_decode_us=39.4, selection_share=0.61)])))
    return tmp_path


def test_benchmark_notebook_renders_results(tmp_path):
    results = kernel_results(tmp_path / "results")
    out, = run_notebook(NOTEBOOK_DIR / "04_benchmark.ipynb", tmp_path / "out",
                        {"results_dir": str(results), "run_benchmark": False}, html=False)
    nb = nbformat.read(out, as_version=4)
    text = outputs_text(nb)
    assert "NVIDIA Test GPU" in text and "9.9.9" in text and "8.8.8" in text  # the GPU and the versions
    assert "S4096" in text and "salience_cpu.json" in text  # the table, and the CPU benchmark apart
    assert "commit abc1234" in text  # the commit of the code, with each table
    assert "commit def5678 with uncommitted changes under topo_attn/" in text and "B1 S2k" in text
    assert "| B3 S7k | kit quest | 2048 | 2.50 | 0.70 | 0.12x |" in text  # decoding inside generate()
    assert "| B5 S9k | quest | 2048 | 21.5 | 30.0 |  |  | 13.5 | 39.4 | 0.61 |" in text  # one layer's step
    assert figures(nb) == 1


def test_benchmark_notebook_says_when_there_are_no_results(tmp_path):
    (tmp_path / "empty").mkdir()
    out, = run_notebook(NOTEBOOK_DIR / "04_benchmark.ipynb", tmp_path / "out",
                        {"results_dir": str(tmp_path / "empty"), "run_benchmark": False}, html=False)
    nb = nbformat.read(out, as_version=4)
    assert "No kernel benchmark results yet" in outputs_text(nb) and figures(nb) == 0


def test_language_model_notebook_renders_results(tmp_path):
    """Notebook 06 on a stand-in of the study's results (tests/lm_standin.py): the header, the summary
    table and a figure per section, at the budget asked for."""
    from lm_standin import eviction_result, lm_result, retrieval_suite_result  # in tests/

    results = tmp_path / "lm_quality.json"
    results.write_text(json.dumps(lm_result()))
    (tmp_path / "lm_retrieval.json").write_text(json.dumps(retrieval_suite_result()))
    (tmp_path / "lm_eviction.json").write_text(json.dumps(eviction_result()))
    out, = run_notebook(NOTEBOOK_DIR / "06_language_model.ipynb", tmp_path / "out",
                        {**SMALL, "results": str(results), "strict_results": str(results), "budget": 2,
                         "per_query_head_results": str(tmp_path / "missing_per_head.json"),
                         "research": str(tmp_path / "missing.json"),
                         "token_results": [str(tmp_path / "missing_token.json")],
                         "retrieval_results": str(tmp_path / "lm_retrieval.json"),
                         "eviction_results": str(tmp_path / "lm_eviction.json"),
                         "native_results": str(tmp_path / "missing_native.json")}, html=False)
    nb = nbformat.read(out, as_version=4)
    text = outputs_text(nb)
    assert "NVIDIA Test GPU" in text and "commit abc1234" in text  # the header
    assert "passkey @8064" in text and "| topology_causal | 6 |" in text  # the summary table, an unknown selector
    assert "at budget 2" in text and "bits/byte" in text
    assert "No research results to show" in text and "bits per byte at positions 4k-8k" in text
    assert "No per-query-head results to show" in text and "No native-training results to show yet" in text
    assert "Not shown: no language-model results at" in text and "missing_token.json" in text
    # the retrieval suite and KV-cache eviction: each runner's table, with the command and the commit
    assert "python -m topo_attn.lm retrieval`" in text and "| single_needle | quest | 6 | 25% [0%, 75%] |" in text
    assert "dense reaches 90% on every task and distance: yes" in text
    assert "python -m topo_attn.lm eviction`" in text
    assert "| salience | 0.25 | 32 | 25.8% | 1.550 | +0.050 | 75% [25%, 100%] |" in text
    # training, Pareto front (pooled, strict), positions, retrieval, recall, speed; the retrieval suite at each of
    # its budgets (6, 30); eviction
    assert figures(nb) == 10


def test_a_failing_cell_fails_the_run(tmp_path):
    import papermill

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]}),
                                         nbformat.v4.new_code_cell("raise RuntimeError('boom')")])
    nbformat.write(nb, tmp_path / "bad.ipynb")
    with pytest.raises(papermill.PapermillExecutionError, match="boom"):
        run_notebook(tmp_path / "bad.ipynb", tmp_path / "out", html=False)


def test_main_job_writes_notebooks_and_html_in_this_interpreter(tmp_path):
    """``python -m topo_attn.notebooks`` on a folder: executed copies and HTML, paths printed, and the kernel is
    this interpreter's environment (sys.prefix), with TRITON_INTERPRET set when there is no GPU."""
    src = tmp_path / "src"
    src.mkdir()
    cells = [nbformat.v4.new_code_cell("label = 'default'", metadata={"tags": ["parameters"]}),
             nbformat.v4.new_code_cell("import os, sys\nprint('prefix', sys.prefix)\n"
                                       "print('interpret', os.environ.get('TRITON_INTERPRET'))\nprint('label', label)")]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), src / "probe.ipynb")
    result = subprocess.run([sys.executable, "-m", "topo_attn.notebooks", "--notebooks", str(src), "--out",
                             str(tmp_path / "out"), "-p", "label", "small", "--progress"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    executed, html = tmp_path / "out" / "probe.ipynb", tmp_path / "out" / "probe.html"
    assert str(executed.resolve()) in result.stdout and str(html.resolve()) in result.stdout
    assert "probe.ipynb" in result.stderr  # the progress bar names the notebook that runs
    text = outputs_text(nbformat.read(executed, as_version=4))
    assert f"prefix {sys.prefix}" in text
    assert "label small" in text
    import torch

    if not torch.cuda.is_available():
        assert "interpret 1" in text
    assert "label small" in html.read_text()


def test_main_job_progress_leaves_stdout_alone(monkeypatch, capsys, tmp_path):
    """The main job's bar (stderr) names each notebook; stdout is byte-identical with and without it (notebook
    runs and their timings stubbed, so that the two runs print the same)."""
    import types

    import topo_attn.notebooks as main_job

    src = tmp_path / "src"
    src.mkdir()
    for name in ("first", "second"):
        nbformat.write(nbformat.v4.new_notebook(), src / f"{name}.ipynb")
    ran = []

    def run(path, out_dir, parameters=None, html=True, timeout=600):
        ran.append(path.name)
        return [Path(out_dir) / path.name]

    monkeypatch.setattr(main_job, "run_notebook", run)
    monkeypatch.setattr(main_job, "kernel_name", lambda: "python3")
    monkeypatch.setattr(main_job, "time", types.SimpleNamespace(perf_counter=lambda: 0.0))
    args = ["--notebooks", str(src), "--out", str(tmp_path / "out")]
    assert main_job.main(args + ["--no-progress"]) == 0
    quiet = capsys.readouterr()
    assert main_job.main(args + ["--progress"]) == 0  # (no terminal: a bar only when asked for)
    shown = capsys.readouterr()
    assert ran == ["first.ipynb", "second.ipynb"] * 2
    assert shown.out == quiet.out and quiet.err == "" and "\r" not in shown.out
    assert "  first.ipynb: 0.0 s\n  second.ipynb: 0.0 s\n" in shown.out
    assert "notebooks" in shown.err and "first.ipynb" in shown.err and "second.ipynb" in shown.err


def test_html_copies_show_progress_bars_as_a_terminal_does(tmp_path):
    """render_html: a bar cleared when done leaves nothing, a kept bar its last state; other text stays, and
    the executed notebook is not changed."""
    from topo_attn.notebooks import render_html

    def stream(name, text):
        return nbformat.v4.new_output("stream", name=name, text=text)

    cleared = nbformat.v4.new_code_cell("run()")
    cleared.outputs = [stream("stderr", "\rcleared 0/2"), stream("stderr", "\rcleared 1/2, step b"),
                       stream("stderr", "\rcleared 2/2"), stream("stderr", "\r" + " " * 12 + "\r"),
                       stream("stdout", "result 42\n")]
    kept = nbformat.v4.new_code_cell("run()")
    kept.outputs = [stream("stderr", "\rkept 1/2"), stream("stderr", "\rkept 2/2\n"), stream("stderr", "a warning\n")]
    path = tmp_path / "bars.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[cleared, kept]), path)
    before = path.read_text()
    page = render_html(path).read_text(encoding="utf-8")
    shown = visible_text(page)
    assert "result 42" in shown and "kept 2/2" in shown and "a warning" in shown
    assert "cleared" not in shown and "kept 1/2" not in shown
    assert page.count('data-mime-type="application/vnd.jupyter.stderr"') == 1  # the kept bar and the warning
    assert path.read_text() == before


def test_readme_main_job_runs_the_notebooks():
    """The README keeps two copy-paste commands; the first one's last step is this main job."""
    import re

    readme = (NOTEBOOK_DIR.parent / "README.md").read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S)
    assert len(commands) == 2
    assert commands[0].split(" && ")[-1] == ".venv/bin/python -m topo_attn.notebooks"
    assert commands[1] == ".venv/bin/python -m pytest"


def test_kernel_check_recognises_this_interpreter():
    from topo_attn.notebooks import runs_this_python, kernel_name

    assert runs_this_python("python") and runs_this_python(sys.executable)
    assert not runs_this_python("/nonexistent/bin/python3")
    assert kernel_name() in ("python3", "topo_attn")
