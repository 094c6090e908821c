"""Benchmark (not a test): the Gluon Hopper dK/dV kernel against the portable one, on #22's rule at n/8 (window 1,
one sink, a shared schedule from ``topology_schedule``), bf16, B 1. Per case it times with ``triton.testing.do_bench``
(warm-up 5, 40 ms): the preprocess plus dK/dV alone (``needs=(False, True, True)``) and the whole backward, for
``dkdv_kernel="portable"``, ``"hopper"`` (its default configuration), the other consumer form, and the pipelined
and plain forms (``dkdv_tile_config(pipeline=True / False)``), and the largest
difference of dK and dV from the portable kernel's, relative to the portable's largest entry. Prints one line per
case; ``data/benchmarks/dkdv_h100.json`` holds a run. ``python tests/bench_dkdv.py`` on a Hopper GPU with triton 3.6.
"""

import torch
import triton
from triton.testing import do_bench

import topo_attn as ta
import topo_attn.attention.backward as bw
import topo_attn.attention.hopper_backward as hb

CASES = [(32, 32, 128, 128, 16384), (32, 32, 128, 64, 16384), (32, 8, 128, 128, 16384), (32, 32, 64, 64, 16384),
         (32, 8, 64, 64, 32768)]  # H, H_kv, D, block size, S


def case_inputs(H: int, Hkv: int, D: int, bs: int, S: int):
    """``(q, k, v, do, schedule, out, lse)`` of one case: bf16 random inputs (seed 0), #22's rule at n/8 on the
    first key/value head, shared by all lanes, and the forward's output and log-sum-exp."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v, do = torch.randn_like(k), torch.randn_like(q)
    schedule = ta.topology_schedule(k[:, :1].float(), bs, window=1, sinks=1, topk=S // bs // 8, shared_lane=(0, 0))
    out, lse = ta.scheduled_attention(q, k, v, schedule, return_lse=True)
    return q, k, v, do, schedule, out, lse


def print_case(case: tuple, schedule, res: dict) -> None:
    """One line per case: its shape ``(H, H_kv, D, block size, S)``, the visited fraction of the causal blocks and
    the results (floats to three decimals)."""
    H, Hkv, D, bs, S = case
    n = S // bs
    visited = schedule.nnz / (n * (n + 1) / 2)
    print(f"== H{H}/{Hkv} D{D} b{bs} S{S} visited {visited:.2f}: " + ", ".join(
        f"{key}={value:.3f}" if isinstance(value, float) else f"{key}={value}" for key, value in res.items()),
        flush=True)


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    default_config = hb.dkdv_tile_config
    for H, Hkv, D, bs, S in CASES:
        q, k, v, do, schedule, out, lse = case_inputs(H, Hkv, D, bs, S)
        scale = D ** -0.5
        res = {}
        other = "hopper_c2" if bs >= 128 and D == 128 else "hopper_c1"  # the form the default does not take
        for name in ("portable", "hopper", other, "hopper_pipelined", "hopper_plain"):
            kernel = "portable" if name == "portable" else "hopper"
            if name.startswith("hopper_c"):  # the launcher reads the module's configuration
                hb.dkdv_tile_config = lambda b, d, c=None, p=None, forced=int(name[-1]): default_config(b, d, forced)
            if name in ("hopper_pipelined", "hopper_plain"):
                hb.dkdv_tile_config = lambda b, d, c=None, p=None, on=name.endswith("pipelined"): default_config(
                    b, d, c, on)
            try:
                def dkdv():
                    return bw.scheduled_attention_backward(do, q, k, v, out, lse, schedule, scale,
                                                           needs=(False, True, True), dkdv_kernel=kernel)

                def whole():
                    return bw.scheduled_attention_backward(do, q, k, v, out, lse, schedule, scale, dkdv_kernel=kernel)

                grads = dkdv()
                res[name] = do_bench(dkdv, warmup=5, rep=40)
                res[name + "_full"] = do_bench(whole, warmup=5, rep=40)
                if kernel != "portable":
                    ref = bw.scheduled_attention_backward(do, q, k, v, out, lse, schedule, scale,
                                                          needs=(False, True, True), dkdv_kernel="portable")
                    res[name + "_rel_err"] = max(float((x.float() - y.float()).abs().max() / y.float().abs().max())
                                                 for x, y in zip(grads[1:], ref[1:]))
            except Exception as error:  # noqa: BLE001 - a benchmark row says what failed
                res[name] = f"FAILED {type(error).__name__}: {str(error)[:200]}"
            hb.dkdv_tile_config = default_config
        print_case((H, Hkv, D, bs, S), schedule, res)


if __name__ == "__main__":
    main()
