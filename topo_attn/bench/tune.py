"""Sweep tile configurations of the forward kernel on a GPU: ``python -m topo_attn.bench.tune``.

For each shape, every candidate (BLOCK_M, BLOCK_N, num_warps, NUM_STAGES) is checked against the float32
reference on sampled rows, then timed (median of CUDA-event timings). The winners feed ``tile_config``;
results and the command are recorded in ``topo_attn/attention/NOTES.md``.
"""

from __future__ import annotations

import argparse
import itertools

import torch

from .. import cli
from .._checks import SUPPORTED_DTYPES

PROG = "python -m topo_attn.bench.tune"
DTYPES = tuple(str(dtype).removeprefix("torch.") for dtype in SUPPORTED_DTYPES)
"""The dtypes the forward kernel takes, by name."""

SHAPES = [
    # B, H, S, D, block_size, schedule ("topology" = #22's rule, window 1, 1 sink, top-k n/8; or "dense")
    (1, 32, 16384, 128, 128, "topology"),
    (1, 32, 16384, 128, 64, "topology"),
    (1, 16, 16384, 64, 64, "topology"),
    (1, 32, 16384, 128, 128, "dense"),
    (1, 32, 16384, 128, 64, "dense"),
]


def candidates(block_size: int, head_dim: int):
    """Yield the forward configurations to time for one shape: dicts with ``BLOCK_M``, ``BLOCK_N`` (each at most
    ``block_size``), ``num_warps``, ``NUM_STAGES`` and ``TMA``, as :func:`~topo_attn.attention.forward.tile_config`
    returns them."""
    for block_m, block_n, warps, stages, tma in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3, 4),
                                                                  (False, True)):
        if block_m > block_size or block_n > block_size:
            continue
        if head_dim >= 128 and block_m == 128 and warps == 4:
            continue  # register pressure: 128 x 128 fp32 accumulator on 4 warps spills
        yield dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, NUM_STAGES=stages, TMA=tma)


def build_parser() -> argparse.ArgumentParser:
    """The sweep's command line."""
    parser = cli.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    cli.add_debug_argument(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the sweep over ``SHAPES`` on the current CUDA device and print, per shape, SDPA's time, the
    schedule's limit and the six fastest configurations. ``argv``: ``[--dtype NAME]`` (default bfloat16).
    Needs a CUDA GPU (:class:`~topo_attn.cli.UsageError` without one); a configuration that fails to compile or
    run is printed as failed and skipped. Returns 0."""
    args = build_parser().parse_args(argv)
    if not torch.cuda.is_available():
        raise cli.UsageError("the tile sweep needs a CUDA GPU (it times the compiled kernel); none is visible here")
    import triton

    import topo_attn as ta
    from topo_attn.attention.forward import scheduled_attention_forward, tile_config

    dtype = getattr(torch, args.dtype)
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__} {args.dtype}")
    for B, H, S, D, bs, kind in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
        nb = ta.num_blocks(S, bs)
        schedule = (ta.topology_schedule(k[0, 0], bs, 1, 1, max(1, nb // 8)) if kind == "topology"
                    else ta.dense_causal_schedule(S, bs, device="cuda"))
        rows = slice(S - 256, S)
        ref = ta.dense_masked_attention(q[:, :2].float(), k[:, :2].float(), v[:, :2].float(), schedule, rows=rows)
        sdpa = triton.testing.do_bench(
            lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
            warmup=25, rep=100, return_mode="median")
        visited = schedule.nnz / ta.dense_causal_schedule(S, bs).nnz
        print(f"\n{kind} B={B} H={H} S={S} D={D} block={bs}: SDPA {sdpa:.3f} ms, limit {sdpa * visited:.3f} ms, "
              f"default {tile_config(bs, D, dtype)}")
        results = []
        for config in candidates(bs, D):
            def run():
                return scheduled_attention_forward(q, k, v, schedule, D ** -0.5, False, config)[0]
            try:
                err = (run()[:, :2, rows].float() - ref).abs().max().item()
                ms = triton.testing.do_bench(run, warmup=25, rep=100, return_mode="median")
            except Exception as exc:  # out of shared memory or registers for this config
                print(f"  {config}: failed ({type(exc).__name__})")
                continue
            results.append((ms, config, err))
        for ms, config, err in sorted(results, key=lambda r: r[0])[:6]:
            print(f"  {ms:7.3f} ms  {sdpa * visited / ms:5.2f} of limit  err {err:.1e}  {config}")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main, prog=PROG))
