"""What this machine gives you: ``python -m topo_attn.doctor``.

Prints the GPU (or that there is none), the Python / torch / triton / transformers / CUDA versions, whether Triton
runs compiled or in its interpreter, whether the direct launch path is on, and, for one representative call of
:func:`~topo_attn.attention.scheduled_attention` (``--seq-len``, ``--q-len``, ``--heads``, ...), which forward,
backward and decode kernels it would run and why not the others, and where ``topology_schedule`` would build its
schedule. Then what to install to get the Gluon Hopper forward where it is missing. ``--json`` prints the same as
one JSON object.

It only decides: the choices come from the functions the kernels' callers use (``forward_kernel``,
``decode_kernel_reason``, ``backward_path``, ``launch.DIRECT``); nothing is launched. It allocates the call's
q, k and v, uninitialised, on the device a call would use (the Hopper check reads their strides and addresses).
See docs/versions.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import textwrap

import torch

from . import cli
from ._checks import MAX_LANES, SUPPORTED_HEAD_DIMS, check_kernel_block_size
from .provenance import package_version

PROG = "python -m topo_attn.doctor"

GLUON_TRITON = "3.6"
"""The triton whose Gluon API ``attention/hopper.py`` is written for (the version advice only; whether the
Gluon forward runs is decided by ``hopper_unsupported_reason``)."""

GLUON_TORCH = "2.11"
"""The torch release whose CUDA wheels pin triton 3.6: the pair the committed benchmark figures were measured
with."""

HOPPER_CAPABILITY = (9, 0)
"""The compute capability of the Hopper GPUs (H100, H200) the Gluon forward is compiled for (advice only)."""

WIDTH = 110
"""Columns of the text report (longer lines wrap under their value)."""

DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
          "half": torch.float16, "float32": torch.float32, "fp32": torch.float32, "float": torch.float32}
"""``--dtype`` names."""


def build_parser() -> argparse.ArgumentParser:
    """The doctor's command line."""
    parser = cli.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    call = parser.add_argument_group("the representative call (q [B, H, L, D], k and v [B, H_kv, S, D])")
    call.add_argument("--seq-len", type=int, default=4096, help="S, the keys (default 4096)")
    call.add_argument("--q-len", type=int, default=None,
                      help="L, the queries at the end of the keys (default: S; 1 is a decode step)")
    call.add_argument("--batch", type=int, default=1, help="B (default 1)")
    call.add_argument("--heads", type=int, default=32, help="H, query heads (default 32)")
    call.add_argument("--kv-heads", type=int, default=8, help="H_kv, key/value heads, dividing H (default 8)")
    call.add_argument("--head-dim", type=int, default=128,
                      help=f"D, one of {', '.join(map(str, SUPPORTED_HEAD_DIMS))} (default 128)")
    call.add_argument("--block-size", type=int, default=64, help="tokens per block, a power of two >= 16 (default 64)")
    call.add_argument("--dtype", default="bfloat16", help="bfloat16 (bf16), float16 (fp16) or float32 (fp32); "
                                                          "default bfloat16")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    cli.add_debug_argument(parser)
    return parser


def check_args(args: argparse.Namespace) -> None:
    """Raise :class:`~topo_attn.cli.UsageError` naming the option for a value no call could have."""
    cli.check_at_least("--seq-len", args.seq_len, 1)
    cli.check_at_least("--q-len", args.q_len, 1)
    for option in ("--batch", "--heads", "--kv-heads"):
        cli.check_at_least(option, getattr(args, option[2:].replace("-", "_")), 1)
    if args.q_len is not None and args.q_len > args.seq_len:
        raise cli.UsageError(f"argument --q-len: must be <= --seq-len ({args.seq_len}), got {args.q_len}")
    if args.heads % args.kv_heads:
        raise cli.UsageError(f"argument --kv-heads: must divide --heads ({args.heads}), got {args.kv_heads}")
    if args.batch * args.heads > MAX_LANES:
        raise cli.UsageError(f"argument --heads: batch * heads must be <= {MAX_LANES}, got {args.batch * args.heads}")
    if args.head_dim not in SUPPORTED_HEAD_DIMS:
        raise cli.UsageError(f"argument --head-dim: must be one of {', '.join(map(str, SUPPORTED_HEAD_DIMS))}, "
                             f"got {args.head_dim}")
    cli.check_option("--block-size", lambda: check_kernel_block_size(args.block_size))
    if args.dtype not in DTYPES:
        raise cli.UsageError(f"argument --dtype: must be bfloat16 (bf16), float16 (fp16) or float32 (fp32), "
                             f"got {args.dtype!r}")


