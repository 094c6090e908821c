"""Benchmark: the forward's host path (direct launches off and on) and the Gluon Hopper kernel's tile
configurations (one or two consumer partitions, 2-4 stages) against SDPA and the portable kernel, on a Hopper
GPU with triton 3.6. Not a pytest module; run it as

    OUT=<folder> python tests/bench_hopper.py

It prints each row and writes <folder>/probe28.json (committed as data/benchmarks/hopper_probe_h200.json).
Ratios are visited-work TFLOP/s over SDPA's dense causal TFLOP/s, as in the ``llm`` suite.
"""
from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F
import triton

import topo_attn as ta
from topo_attn.attention import forward, hopper, launch
from topo_attn.bench.timing import host_us, visited_pairs

HOST_CASES = [(1, 1, 1024, 64, torch.float16, 64), (1, 32, 2048, 128, torch.bfloat16, 64),
              (1, 32, 2048, 128, torch.bfloat16, 128)]  # B, H, S, D, dtype, block


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def host_rows() -> list[dict]:
    """Host microseconds per call with ``launch.DIRECT`` off and on (one process), and do_bench medians."""
    rows = []
    for B, H, S, D, dt, bs in HOST_CASES:
        g = torch.Generator(device="cuda").manual_seed(S)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=dt, generator=g) for _ in range(3))
        sch = ta.topology_schedule(k, bs, 1, 1, max(1, ta.num_blocks(S, bs) // 8), shared_lane=(0, 0))
        row = dict(case=f"B{B} H{H} S{S} D{D} {dt} b{bs}")
        for direct in (False, True):
            launch.DIRECT = direct
            row[f"auto_direct{direct}"] = host_us(lambda: ta.scheduled_attention(q, k, v, sch))
            row[f"portable_direct{direct}"] = host_us(lambda: ta.scheduled_attention(q, k, v, sch, kernel="portable"))
            row[f"auto_gpu_ms_direct{direct}"] = bench(lambda: ta.scheduled_attention(q, k, v, sch))
        launch.DIRECT = True
        row["forward_kernel_us"] = host_us(lambda: ta.forward_kernel(q, k, v, sch, 0.1))
        row["sdpa_us"] = host_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        row["sdpa_gpu_ms"] = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        row["kernel"] = ta.forward_kernel(q, k, v, sch, 0.1)
        print(row, flush=True)
        rows.append(row)
    # a decode step: in the recorded run (d8b4db2) its two kernels went through launch(); since 72e4e51 they
    # use kernel[grid], so both of these rows now time the same path
    N = 32768
    g = torch.Generator(device="cuda").manual_seed(N)
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(1, 8, N, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    sch = ta.dense_causal_schedule(N, 64, device="cuda", q_len=1)
    row = dict(case=f"decode q1 N{N} dense")
    for direct in (False, True):
        launch.DIRECT = direct
        row[f"decode_direct{direct}"] = host_us(lambda: ta.scheduled_attention(q, k, v, sch))
    launch.DIRECT = True
    row["sdpa_us"] = host_us(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    print(row, flush=True)
    rows.append(row)
    return rows


def sweep_rows() -> list[dict]:
    """Per case, SDPA, the portable kernel and each Gluon configuration: ms, visited-work TFLOP/s over SDPA's,
    dense CSR time over SDPA's, and the largest difference from the portable kernel's output."""
    variants = {
        128: {"C1 s2": hopper.tile_config(128, 128, 1), "C1 s3": dict(hopper.tile_config(128, 128, 1), NUM_STAGES=3),
              "C2 s2": hopper.tile_config(128, 128, 2), "C2 s3": dict(hopper.tile_config(128, 128, 2), NUM_STAGES=3)},
        64: {"C1 s2": hopper.tile_config(64, 128), "C1 s3": dict(hopper.tile_config(64, 128), NUM_STAGES=3),
             "C1 s4": dict(hopper.tile_config(64, 128), NUM_STAGES=4)},
    }
    rows = []
    B, H, D = 1, 32, 128
    scale = D ** -0.5
    for S in (16384, 32768):
        for bs in (128, 64):
            g = torch.Generator(device="cuda").manual_seed(20260629 + S)
            q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            sch = ta.topology_schedule(k, bs, 1, 1, max(1, ta.num_blocks(S, bs) // 8), shared_lane=(0, 0))
            dense = ta.dense_causal_schedule(S, bs, device="cuda")
            causal, visited = S * (S + 1) // 2, visited_pairs(sch)
            sdpa = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
            portable = bench(lambda: forward.scheduled_attention_forward(q, k, v, sch, scale, False))
            ref, _ = forward.scheduled_attention_forward(q, k, v, sch, scale, True)
            row = dict(case=f"S{S // 1024}k b{bs}", sdpa_ms=sdpa, portable_ms=portable,
                       portable_ratio=(visited / portable) / (causal / sdpa))
            row["dense_portable_over_sdpa"] = bench(
                lambda: forward.scheduled_attention_forward(q, k, v, dense, scale, False)) / sdpa
            for name, cfg in variants[bs].items():
                try:
                    o, _ = hopper.hopper_forward(q, k, v, sch, scale, True, cfg)
                    err = (o.float() - ref.float()).abs().max().item()
                    t = bench(lambda: hopper.hopper_forward(q, k, v, sch, scale, False, cfg))
                    td = bench(lambda: hopper.hopper_forward(q, k, v, dense, scale, False, cfg))
                    row[name] = dict(ms=t, ratio=(visited / t) / (causal / sdpa), dense_over_sdpa=td / sdpa,
                                     err_vs_portable=err)
                except Exception as e:  # noqa: BLE001 - a configuration that fails is reported, not fatal
                    row[name] = dict(error=f"{type(e).__name__}: {str(e)[:300]}")
                print(row["case"], name, row[name], flush=True)
            rows.append(row)
    return rows


def main() -> None:
    result = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    result["host"] = host_rows()
    result["sweep"] = sweep_rows()
    path = os.path.join(os.environ.get("OUT", "/tmp"), "probe28.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
