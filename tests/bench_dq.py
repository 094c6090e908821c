"""Benchmark (not a test): the Gluon Hopper dQ kernel against the portable one, on the cases of
``tests/bench_dkdv.py`` (#22's rule at n/8: window 1, one sink, a shared schedule from ``topology_schedule``; bf16,
B 1). Per case it times with ``triton.testing.do_bench`` (warm-up 5, 40 ms): the preprocess plus dQ alone
(``needs=(True, False, False)``) with ``dq_kernel="portable"``, ``"hopper"`` (its default configuration) and the other
consumer form, and the whole backward with both kernels portable, with the Gluon dK/dV only, and with both Gluon
kernels; and the largest difference of dQ from the portable kernel's, relative to the portable's largest entry.
Prints one line per case. ``python tests/bench_dq.py`` on a Hopper GPU with triton 3.6.
"""

import torch
import triton
from triton.testing import do_bench

import topo_attn.attention.backward as bw
import topo_attn.attention.hopper_dq as hd
from bench_dkdv import case_inputs, print_case  # tests/, the script's folder

CASES = [(32, 32, 128, 128, 16384), (32, 32, 128, 64, 16384), (32, 8, 128, 128, 16384), (32, 32, 64, 64, 16384),
         (32, 8, 64, 64, 32768), (32, 8, 64, 128, 32768)]  # H, H_kv, D, block size, S
WHOLE = {"whole_portable": ("portable", "portable"), "whole_gluon_dkdv": ("portable", "hopper"),
         "whole_gluon": ("hopper", "hopper")}  # name: (dq_kernel, dkdv_kernel)


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    default_config = hd.dq_tile_config
    for H, Hkv, D, bs, S in CASES:
        q, k, v, do, schedule, out, lse = case_inputs(H, Hkv, D, bs, S)
        scale = D ** -0.5

        def dq_only(kernel):
            return bw.scheduled_attention_backward(do, q, k, v, out, lse, schedule, scale, needs=(True, False, False),
                                                   dq_kernel=kernel)[0]

        res = {}
        reference = dq_only("portable")
        other = "hopper_c1" if bs >= 128 else None  # the form the default does not take
        for name in ("portable", "hopper", other):
            if name is None:
                continue
            kernel = "portable" if name == "portable" else "hopper"
            if name.startswith("hopper_c"):  # the launcher reads the module's configuration
                hd.dq_tile_config = lambda b, d, c=None, forced=int(name[-1]): default_config(b, d, forced)
            try:
                grad = dq_only(kernel)
                res[name] = do_bench(lambda: dq_only(kernel), warmup=5, rep=40)
                if kernel != "portable":
                    res[name + "_rel_err"] = float((grad.float() - reference.float()).abs().max()
                                                   / reference.float().abs().max())
            except Exception as error:  # noqa: BLE001 - a benchmark row says what failed
                res[name] = f"FAILED {type(error).__name__}: {str(error)[:200]}"
            hd.dq_tile_config = default_config
        for name, (dq_kernel, dkdv_kernel) in WHOLE.items():
            try:
                res[name] = do_bench(lambda: bw.scheduled_attention_backward(
                    do, q, k, v, out, lse, schedule, scale, dq_kernel=dq_kernel, dkdv_kernel=dkdv_kernel),
                    warmup=5, rep=40)
            except Exception as error:  # noqa: BLE001
                res[name] = f"FAILED {type(error).__name__}: {str(error)[:200]}"
        print_case((H, Hkv, D, bs, S), schedule, res)


if __name__ == "__main__":
    main()
