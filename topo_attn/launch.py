"""The short launch path of the kit's kernels (attention, selection, the GPU schedule build): a compiled kernel
looked up once per specialisation and launched through its own launcher, without Triton's per-call argument
binding. It imports nothing of the package, so every kernel module may use it.

``kernel[grid](*args, **meta)`` binds every argument, computes Triton's specialisation key (integers equal to 1
or divisible by 16, 16-byte-aligned pointers, 32- or 64-bit integers), looks the compiled kernel up, and only
then launches: tens of microseconds per call, more than the kernel itself at short sequences. :func:`launch`
keeps the compiled kernel of each key it has seen in :data:`PLANS` and launches it directly. Its key holds at
least what Triton specialises on, so a kernel compiled for aligned inputs is never reused for unaligned ones;
a new key goes through ``kernel[grid]`` once (compiling only when Triton has no such kernel either).

The direct launch uses triton 3.6's ``CompiledKernel.run`` signature (the version the GPU image pins); with
another triton, in the interpreter, or while a launch hook is set (a profiler), every call goes through
``kernel[grid]``. Tensor descriptors are passed as :class:`Tiles` and become triton's own descriptor classes
on that path only (their constructors validate, which costs microseconds; the callers have checked TMA
eligibility already).
"""

from __future__ import annotations

import functools
import re

import numpy as np
import torch
import triton
from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def _probe():
    pass


INTERPRETED: bool = isinstance(_probe, InterpretedFunction)
"""True when ``TRITON_INTERPRET=1`` was set before triton was imported: the kernels then run on the CPU."""


def _release(version: str) -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", version).groups()
    return int(major), int(minor)


def interpreter_unsupported_reason(triton_version: str = triton.__version__,
                                   numpy_version: str = np.__version__) -> str | None:
    """Why Triton's interpreter cannot run the kit's kernels with these versions, or ``None``. Triton before 3.7
    turns a loaded scalar into a Python int with ``int()`` of a one-element array, which numpy 2.4 made a
    ``TypeError``: every kernel whose loop bounds are loaded (all of the kit's) then fails inside the
    interpreter. Compiled kernels are not affected."""
    if _release(triton_version) < (3, 7) and _release(numpy_version) >= (2, 4):
        return (f"Triton's interpreter in triton {triton_version} cannot run with numpy {numpy_version} (numpy 2.4 "
                f"stopped converting one-element arrays to int, which triton < 3.7's interpreter does): install "
                f"triton>=3.7 or numpy<2.4")
    return None


INTERPRETER_PROBLEM: str | None = interpreter_unsupported_reason() if INTERPRETED else None
"""In the interpreter, why it cannot run the kernels here (:func:`interpreter_unsupported_reason`), else None."""

DIRECT: bool = not INTERPRETED and triton.__version__.startswith("3.6.")
"""Whether :func:`launch` may launch compiled kernels directly (triton 3.6, not the interpreter)."""

PLANS: dict = {}
"""The compiled kernel and trailing compile-time arguments of each launch key :func:`launch` has seen."""

_INT32 = (-(1 << 31), (1 << 31) - 1)


class Tiles:
    """A TMA tensor descriptor to be: ``base`` (a ``[B, H, S, D]`` tensor, TMA-addressable, checked by the
    caller) read in ``block_shape`` tiles; ``layout``: a Gluon ``NVMMASharedLayout`` for a Gluon kernel, or
    ``None`` for a Triton kernel (``triton.tools.tensor_descriptor``). Holds the attributes triton's launcher
    reads (``base``, ``shape``, ``strides``, ``padding``); :meth:`descriptor` builds the real one."""

    __slots__ = ("base", "shape", "strides", "block_shape", "layout", "padding")

    def __init__(self, base: torch.Tensor, block_shape: list[int], layout=None):
        self.base, self.block_shape, self.layout, self.padding = base, block_shape, layout, "zero"
        self.shape, self.strides = list(base.shape), list(base.stride())

    def descriptor(self):
        """The triton descriptor (Gluon's when a layout is set), validated by its constructor."""
        if self.layout is None:
            from triton.tools.tensor_descriptor import TensorDescriptor

            return TensorDescriptor(self.base, self.shape, self.strides, self.block_shape)
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        return TensorDescriptor(self.base, self.shape, self.strides, self.block_shape, self.layout)