# --- the machine and the versions ---------------------------------------------------------------------------


def _driver_version() -> str | None:
    """The NVIDIA driver, from ``nvidia-smi`` (None where it is missing or fails)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        result = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = result.stdout.strip().splitlines()
    return lines[0].strip() if result.returncode == 0 and lines else None


def machine() -> dict:
    """The GPU a call would use (the current CUDA device), or ``gpu: None``."""
    if not torch.cuda.is_available():
        return dict(gpu=None, compute_capability=None, gpus=0)
    index = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    return dict(gpu=torch.cuda.get_device_name(index), compute_capability=f"{major}.{minor}",
                gpus=torch.cuda.device_count())


def versions() -> dict:
    """Python, torch, triton, numpy, transformers (None: not installed), the CUDA torch was built with (None: a CPU
    build) and the NVIDIA driver (None: no ``nvidia-smi``)."""
    from . import __version__

    return dict(topo_attn=__version__, python=platform.python_version(), torch=torch.__version__,
                triton=package_version("triton"), numpy=package_version("numpy"),
                transformers=package_version("transformers"), cuda=torch.version.cuda, driver=_driver_version())


# --- the decisions ------------------------------------------------------------------------------------------


def diagonal_schedule(seq_len: int, q_len: int, block_size: int, device: torch.device):
    """A shared row schedule of the diagonal blocks only, for ``seq_len`` keys and the last ``q_len`` queries,
    on ``device``: valid by construction, built on the CPU and copied (no kernel runs). The kernel choices
    depend on its block size and lengths, not on which blocks it lists."""
    from .schedule import BlockSchedule, num_blocks

    blocks = num_blocks(seq_len, block_size)
    first = (seq_len - q_len) // block_size
    offsets = torch.arange(blocks - first + 1, dtype=torch.int32).to(device)
    indices = torch.arange(first, blocks, dtype=torch.int32).to(device)
    return BlockSchedule.unchecked(offsets, indices, block_size, seq_len, None, False, q_len)


def forward_choice(q, k, v, schedule, scale: float) -> dict:
    from .attention import forward_kernel

    name, reason = forward_kernel(q, k, v, schedule, scale)
    if name == "hopper":
        return dict(kernel="hopper", name="Gluon warp-specialised Hopper forward (attention/hopper.py)",
                    reason="hopper_unsupported_reason has nothing against this call (a Hopper GPU, triton 3.6, "
                           "and a dtype, head dim, block size and layout the kernel takes)")
    return dict(kernel="portable", name="portable Triton forward (attention/forward.py)",
                reason=f"the Gluon Hopper forward does not apply: {reason}")


def backward_choices() -> dict:
    """What :func:`~topo_attn.attention.backward.backward_path` picks for each ``deterministic`` and under
    ``torch.use_deterministic_algorithms(True)`` (set for the question and restored)."""
    from .attention.backward import backward_path

    kernels = {"deterministic": "the dQ kernel over the rows and the dK/dV kernel over the columns (after the "
                                "delta preprocess); no atomics, reproducible bit for bit",
               "atomic": "the dK/dV kernel, adding dQ with float32 atomics (after the delta preprocess; when dQ "
                         "and dK or dV are needed); dQ's last bits may vary, measured slower"}
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    default, opt_out = backward_path(True), backward_path(False)
    try:
        torch.use_deterministic_algorithms(True)
        forced = backward_path(False)
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    return {
        "deterministic=True": dict(path=default, kernels=kernels[default], reason="the default"),
        "deterministic=False": dict(path=opt_out, kernels=kernels[opt_out],
                                    reason="asked for" if opt_out == "atomic" else
                                    "torch.use_deterministic_algorithms(True) is in force"),
        "deterministic=False with torch.use_deterministic_algorithms(True)": dict(
            path=forced, kernels=kernels[forced], reason="torch's deterministic mode wins"),
    }


def gluon_backward_choice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, schedule) -> dict:
    """Which dQ and dK/dV kernels the deterministic backward of this call runs (``dq_kernel="auto"``,
    ``dkdv_kernel="auto"``), and why: :func:`~topo_attn.attention.hopper_backward.hopper_backward_unsupported_reason`
    on the call's schedule (one condition for both Gluon kernels)."""
    from .attention.hopper_backward import hopper_backward_unsupported_reason

    reason = hopper_backward_unsupported_reason(q, k, v, schedule)
    if reason is None:
        return dict(kernel="hopper", name="Gluon Hopper dQ and dK/dV (attention/hopper_dq.py, hopper_backward.py)",
                    reason="a Hopper GPU with triton 3.6, a whole sequence, and dtypes, head dim, block size and "
                           "layout the kernels take")
    return dict(kernel="portable", name="portable Triton dQ and dK/dV (attention/backward.py)",
                reason=f"the Gluon Hopper backward does not apply: {reason}")


