"""The schedule explorer as a person sees it: JupyterLab in a real browser.

A JupyterLab server (127.0.0.1, a free port, a token, throwaway root, config, data, runtime, settings and
IPython directories) serves a copy of ``notebooks/03_schedule_explorer.ipynb``. Headless Chromium (Debian's
``chromium`` package at ``/usr/bin/chromium``, driven by Playwright; nothing downloads a browser) opens it,
runs all cells, checks that the widgets render, moves the top-k and window sliders and checks that the
statistics and the mask figure follow. The expected statistics come from :class:`ScheduleExplorer` itself, run
in this process with the notebook's parameters. Screenshots before and after, the page at the end and the
server log are written to ``build/test-artifacts/explorer/``.

When the browser cannot start, the test fails with a message saying how to install it; it never skips.
``TOPO_ATTN_CHROMIUM`` names another Chromium or Chrome binary.
"""

from __future__ import annotations

import base64
import contextlib
import html
import io
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import nbformat
import numpy as np
import pytest

from topo_attn.notebooks import NOTEBOOK_DIR, ROOT, kernel_environment, kernel_name, notebook_parameters

NOTEBOOK = NOTEBOOK_DIR / "03_schedule_explorer.ipynb"
ARTIFACTS = ROOT / "build" / "test-artifacts" / "explorer"
CHROMIUM = os.environ.get("TOPO_ATTN_CHROMIUM", "/usr/bin/chromium")
# headless, as root, on a machine without a GPU or outside network; the profile is a fresh temporary
# --user-data-dir that Playwright creates and removes
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# the same words as .ci/setup's when it cannot install the Debian packages (tests/test_setup.py checks the names)
INSTALL_HINT = ("`.ci/setup` installs Debian's `chromium` and `fonts-dejavu-core` packages when run as root or "
                "where sudo works without a password; otherwise install them as root (sudo apt-get install "
                "chromium fonts-dejavu-core), or point TOPO_ATTN_CHROMIUM at a Chromium or Chrome binary")
MOVES = (("top-k", 6), ("window", 3))  # slider description -> new value, moved in this order
SERVER_START_S = 90
CELLS_RUN_S = 120  # the last cell runs the Triton kernel, in its interpreter on a CPU
REDRAW_S = 30
KERNEL_START_S = 60
# the notebook's kernel is connected and idle (window.jupyterapp: LabApp.expose_app_in_browser)
KERNEL_IDLE = """() => {
    const kernel = window.jupyterapp?.shell.currentWidget?.sessionContext?.session?.kernel;
    return !!kernel && kernel.connectionStatus === 'connected' && kernel.status === 'idle';
}"""


# ------------------------------------------------------------------------------------------ the server
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


@pytest.fixture(scope="module")
def jupyter_lab(tmp_path_factory) -> Iterator[dict]:
    """A JupyterLab server with the explorer notebook in its root; yields its URL, token and notebook name.
    Everything it writes stays in a temporary directory; it is killed at the end."""
    home = tmp_path_factory.mktemp("jupyter")
    dirs = {name: home / name for name in ("root", "config", "data", "runtime", "ipython", "settings",
                                           "workspaces")}
    for d in dirs.values():
        d.mkdir()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log_path = ARTIFACTS / "jupyterlab.log"
    port, token = _free_port(), secrets.token_hex(16)
    jupyter_env = {"JUPYTER_CONFIG_DIR": dirs["config"], "JUPYTER_DATA_DIR": dirs["data"],
                   "JUPYTER_RUNTIME_DIR": dirs["runtime"], "IPYTHONDIR": dirs["ipython"],
                   "JUPYTERLAB_SETTINGS_DIR": dirs["settings"], "JUPYTERLAB_WORKSPACES_DIR": dirs["workspaces"],
                   "JUPYTER_NO_CONFIG": None, "JUPYTER_PLATFORM_DIRS": None}
    # the server's environment, and so its kernels': the Triton mode of topo_attn.notebooks (the interpreter
    # without a GPU) and no MPLBACKEND that would keep figures out of the outputs
    with kernel_environment():
        env = {k: v for k, v in os.environ.items() if k not in jupyter_env}
    env.update({k: str(v) for k, v in jupyter_env.items() if v is not None})

    # the notebook, with the kernel that runs this interpreter (found as the notebook runner finds it)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in jupyter_env.items():
            if v is None:
                mp.delenv(k, raising=False)
            else:
                mp.setenv(k, str(v))
        kernel = kernel_name()
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.metadata["kernelspec"] = {"name": kernel, "display_name": kernel, "language": "python"}
    nbformat.write(nb, dirs["root"] / NOTEBOOK.name)

    # settings: every cell in the DOM (no windowing), no news or update checks, nothing from the network
    _write_json(dirs["settings"] / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings",
                {"windowingMode": "none"})
    _write_json(dirs["settings"] / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings",
                {"fetchNews": "false", "checkForUpdates": False})
    _write_json(dirs["config"] / "jupyter_server_config.json", {
        "ServerApp": {"ip": "127.0.0.1", "port": port, "port_retries": 0, "open_browser": False,
                      "root_dir": str(dirs["root"]), "allow_root": True, "terminals_enabled": False},
        "IdentityProvider": {"token": token},
        "LabApp": {"news_url": None, "extension_manager": "readonly", "expose_app_in_browser": True,
                   "check_for_updates_class": "jupyterlab.handlers.announcements.NeverCheckForUpdate"},
    })
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:
        server = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser"], cwd=dirs["root"],
                                  env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited with code {server.returncode} before it served; its log "
                            f"({log_path}):\n{_tail(log_path)}")
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer on {url} within {SERVER_START_S} s; its log "
                            f"({log_path}):\n{_tail(log_path)}")
            time.sleep(0.2)
        yield {"url": url, "token": token, "notebook": NOTEBOOK.name, "log": log_path}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, 15)  # the server and the kernels it started
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, 9)
            server.wait(timeout=15)


