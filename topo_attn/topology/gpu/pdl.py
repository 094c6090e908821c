"""Programmatic dependent launch (PDL) for the schedule build's kernels.

The build is a chain of small, dependent kernels (about twenty for a shared schedule). On Hopper and newer GPUs
each of them is launched with Triton's ``launch_pdl`` and starts with :func:`wait_for_inputs`:
``griddepcontrol.wait`` (the previous kernel has finished and its writes are visible) and, for builds of few
lanes (:data:`EARLY_LAUNCH_MAX_LANES`), ``griddepcontrol.launch_dependents`` (the next kernel's programs may be
scheduled now, to wait in turn). So a kernel's launch overlaps the end of the one before it, in a CUDA graph too.
Nothing runs before the wait, so each kernel sees everything that every earlier kernel wrote, as without PDL.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import torch
import triton
import triton.language as tl

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # (a triton without grid dependency control: plain launches)
    gdc_launch_dependents = gdc_wait = None

EARLY_LAUNCH_MAX_LANES = 1
"""Builds of up to this many lanes let the next kernel launch as soon as every program of the current one has
passed its wait; builds of more lanes only wait. From H200 timings (topology/NOTES.md, "Numbers that were in the
code"): early launches sped up the shared build and slowed the per-lane one, whose two lane groups run on two
streams (waiting programs hold SM slots that the other group's kernels need)."""


@functools.cache
def _supported(device_index: int) -> bool:
    if os.environ.get("TRITON_INTERPRET") == "1" or gdc_wait is None:
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    has_option = "launch_pdl" in {f.name for f in dataclasses.fields(CUDAOptions)}
    return has_option and torch.version.cuda is not None and torch.cuda.get_device_capability(device_index)[0] >= 9


def pdl_options(device: torch.device, lanes: int) -> dict:
    """Launch keywords for a build kernel that takes ``PDL: tl.constexpr`` and calls :func:`wait_for_inputs`
    first.

    Arguments:
        device: where the kernel runs.
        lanes: the lanes of the build the kernel belongs to.

    Returns:
        ``{"PDL": 2, "launch_pdl": True}`` (waits and early launches) up to :data:`EARLY_LAUNCH_MAX_LANES` lanes,
        ``{"PDL": 1, "launch_pdl": True}`` (waits only) above, on CUDA devices that support PDL (compute
        capability 9.0 or newer, a triton with ``launch_pdl``, not the interpreter); else ``{"PDL": 0}``
        (plain launches).
    """
    if device.type == "cuda" and _supported(device.index if device.index is not None else 0):
        return dict(PDL=2 if lanes <= EARLY_LAUNCH_MAX_LANES else 1, launch_pdl=True)
    return dict(PDL=0)


@triton.jit
def wait_for_inputs(PDL: tl.constexpr):
    """A build kernel's first step: with PDL (``PDL >= 1``), wait until the previous kernel is done and its
    writes are visible, then (``PDL == 2``) let the next kernel's programs be scheduled."""
    if PDL >= 1:
        gdc_wait()
    if PDL >= 2:
        gdc_launch_dependents()