def schedule_builder(seq_len: int, block_size: int, device: torch.device) -> dict:
    """Where ``topology_schedule`` builds the schedule of keys on ``device``, and why
    (:func:`topo_attn.topology.build.cpu_build_reason`, the rule it follows)."""
    from .schedule import num_blocks
    from .topology.build import cpu_build_reason
    from .topology.gpu import MAX_BLOCKS

    blocks = num_blocks(seq_len, block_size)
    reason = cpu_build_reason(device, blocks)
    if reason is not None:
        return dict(where="cpu", reason=reason)
    return dict(where="gpu", reason=f"keys on CUDA, {blocks} <= {MAX_BLOCKS} blocks per lane: Triton kernels, "
                                    f"all lanes at once, replayed from a CUDA graph")


def triton_state() -> dict:
    """Interpreter or compiled, and the direct launch path (``launch.DIRECT``) with why not."""
    from . import launch

    state = dict(interpreter=launch.INTERPRETED, TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET"),
                 direct_launch=launch.DIRECT)
    if launch.DIRECT:
        state["direct_launch_reason"] = ("compiled kernels launch through CompiledKernel.run once a launch key "
                                         "has been seen (kernel[grid] while a launch hook, a profiler, is set)")
    elif launch.INTERPRETED:
        state["direct_launch_reason"] = "the Triton interpreter runs: every launch goes through kernel[grid]"
    else:
        import triton

        state["direct_launch_reason"] = (f"triton {triton.__version__}: the direct path calls triton "
                                         f"{GLUON_TRITON}'s CompiledKernel.run, so every launch goes through "
                                         f"kernel[grid]")
    return state


