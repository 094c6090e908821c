"""Run every notebook headless and render HTML copies: ``python -m topo_attn.notebooks``.

Each notebook in ``notebooks/`` is executed with papermill (its ``parameters`` cell keeps its defaults unless
``-p NAME VALUE`` overrides one) into ``build/notebooks/``, then rendered to HTML with nbconvert; the paths
are printed. While they run, a progress bar on stderr names the notebook that runs when stderr is a terminal
(``--progress`` / ``--no-progress`` force it on or off; stdout is the same either way). Without a CUDA GPU,
``TRITON_INTERPRET=1`` is set first, so the Triton
kernel runs in Triton's interpreter inside the notebooks' kernels. The tests run the notebooks through
:func:`run_notebook` too.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from . import cli

PROG = "python -m topo_attn.notebooks"
ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
BUILD_DIR = ROOT / "build" / "notebooks"
KERNEL_NAME = "python3"


def triton_mode() -> str:
    """Without a CUDA GPU, set ``TRITON_INTERPRET=1`` (unless already set) so that the Triton kernel runs in
    Triton's interpreter; call before triton is first imported (the first ``scheduled_attention`` call).
    Returns how the kernel will run."""
    import torch

    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    return "Triton interpreter on the CPU" if os.environ.get("TRITON_INTERPRET") == "1" else "compiled on the GPU"


def notebook_paths(directory: str | Path = NOTEBOOK_DIR) -> list[Path]:
    """Every ``*.ipynb`` under ``directory`` (checkpoints excluded), sorted."""
    return sorted(p for p in Path(directory).rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def runs_this_python(command: str) -> bool:
    """Whether a kernelspec's ``argv[0]`` starts this interpreter (jupyter_client replaces a bare ``python``,
    ``python3`` or ``python3.X`` with ``sys.executable``)."""
    bare = ("python", f"python{sys.version_info[0]}", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    return command in bare or Path(command).absolute() == Path(sys.executable).absolute()


def kernel_name() -> str:
    """A Jupyter kernel that runs this interpreter: ``python3`` (ipykernel installs it into the virtual
    environment) when it does, else a ``topo_attn`` kernelspec for this interpreter, installed into
    ``sys.prefix`` when missing or pointing elsewhere."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    manager = KernelSpecManager()
    for name in (KERNEL_NAME, "topo_attn"):
        try:
            if runs_this_python(manager.get_kernel_spec(name).argv[0]):
                return name
        except NoSuchKernel:
            pass
    subprocess.run([sys.executable, "-m", "ipykernel", "install", "--sys-prefix", "--name", "topo_attn",
                    "--display-name", "Python (topo_attn)"], check=True, capture_output=True)
    return "topo_attn"


def _client_config():
    """nbclient configuration: where jupyter_client and zmq support it, the kernel manager provisions
    CurveZMQ keys, so the local kernel's sockets are encrypted (and ipykernel does not warn that they are not)."""
    import zmq
    from traitlets.config import Config

    return Config({"KernelManager": {"transport_encryption": "auto"}} if zmq.has("curve") else {})


@contextlib.contextmanager
def kernel_environment() -> Iterator[None]:
    """The notebooks' kernels inherit this process's environment: set the Triton mode, and drop an
    ``MPLBACKEND`` (such as ``Agg``) that would keep figures out of the outputs."""
    triton_mode()
    backend = os.environ.pop("MPLBACKEND", None)
    try:
        yield
    finally:
        if backend is not None:
            os.environ["MPLBACKEND"] = backend


def notebook_parameters(path: str | Path) -> dict[str, object]:
    """The names and default values assigned in a notebook's ``parameters``-tagged cell (``name = literal``
    lines; other values, such as expressions, map to their source text)."""
    import nbformat

    params: dict[str, object] = {}
    for cell in nbformat.read(Path(path), as_version=4).cells:
        if cell.cell_type == "code" and "parameters" in cell.metadata.get("tags", []):
            for node in ast.parse(cell.source).body:
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    try:
                        value = ast.literal_eval(node.value)
                    except ValueError:
                        value = ast.get_source_segment(cell.source, node.value)
                    params.update({t.id: value for t in targets if isinstance(t, ast.Name)})
    return params


