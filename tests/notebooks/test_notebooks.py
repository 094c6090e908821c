"""Every notebook under notebooks/ runs headless with papermill (Triton interpreter without a GPU); committed
notebooks carry no outputs; the main job, ``python -m topo_attn.notebooks``, writes executed notebooks and
HTML copies and runs them in this interpreter's kernel."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from topo_attn.notebooks import NOTEBOOK_DIR, notebook_parameters, notebook_paths, run_notebook

NOTEBOOKS = notebook_paths(NOTEBOOK_DIR)
# small settings, passed to each notebook that has the parameter; no GPU benchmark runs in the tests
SMALL = {"block_size": 64, "topk": 2, "run_benchmark": False}
# text that a notebook's outputs must contain (notebooks not listed are only required to run)
EXPECTED = {
    "02_persistence_barcodes": ["gudhi agrees"],
    "03_schedule_explorer": ["causal blocks scheduled", "max |kernel - reference|"],
    "04_benchmark": ["showing the committed results"],
}
MIN_FIGURES = {"01_key_block_centroids": 2, "02_persistence_barcodes": 2, "03_schedule_explorer": 1}


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
    """papermill runs every cell (any cell error raises) with small parameters."""
    out, = run_notebook(path, tmp_path, SMALL, html=False)
    nb = nbformat.read(out, as_version=4)
    assert nb.metadata.papermill.exception is None
    text = outputs_text(nb)
    for expected in EXPECTED.get(path.stem, []):
        assert expected in text, f"{path.name}: no output contains {expected!r}"
    assert figures(nb) >= MIN_FIGURES.get(path.stem, 0)


def kernel_results(tmp_path: Path) -> Path:
    tmp_path.mkdir()
    rows = [dict(case=f"S{s}", seq_len=s, ours_ms=s / 1e5, sdpa_ms=s / 6e4, flex_ms=s / 8e4, limit_ms=s / 3e5,
                 ours_tflops=5.0, sdpa_tflops=8.0, flex_tflops=3.0) for s in (1024, 2048, 4096)]
    (tmp_path / "kernel.json").write_text(json.dumps(dict(
        suite="pr", gpu="NVIDIA Test GPU", torch="9.9.9", triton="8.8.8", command="python -m topo_attn.bench",
        rows=rows)))
    (tmp_path / "salience_cpu.json").write_text(json.dumps({"command": "python tests/bench_salience.py",
                                                            "speedup": 18.5}))
    return tmp_path


def test_benchmark_notebook_renders_results(tmp_path):
    results = kernel_results(tmp_path / "results")
    out, = run_notebook(NOTEBOOK_DIR / "04_benchmark.ipynb", tmp_path / "out",
                        {"results_dir": str(results), "run_benchmark": False}, html=False)
    nb = nbformat.read(out, as_version=4)
    text = outputs_text(nb)
    assert "NVIDIA Test GPU" in text and "9.9.9" in text and "8.8.8" in text  # the GPU and the versions
    assert "S4096" in text and "salience_cpu.json" in text  # the table, and the CPU benchmark apart
    assert figures(nb) == 1


def test_benchmark_notebook_says_when_there_are_no_results(tmp_path):
    (tmp_path / "empty").mkdir()
    out, = run_notebook(NOTEBOOK_DIR / "04_benchmark.ipynb", tmp_path / "out",
                        {"results_dir": str(tmp_path / "empty"), "run_benchmark": False}, html=False)
    nb = nbformat.read(out, as_version=4)
    assert "No kernel benchmark results yet" in outputs_text(nb) and figures(nb) == 0


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
                             str(tmp_path / "out"), "-p", "label", "small"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    executed, html = tmp_path / "out" / "probe.ipynb", tmp_path / "out" / "probe.html"
    assert str(executed.resolve()) in result.stdout and str(html.resolve()) in result.stdout
    text = outputs_text(nbformat.read(executed, as_version=4))
    assert f"prefix {sys.prefix}" in text
    assert "label small" in text
    import torch

    if not torch.cuda.is_available():
        assert "interpret 1" in text
    assert "label small" in html.read_text()


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