# ----------------------------------------------------------------------------------------- the browser
@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Headless Chromium from the system (never a downloaded one); when it cannot start, the reason (a
    string), which the test turns into a failure, never a skip."""
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError as e:
        yield (f"the browser test needs Playwright for Python ({e}); install the test extra: "
               f".venv/bin/pip install -e '.[test]'")
        return
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        missing = ("Debian's `chromium` package is not installed" if "TOPO_ATTN_CHROMIUM" not in os.environ
                   else "TOPO_ATTN_CHROMIUM names no executable file")
        yield f"no Chromium at {CHROMIUM} ({missing}): {INSTALL_HINT}"
        return
    with sync_playwright() as p:
        try:
            chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
                                         timeout=60_000)
        except Error as e:
            chromium = f"Chromium at {CHROMIUM} did not start: {e}\n{INSTALL_HINT}"
        if isinstance(chromium, str):
            yield chromium
            return
        try:
            yield chromium
        finally:
            chromium.close()


# ---------------------------------------------------------------------------------------- expectations
def _text(stats_html: str) -> str:
    """The statistics as the browser shows them: tags dropped, entities decoded, white space collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", re.sub(r"<br\s*/?>", "\n", stats_html))).split())


def _expected_states() -> list[tuple[str, object]]:
    """Statistics text and block sources before and after each slider move, from the explorer itself (in
    this process, no browser) with the notebook's parameters."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from topo_attn import samples
    from topo_attn.viz import ScheduleExplorer

    p = notebook_parameters(NOTEBOOK)
    with contextlib.redirect_stdout(io.StringIO()):  # outside IPython, showing a figure prints its repr
        explorer = ScheduleExplorer(samples.load_key_sets(), key_set=p["key_set"], block_size=p["block_size"],
                                    sinks=p["sinks"], window=p["window"], topk=p["topk"])
        controls = {c.description: c for c in (explorer.sinks, explorer.window, explorer.topk)}
        states = [(_text(explorer.stats.value), explorer.sources.clone())]
        for name, value in MOVES:
            assert controls[name].value != value, f"moving {name} to {value} changes nothing"
            controls[name].value = value
            states.append((_text(explorer.stats.value), explorer.sources.clone()))
    plt.close("all")
    return states


def _colour_pixels(data_url: str) -> dict[int, int]:
    """Pixels of each block-source colour (sink, window, topology) in a PNG data URL."""
    from PIL import Image

    from topo_attn import viz
    from topo_attn.topology import SINK, TOPOLOGY, WINDOW

    png = base64.b64decode(data_url.split(",", 1)[1])
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(np.int16)
    counts = {}
    for label in (SINK, WINDOW, TOPOLOGY):
        colour = np.array([int(viz.SCHEDULE_COLORS[label][i:i + 2], 16) for i in (1, 3, 5)])
        counts[label] = int((np.abs(rgb - colour).max(axis=-1) <= 2).sum())
    return counts


# ---------------------------------------------------------------------------------------------- test
def test_explorer_sliders_redraw_in_jupyterlab(browser, request):
    """Run all cells; the explorer's widgets render; moving top-k, then window, redraws the statistics and
    the mask as the explorer computes them; screenshots before and after."""
    if isinstance(browser, str):  # the browser first: no server is started when it cannot run
        pytest.fail(browser, pytrace=False)
    jupyter_lab = request.getfixturevalue("jupyter_lab")
    states = _expected_states()
    for old in ARTIFACTS.glob("*.png"):
        old.unlink()
    _write_versions(browser)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.set_default_timeout(30_000)
    try:
        _drive(page, jupyter_lab, states)
    except BaseException:
        with contextlib.suppress(Exception):
            page.screenshot(path=ARTIFACTS / "failure-page.png", full_page=True)
        print("browser console:\n" + "\n".join(console[-40:]))
        print(f"JupyterLab log ({jupyter_lab['log']}):\n{_tail(jupyter_lab['log'])}")
        raise
    finally:
        page.close()


def _write_versions(browser) -> None:
    from importlib.metadata import PackageNotFoundError, version

    lines = [f"chromium {browser.version} ({CHROMIUM})"]
    for name in ("jupyterlab", "ipywidgets", "jupyterlab_widgets", "widgetsnbextension", "ipykernel",
                 "playwright"):
        try:
            lines.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            lines.append(f"{name} not installed")
    (ARTIFACTS / "versions.txt").write_text("\n".join(lines) + "\n")


def _drive(page, lab: dict, states: list[tuple[str, object]]) -> None:
    from playwright.sync_api import expect

    from topo_attn.topology import SINK, TOPOLOGY, WINDOW

    page.goto(f"{lab['url']}/lab/tree/{lab['notebook']}?token={lab['token']}", wait_until="domcontentloaded")
    notebook = page.locator(".jp-NotebookPanel").filter(has=page.locator(".jp-Cell")).first
    expect(notebook).to_be_visible(timeout=KERNEL_START_S * 1000)
    # once the kernel is up, run all cells (the Run menu's command); wait for the last cell's output, or a
    # traceback
    page.wait_for_function(KERNEL_IDLE, timeout=KERNEL_START_S * 1000)
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    done = notebook.locator(".jp-CodeCell").last.locator(".jp-OutputArea-output",
                                                         has_text="max |kernel - reference|")
    failed = notebook.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']",
                              has_text=re.compile("Traceback|Error"))
    expect(done.or_(failed).first).to_be_visible(timeout=CELLS_RUN_S * 1000)
    assert failed.count() == 0, "a cell failed:\n" + "\n".join(failed.all_inner_texts())
    prompts = notebook.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()
    assert prompts and all(re.fullmatch(r"\[\d+\]:", p.strip()) for p in prompts), prompts
    if os.environ.get("TRITON_INTERPRET") == "1":  # no GPU: the kernel inherited the interpreter mode
        expect(notebook).to_contain_text("kernel: Triton interpreter on the CPU")

    # the widgets render (and not as "Error displaying widget" or a text fallback)
    assert "Error displaying widget" not in notebook.inner_text(), "a widget did not render"
    explorer = notebook.locator(".topo-attn-explorer")
    expect(explorer).to_be_visible()
    sliders = {name: explorer.locator(".widget-slider").filter(has=page.locator(".widget-label", has_text=name))
               for name in ("sinks", "window", "top-k")}
    for slider in sliders.values():
        expect(slider).to_have_count(1)
        expect(slider.locator(".noUi-handle")).to_be_visible()
    stats, mask = explorer.locator(".topo-attn-stats"), explorer.locator(".topo-attn-mask img")
    expect(stats).to_have_text(states[0][0], use_inner_text=True, timeout=REDRAW_S * 1000)
    expect(mask).to_have_count(1)
    images = [mask.get_attribute("src")]
    explorer.screenshot(path=ARTIFACTS / "explorer-before.png")

    # move the sliders as a person can: type into the slider's editable readout and press Enter
    for (name, value), (expected_stats, _) in zip(MOVES, states[1:]):
        readout = sliders[name].locator(".widget-readout")
        readout.click()
        page.keyboard.press("Control+A")
        page.keyboard.type(str(value))
        page.keyboard.press("Enter")
        readout.blur()
        expect(readout).to_have_text(str(value))
        expect(sliders[name].locator(".noUi-handle")).to_have_attribute("aria-valuenow",
                                                                          re.compile(rf"^{value}(\.0+)?$"))
        expect(stats).to_have_text(expected_stats, use_inner_text=True, timeout=REDRAW_S * 1000)
        expect(mask).not_to_have_attribute("src", images[-1], timeout=REDRAW_S * 1000)
        expect(mask).to_have_count(1)
        images.append(mask.get_attribute("src"))
    explorer.screenshot(path=ARTIFACTS / "explorer-after.png")
    page.screenshot(path=ARTIFACTS / "page-after.png", full_page=True)

    # the figure follows the schedule: each source colour grows or shrinks with its number of blocks
    pixels = [_colour_pixels(src) for src in images]
    for step, (name, value) in enumerate(MOVES):
        before, after = states[step][1], states[step + 1][1]
        for label in (SINK, WINDOW, TOPOLOGY):
            cells = int((after == label).sum()) - int((before == label).sum())
            drawn = pixels[step + 1][label] - pixels[step][label]
            assert np.sign(drawn) == np.sign(cells), (
                f"after moving {name} to {value}, label {label} has {cells:+d} blocks but {drawn:+d} pixels of "
                f"its colour in the figure")
