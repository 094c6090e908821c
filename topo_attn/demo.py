"""A short end-to-end run: ``python -m topo_attn.demo``.

Builds a topology schedule for sample keys, runs the Triton kernel (compiled on a GPU, in Triton's interpreter
on the CPU), checks it against the float64 reference and prints the schedule statistics.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from . import cli
from ._checks import SUPPORTED_HEAD_DIMS, check_kernel_block_size
from .rule import SINK, SKIPPED, TOPOLOGY, WINDOW, source_labels

PROG = "python -m topo_attn.demo"
PICTURE_CHARS = {SKIPPED: ".", SINK: "S", WINDOW: "W", TOPOLOGY: "T"}
"""One character per source label in the block picture."""


def _block_picture(labels: torch.Tensor, max_blocks: int = 32) -> str:
    """The causal part of source labels ``[n, n]`` (:func:`~topo_attn.rule.source_labels`) as text, one line
    per query block (at most ``max_blocks``): S sink, W window, T topology (top-k), . skipped."""
    lines = []
    for qb in range(min(labels.shape[0], max_blocks)):
        row = "".join(PICTURE_CHARS[int(label)] for label in labels[qb, :qb + 1])
        lines.append(f"  {qb:3d} {row}")
    if labels.shape[0] > max_blocks:
        lines.append(f"  ... ({labels.shape[0] - max_blocks} more rows)")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The demo's command line."""
    parser = cli.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=1000, help="tokens (>= 1)")
    parser.add_argument("--dim", type=int, default=64, choices=SUPPORTED_HEAD_DIMS, help="head dimension")
    parser.add_argument("--heads", type=int, default=2, help="heads (>= 1)")
    parser.add_argument("--block-size", type=int, default=64, help="tokens per block: a power of two >= 16")
    parser.add_argument("--window", type=int, default=1, help="window blocks (>= 0)")
    parser.add_argument("--sinks", type=int, default=1, help="sink blocks (>= 0)")
    parser.add_argument("--topk", type=int, default=2, help="topology blocks per query block (>= 0)")
    parser.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], default="float16")
    cli.add_debug_argument(parser)
    return parser


def check_args(args: argparse.Namespace) -> None:
    """Raise :class:`~topo_attn.cli.UsageError` for a value the schedule or the kernel would reject, before
    anything is printed."""
    cli.check_at_least("--seq-len", args.seq_len, 1)
    cli.check_at_least("--heads", args.heads, 1)
    cli.check_option("--block-size", lambda: check_kernel_block_size(args.block_size))
    for option in ("--window", "--sinks", "--topk"):
        cli.check_at_least(option, getattr(args, option[2:]), 0)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_args(args)

    on_gpu = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
    if not on_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported
    import topo_attn as ta
    from topo_attn.samples import clustered_keys

    device = "cuda" if on_gpu else "cpu"
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    S, D, H = args.seq_len, args.dim, args.heads
    keys = torch.stack([clustered_keys(S, D, args.block_size, seed=h) for h in range(H)])[None]
    q = torch.randn(1, H, S, D, generator=gen).to(device, dtype)
    k = keys.to(device, dtype)
    v = torch.randn(1, H, S, D, generator=gen).to(device, dtype)

    print(f"topo_attn demo: B=1 H={H} S={S} D={D} {args.dtype}, block_size={args.block_size}, "
          f"window={args.window}, sinks={args.sinks}, topk={args.topk}")
    print(f"kernel: {'compiled on ' + torch.cuda.get_device_name() if on_gpu else 'Triton interpreter on the CPU'}")

    start = time.perf_counter()
    schedule = ta.topology_schedule(k, args.block_size, args.window, args.sinks, args.topk)
    build_s = time.perf_counter() - start
    print(f"\nschedule (one per head): {schedule}")
    print(f"  {schedule.counts()}; built in {build_s * 1e3:.1f} ms")

    salience = ta.block_salience(ta.block_centroids(k[0, 0], args.block_size))
    top = ta.top_salient_blocks(salience, args.topk).tolist()
    print(f"  head 0: most salient blocks {top} (salience {[round(float(salience[b]), 2) for b in top]})")
    print("  head 0 block mask (rows: query blocks; S sink, W window, T topology, . skipped):")
    print(_block_picture(source_labels(schedule.to_block_mask()[0, 0].cpu(), args.sinks, args.window)))

    start = time.perf_counter()
    out = ta.scheduled_attention(q, k, v, schedule)
    if on_gpu:
        torch.cuda.synchronize()
    run_s = time.perf_counter() - start
    ref = ta.dense_masked_attention(q.double(), k.double(), v.double(), schedule)
    err = (out.double() - ref).abs().max().item()
    rel = ((out.double() - ref).norm() / ref.norm()).item()
    bound = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 4e-2}[dtype]
    print(f"\nscheduled_attention: {tuple(out.shape)} {out.dtype} in {run_s * 1e3:.1f} ms (first call, incl. "
          f"{'compilation' if on_gpu else 'interpretation'})")
    print(f"  vs float64 reference: max |error| {err:.2e}, relative L2 error {rel:.2e} (bound {bound:.0e})")
    if not rel < bound:
        print("  FAILED: the kernel does not match the reference")
        return 1
    print("  OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main, prog=PROG))