def decisions(args: argparse.Namespace) -> dict:
    """The representative call and the kernels it would run. Never launches a kernel."""
    from ._checks import check_kernel_inputs, check_qkv, check_scale
    from .attention.scheduled import decode_kernel_reason
    from . import launch
    from .schedule import check_schedule_for

    seq_len, q_len = args.seq_len, args.q_len or args.seq_len
    dtype = DTYPES[args.dtype]
    device = torch.device("cuda" if torch.cuda.is_available() and not launch.INTERPRETED else "cpu")
    call = dict(batch=args.batch, heads=args.heads, kv_heads=args.kv_heads, seq_len=seq_len, q_len=q_len,
                head_dim=args.head_dim, block_size=args.block_size, dtype=str(dtype).removeprefix("torch."),
                device=device.type, schedule="shared")
    result = dict(call=call, schedule_builder=schedule_builder(seq_len, args.block_size, device))
    try:
        q = torch.empty((args.batch, args.heads, q_len, args.head_dim), dtype=dtype, device=device)
        k, v = (torch.empty((args.batch, args.kv_heads, seq_len, args.head_dim), dtype=dtype, device=device)
                for _ in range(2))
    except RuntimeError as error:  # out of memory: the call could not be made here either
        result.update(runs=False, why_not=f"q, k and v do not fit on {device.type}: {error}".splitlines()[0])
        return result
    schedule = diagonal_schedule(seq_len, q_len, args.block_size, device)
    # -- the checks scheduled_attention makes before choosing: here only the device can fail
    try:
        shape = check_qkv(q, k, v, shorter_q=True)
        check_schedule_for(schedule, shape, q.device)
        scale = check_scale(None, shape.head_dim)
        check_kernel_inputs(q, k, v, shape, schedule, launch.INTERPRETED)
    except (TypeError, ValueError) as error:
        result["runs"] = False
        result["why_not"] = f"scheduled_attention raises before any launch: {error}"
        return result
    result["runs"] = True
    decode = decode_kernel_reason(q_len, seq_len, grad=False)
    with_grad = forward_choice(q, k, v, schedule, scale)
    if decode is None:
        from .attention.decode import MAX_DECODE_QUERIES

        decode = (f"a decode step: {q_len} {'query' if q_len == 1 else 'queries'} (at most "
                  f"{MAX_DECODE_QUERIES}) at the end of {seq_len} keys, no gradients, kernel='auto'")
        result["forward"] = dict(kernel="decode", name="split-K decode kernel (attention/decode.py)", reason=decode)
        result["decode"] = dict(used=True, reason=decode)
    else:
        result["forward"] = with_grad
        result["decode"] = dict(used=False, reason=decode)
    result["forward_with_grad"] = with_grad
    result["backward"] = backward_choices()
    result["gluon_backward"] = gluon_backward_choice(q, k, v, schedule)
    if launch.INTERPRETED and dtype == torch.bfloat16:
        result["note"] = ("the interpreter gets bfloat16 matrix operands as float32 copies (its tl.dot has no "
                          "bfloat16)")
    return result


def advice(report: dict) -> list[str]:
    """What to install or set to get the Gluon forward (or any kernel at all) here."""
    found = report["versions"]
    gpu = report["machine"]
    tips = []
    if found["triton"] is None:
        tips.append(f"triton is not installed: pip install torch=={GLUON_TORCH}.0 (a CUDA build; it brings triton "
                    f"{GLUON_TRITON})")
        return tips
    if gpu["gpu"] is None:
        if not report["triton_state"]["interpreter"]:
            tips.append("no CUDA GPU: set TRITON_INTERPRET=1 in the environment (before triton is imported) to run "
                        "the kernels in Triton's interpreter on the CPU")
        if found["cuda"] is None:
            tips.append(f"torch {found['torch']} is a CPU build; on a GPU machine install a CUDA build")
    elif report["triton_state"]["interpreter"]:
        tips.append("TRITON_INTERPRET is set on a GPU machine: the kernels run in the interpreter on the CPU; unset "
                    "it for the compiled kernels")
    if (gpu["gpu"] is None or report["triton_state"]["interpreter"]) and found["numpy"]:
        from .launch import interpreter_unsupported_reason

        problem = interpreter_unsupported_reason(found["triton"], found["numpy"])
        if problem:
            tips.append(problem)
    if gpu["gpu"] is not None and tuple(map(int, gpu["compute_capability"].split("."))) != HOPPER_CAPABILITY:
        tips.append(f"the Gluon forward needs a Hopper GPU (sm_90, H100/H200); this {gpu['gpu']} is "
                    f"sm_{gpu['compute_capability'].replace('.', '')}: the portable forward runs")
    if not found["triton"].startswith(GLUON_TRITON + "."):
        tips.append(f"the Gluon Hopper forward (and the direct launch path) needs triton {GLUON_TRITON} (you have "
                    f"{found['triton']}): pip install torch=={GLUON_TORCH}.0, whose CUDA wheels pin triton "
                    f"{GLUON_TRITON}; the benchmark figures were measured with torch {GLUON_TORCH} / triton "
                    f"{GLUON_TRITON}")
    return tips


