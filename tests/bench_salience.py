"""Benchmark: ``topo_attn.block_salience`` (minimum spanning tree by Prim) against the slow all-pairs
elder-rule reference, on the CPU. Both timings include the distance computation (the reference gets its
distances from ``topo_attn.centroid_distances``). Not a pytest module; run it as

    python tests/bench_salience.py [--n 1024] [--dim 128] [--repeats 5]

It prints the median times and the speed-up and writes data/benchmarks/salience_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import topo_attn  # noqa: E402
from helpers import all_pairs_salience  # noqa: E402
from topo_attn.provenance import cpu_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "data" / "benchmarks" / "salience_cpu.json"
TARGET_SPEEDUP = 25.0


def usable_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def time_it(fn, repeats: int) -> tuple[list[float], object]:
    """Wall times (s) of ``repeats`` calls of ``fn`` and the last result."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1024, help="number of centroids (key blocks)")
    parser.add_argument("--dim", type=int, default=128, help="centroid dimension")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each (median reported)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT, help="where to write the JSON")
    args = parser.parse_args()

    gen = torch.Generator().manual_seed(args.seed)
    centroids = torch.randn(args.n, args.dim, generator=gen, dtype=torch.float64)

    def fast() -> np.ndarray:
        return topo_attn.block_salience(centroids).numpy()

    def reference() -> np.ndarray:
        return all_pairs_salience(topo_attn.centroid_distances(centroids))

    fast()  # warm-up (first-call overheads)
    fast_times, fast_result = time_it(fast, args.repeats)
    ref_times, ref_result = time_it(reference, args.repeats)
    matched = bool(np.array_equal(fast_result, ref_result))
    fast_median, ref_median = statistics.median(fast_times), statistics.median(ref_times)
    speedup = ref_median / fast_median

    print(f"n={args.n} dim={args.dim} repeats={args.repeats} on {cpu_model()} ({usable_cores()} cores)")
    print(f"block_salience (MST):   median {fast_median * 1e3:9.2f} ms")
    print(f"all_pairs_salience:     median {ref_median * 1e3:9.2f} ms")
    print(f"speed-up: {speedup:.1f}x (target >= {TARGET_SPEEDUP:.0f}x: "
          f"{'met' if speedup >= TARGET_SPEEDUP else 'NOT met'}); results identical: {matched}")

    record = {
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "topo_attn": topo_attn.__version__,
        "cpu_model": cpu_model(),
        "cpu_cores": usable_cores(),
        "cpu_count_total": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "n": args.n,
        "dim": args.dim,
        "dtype": "float64",
        "seed": args.seed,
        "repeats": args.repeats,
        "timing_includes_distances": True,
        "block_salience_median_s": fast_median,
        "all_pairs_salience_median_s": ref_median,
        "block_salience_times_s": fast_times,
        "all_pairs_salience_times_s": ref_times,
        "speedup": speedup,
        "target_speedup": TARGET_SPEEDUP,
        "target_met": speedup >= TARGET_SPEEDUP,
        "results_match": matched,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if matched else 1


if __name__ == "__main__":
    sys.exit(main())