def run_notebook(path: str | Path, out_dir: str | Path, parameters: Mapping[str, object] | None = None,
                 html: bool = True, timeout: float = 600) -> list[Path]:
    """Execute notebook ``path`` with papermill into ``out_dir`` (same file name; working directory the
    notebook's folder), passing those of ``parameters`` that its ``parameters`` cell defines. Any cell
    error raises ``papermill.PapermillExecutionError``. With ``html``, also render ``<name>.html`` with
    nbconvert. Returns the files written."""
    import papermill

    path, out_dir = Path(path), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    known = notebook_parameters(path)
    chosen = {k: v for k, v in (parameters or {}).items() if k in known}
    out = out_dir / path.name
    with kernel_environment():
        papermill.execute_notebook(str(path), str(out), parameters=chosen, kernel_name=kernel_name(),
                                   language="python", cwd=str(path.parent), progress_bar=False,
                                   execution_timeout=timeout, config=_client_config())
    written = [out]
    if html:
        written.append(render_html(out))
    return written


def render_html(notebook: str | Path) -> Path:
    """Render an executed notebook to ``<name>.html`` beside it (nbconvert, figures embedded). Text outputs
    read as a terminal shows them: consecutive stream outputs are merged and a carriage return overwrites its
    line, so a progress bar (such as ``compare_selectors``') leaves its last state, and a bar cleared when done
    leaves nothing; streams left blank are dropped. The executed notebook itself is not changed."""
    import nbformat
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import CoalesceStreamsPreprocessor

    notebook = Path(notebook)
    nb, _ = CoalesceStreamsPreprocessor().preprocess(nbformat.read(notebook, as_version=4), {})
    for cell in nb.cells:
        if "outputs" in cell:
            cell.outputs = [o for o in cell.outputs if o.output_type != "stream" or o.text.replace("\r", "").strip()]
    body, _ = HTMLExporter().from_notebook_node(nb)
    target = notebook.with_suffix(".html")
    target.write_text(body, encoding="utf-8")
    return target


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is inside it."""
    path = path.absolute()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def _value(text: str) -> object:
    """A ``-p`` value: a Python literal when it parses as one, else the string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def build_parser() -> argparse.ArgumentParser:
    """The main job's command line."""
    parser = cli.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--notebooks", type=Path, default=NOTEBOOK_DIR, help="folder of notebooks to run")
    parser.add_argument("--out", type=Path, default=BUILD_DIR, help="folder for executed notebooks and HTML")
    parser.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="override a parameter in every notebook that defines it")
    parser.add_argument("--no-html", action="store_true", help="skip the HTML copies")
    cli.add_progress_argument(parser)
    cli.add_debug_argument(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the notebooks and print what was written. Returns the
    exit status: 0, or 1 when the folder holds no notebook. Raises :class:`~topo_attn.cli.UsageError` for a
    ``--notebooks`` that is not a folder or a ``-p`` name that no notebook's ``parameters`` cell defines."""
    from tqdm import tqdm

    args = build_parser().parse_args(argv)
    if not args.notebooks.is_dir():
        raise cli.UsageError(f"argument --notebooks: {args.notebooks} is not a folder; expected a folder of "
                             f"*.ipynb notebooks (default {_shown(NOTEBOOK_DIR)})")
    paths = notebook_paths(args.notebooks)
    if not paths:
        print(f"{PROG}: error: no notebooks under {args.notebooks}", file=sys.stderr)
        return 1
    known = {name for path in paths for name in notebook_parameters(path)}
    unknown = [name for name, _ in args.parameter if name not in known]
    if unknown:
        raise cli.UsageError(f"argument -p/--parameter: no notebook under {args.notebooks} has a parameter "
                             f"{', '.join(map(repr, unknown))}; their parameters are "
                             f"{', '.join(sorted(known)) or 'none'}")
    parameters = {name: _value(value) for name, value in args.parameter}
    print(f"running {len(paths)} notebooks with papermill ({triton_mode()}; kernel {kernel_name()!r})", flush=True)
    written = []
    # one bar over the notebooks (papermill's bar over cells stays off: one bar reads better in a log);
    # the per-notebook lines go to stdout through the bar, which clears itself around them
    with tqdm(paths, desc="notebooks", unit="notebook", file=sys.stderr, leave=False,
              disable=not cli.progress_enabled(args.progress)) as bar:
        for path in bar:
            bar.set_postfix_str(path.name)
            start = time.perf_counter()
            files = run_notebook(path, args.out, parameters, html=not args.no_html)
            bar.write(f"  {path.name}: {time.perf_counter() - start:.1f} s", file=sys.stdout)
            sys.stdout.flush()
            written += files
    print("\nwritten:")
    for f in written:
        print(f"  {f.resolve()}")
    print(f"\nopen the HTML files in a browser; to run the notebooks live: {_shown(Path(sys.executable))} -m "
          f"jupyterlab {_shown(args.notebooks)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main, prog=PROG))