def report_for(args: argparse.Namespace) -> dict:
    """Everything the doctor prints, as one JSON-ready dict."""
    report = dict(machine=machine(), versions=versions())
    try:
        report["triton_state"] = triton_state()
    except ImportError as error:  # no triton: nothing of the kernels can be asked
        report["triton_state"] = dict(interpreter=False, TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET"),
                                      direct_launch=False, direct_launch_reason=f"triton cannot be imported: {error}")
        report["kernels"] = dict(runs=False, why_not=f"triton cannot be imported: {error}")
    else:
        report["kernels"] = decisions(args)
    report["advice"] = advice(report)
    return report


# --- text ---------------------------------------------------------------------------------------------------


def render(report: dict) -> str:
    """The report as aligned text lines."""
    lines = []

    def row(label: str, text: str) -> None:
        lines.append(textwrap.fill(text, WIDTH, initial_indent=f"  {label:<16} ", subsequent_indent=" " * 19,
                                   break_on_hyphens=False))

    found, gpu, state, kern = report["versions"], report["machine"], report["triton_state"], report["kernels"]
    lines.append(f"topo_attn {report['versions']['topo_attn']} doctor")
    lines.append("machine")
    if gpu["gpu"] is None:
        row("GPU", "no CUDA GPU")
    else:
        more = f" (device 0 of {gpu['gpus']})" if gpu["gpus"] > 1 else ""
        row("GPU", f"{gpu['gpu']}, compute capability {gpu['compute_capability']}{more}")
    lines.append("versions")
    row("python", found["python"])
    row("torch", found["torch"] + (f" (CUDA {found['cuda']})" if found["cuda"] else " (a CPU build, no CUDA)"))
    row("triton", found["triton"] or "not installed")
    row("numpy", found["numpy"] or "not installed")
    row("transformers", found["transformers"] or "not installed")
    if found["driver"]:
        row("NVIDIA driver", found["driver"])
    lines.append("triton")
    interp = state["TRITON_INTERPRET"]
    row("mode", f"interpreter (TRITON_INTERPRET={interp}): kernels run on the CPU" if state["interpreter"] else
        "compiled" + ("" if interp is None else f" (TRITON_INTERPRET={interp})"))
    row("direct launch", ("on: " if state["direct_launch"] else "off: ") + state["direct_launch_reason"])
    call = kern.get("call")
    if call:
        lines.append(textwrap.fill(
            f"call: q [{call['batch']}, {call['heads']}, {call['q_len']}, {call['head_dim']}] {call['dtype']}, "
            f"k/v [{call['batch']}, {call['kv_heads']}, {call['seq_len']}, {call['head_dim']}], "
            f"{call['block_size']}-token blocks, {call['schedule']} schedule, on {call['device']}", WIDTH,
            subsequent_indent=" " * 6))
    else:
        lines.append("call")
    if not kern["runs"]:
        row("kernels", "none: " + kern["why_not"])
    else:
        fwd, grad = kern["forward"], kern["forward_with_grad"]
        row("forward", f"{fwd['name']}: {fwd['reason']}")
        if fwd["kernel"] == "decode" or grad["kernel"] != fwd["kernel"]:
            row("forward (grad)", f"{grad['name']}: {grad['reason']}")
        bwd = kern["backward"]
        for i, (when, choice) in enumerate(bwd.items()):
            row("backward" if i == 0 else "", f"{when}: {choice['path']} path ({choice['reason']}): "
                                              f"{choice['kernels']}")
        row("dQ, dK/dV", f"{kern['gluon_backward']['name']}: {kern['gluon_backward']['reason']}")
        dec = kern["decode"]
        row("decode", ("split-K decode kernel: " if dec["used"] else "not used: ") + dec["reason"])
        if kern.get("note"):
            row("note", kern["note"])
    if "schedule_builder" in kern:
        build = kern["schedule_builder"]
        row("schedule build", f"topology_schedule on the {build['where'].upper()}: {build['reason']}")
    lines.append("advice")
    for tip in report["advice"] or ["none: the Gluon Hopper forward and the direct launch path are available"]:
        lines.append(textwrap.fill(tip, WIDTH, initial_indent="  - ", subsequent_indent="    ",
                                   break_on_hyphens=False))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_args(args)
    report = report_for(args)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main, prog=PROG))
