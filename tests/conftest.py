"""Test set-up: without a GPU, run the real Triton kernel in Triton's interpreter.

``TRITON_INTERPRET=1`` must be in the environment before triton is first imported, so it is set here, before
any test module imports topo_attn. ``TOPO_ATTN_CHECK_SCHEDULES=1`` makes every schedule the kit builds for itself
go through the same validation as a user's.
"""

import os
import shutil
import subprocess

import pytest


def _has_cuda_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


if "TRITON_INTERPRET" not in os.environ and not _has_cuda_gpu():
    os.environ["TRITON_INTERPRET"] = "1"
# every schedule the kit builds for itself is validated too (topo_attn.schedule.CHECK_ENV), in this process and
# in the processes the tests start
os.environ.setdefault("TOPO_ATTN_CHECK_SCHEDULES", "1")

from helpers import DEVICE  # noqa: E402  (after the environment is set)


@pytest.fixture
def device() -> str:
    """Where kernel tests put their tensors: CUDA with the compiled kernel, else the CPU (interpreter)."""
    return DEVICE


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU and the compiled kernel")
    for item in items:
        if "cuda" in item.keywords and DEVICE != "cuda":
            item.add_marker(skip)