def specialisation(arg, unspecialised: bool = False) -> object:
    """What of ``arg`` a launch key must hold, a superset of what Triton specialises a kernel on: for an int,
    whether it is 1, divisible by 16 and within 32 bits; for a tensor (a pointer), its dtype and whether its
    address is 16-byte aligned; for :class:`Tiles`, the dtype, tile, layout and alignment; for a float or
    ``None``, the type. ``unspecialised``: the parameter is in the kernel's ``do_not_specialize`` list, so an
    int counts only by its width. Raises ``TypeError`` for anything else (a kernel argument the key does not
    know)."""
    kind = type(arg)
    if kind is int:
        if unspecialised:
            return _INT32[0] <= arg <= _INT32[1]
        return (arg == 1, arg % 16 == 0, _INT32[0] <= arg <= _INT32[1])
    if kind is float or arg is None:
        return kind
    if isinstance(arg, torch.Tensor):
        return (arg.dtype, arg.data_ptr() % 16 == 0)
    if kind is Tiles:
        return (arg.base.dtype, tuple(arg.block_shape), arg.layout, arg.base.data_ptr() % 16 == 0)
    raise TypeError(f"launch: no launch key for a kernel argument of type {kind.__name__}")


@functools.lru_cache(maxsize=None)
def _unspecialised(kernel) -> tuple[bool, ...]:
    """Per parameter of ``kernel``, whether Triton leaves it unspecialised (``do_not_specialize``)."""
    return tuple(bool(p.do_not_specialize) for p in kernel.params)


def _real(args: tuple) -> list:
    return [a.descriptor() if type(a) is Tiles else a for a in args]


def _hooked() -> bool:
    """Whether a launch hook (a profiler's) is set: then launches go through ``kernel[grid]``, which calls it."""
    runtime = triton.knobs.runtime
    return bool(runtime.launch_enter_hook.calls or runtime.launch_exit_hook.calls)


def launch(kernel, grid: tuple[int, ...], args: tuple, meta: dict) -> None:
    """``kernel[grid](*args, **meta)``, through the compiled kernel of this launch key when one is known.

    Arguments:
        kernel: a ``triton.jit`` or ``gluon.jit`` function whose parameters begin with ``args`` (run-time
            values: tensors, :class:`Tiles`, ints, floats) and continue with the compile-time ones in ``meta``.
        grid: one to three program counts.
        args: the run-time arguments, positional.
        meta: compile-time arguments and launch options (``num_warps``, ``maxnreg``, ...), by name.

    Launches on the current device and stream, as ``kernel[grid]`` does. Raises what ``kernel[grid]`` raises
    on a new key, ``TypeError`` for an argument :func:`specialisation` does not know, and ``RuntimeError`` (before
    any launch) when the interpreter cannot run here (:data:`INTERPRETER_PROBLEM`)."""
    if not DIRECT or _hooked():
        if INTERPRETER_PROBLEM is not None:
            raise RuntimeError(INTERPRETER_PROBLEM)
        kernel[grid](*_real(args), **meta)
        return
    driver = triton.runtime.driver.active
    device = driver.get_current_device()
    key = (kernel, device, tuple(meta.items()), tuple(map(specialisation, args, _unspecialised(kernel))))
    plan = PLANS.get(key)
    if plan is None:  # Triton's own path binds, specialises and compiles (or finds) the kernel
        compiled = kernel[grid](*_real(args), **meta)
        if hasattr(compiled, "result"):  # an asynchronous compilation
            compiled = compiled.result()
        names = kernel.arg_names[len(args):]
        defaults = {p.name: p.default for p in kernel.params}
        PLANS[key] = (compiled, tuple(meta[n] if n in meta else defaults[n] for n in names))
        return
    compiled, tail = plan
    compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
                 driver.get_current_stream(device), compiled.function, compiled.packed_metadata, None, None, None,
                 *args, *tail)
