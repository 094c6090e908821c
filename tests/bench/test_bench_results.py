"""Reading kernel benchmark results (topo_attn.bench.results) from JSON files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topo_attn.bench import results as bench_results

ROW = dict(case="S1024", seq_len=1024, ours_ms=0.011, sdpa_ms=0.016, flex_ms=float("nan"), limit_ms=0.0065,
           ours_tflops=4.7, sdpa_tflops=8.2, flex_tflops=float("nan"), scheduled_blocks=59, causal_blocks=136,
           cfg_heads=1)
HEADER = dict(suite="pr", gpu="NVIDIA H200", torch="2.11.0+cu130", triton="3.6.0",
              command="python -m topo_attn.bench --suite pr")


def write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_loads_kernel_results_and_skips_other_files(tmp_path):
    write(tmp_path / "b.json", {**HEADER, "rows": [ROW, {**ROW, "case": "S2048", "seq_len": 2048}]})
    write(tmp_path / "salience_cpu.json", {"command": "python tests/bench_salience.py", "speedup": 18.5,
                                           "times": [1, 2]})
    found = bench_results.load_kernel_benchmarks(tmp_path)
    assert len(found) == 1
    bench = found[0]
    assert (bench.suite, bench.gpu, bench.torch, bench.triton) == ("pr", "NVIDIA H200", "2.11.0+cu130", "3.6.0")
    assert "NVIDIA H200" in bench.describe() and "2.11.0+cu130" in bench.describe() and "3.6.0" in bench.describe()
    table = bench.table()
    assert list(table.index) == ["S1024", "S2048"]
    assert list(table.columns[:8]) == list(bench_results.ROW_KEYS[1:])
    assert "scheduled_blocks" in table.columns and "cfg_heads" not in table.columns
    assert "cfg_heads" in bench.table(all_columns=True).columns
    summary = bench_results.summary(found, tmp_path)
    assert "1 file" in summary and "NVIDIA H200" in summary
    other = bench_results.other_results_table(tmp_path)
    assert list(other.columns) == ["salience_cpu.json"] and "speedup" in other.index and "times" not in other.index


def test_no_results_is_said_plainly(tmp_path):
    write(tmp_path / "salience_cpu.json", {"command": "x"})
    assert bench_results.load_kernel_benchmarks(tmp_path) == []
    summary = bench_results.summary([], tmp_path)
    assert summary.startswith("**No kernel benchmark results yet.**") and str(tmp_path) in summary



def test_a_missing_results_folder_is_named(tmp_path):
    for load in (bench_results.load_kernel_benchmarks, bench_results.other_results_table):
        with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'missing'} does not exist"):
            load(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="missing does not exist"):
        bench_results.load_suite("build", tmp_path / "missing")


def test_results_dir_is_the_repository_data_benchmarks():
    root = Path(__file__).resolve().parents[2]
    assert bench_results.ROOT == root and bench_results.RESULTS_DIR == root / "data" / "benchmarks"
    assert {"pr", "llm"} <= {b.suite for b in bench_results.load_kernel_benchmarks()}


@pytest.mark.parametrize("data, match", [
    ({"rows": [ROW]}, "lacks \\['suite', 'gpu'"),
    ({**HEADER, "rows": {"a": 1}}, "must be a list"),
    ({**HEADER, "rows": [{k: v for k, v in ROW.items() if k != "limit_ms"}]}, "row 0 lacks \\['limit_ms'\\]"),
])
def test_malformed_results_raise(tmp_path, data, match):
    write(tmp_path / "bad.json", data)
    with pytest.raises(ValueError, match=match):
        bench_results.load_kernel_benchmarks(tmp_path)


def test_no_measuring_without_a_gpu_or_when_off():
    import torch

    message, measured = bench_results.run_small_benchmark(["--suite", "pr"], run=False)
    assert measured == [] and "Not measuring" in message
    if not torch.cuda.is_available():
        message, measured = bench_results.run_small_benchmark(["--suite", "pr"])
        assert measured == [] and "No CUDA GPU" in message


def test_other_suites_are_read_by_load_suite(tmp_path):
    """Files of the build / train / select suites have rows of their own shape: the kernel loader skips
    them and load_suite reads them, with their GPU, versions and command."""
    write(tmp_path / "a.json", {**HEADER, "rows": [ROW]})
    write(tmp_path / "build_h200.json", {**HEADER, "suite": "build", "command": "python -m topo_attn.bench --suite build",
                                         "rows": [{"case": "x", "shared_build_ms": 1.0}, {"case": "y", "shared_build_ms": 2.0}]})
    assert [b.suite for b in bench_results.load_kernel_benchmarks(tmp_path)] == ["pr"]
    (header, frame), = bench_results.load_suite("build", tmp_path)
    assert header["gpu"] == "NVIDIA H200" and header["command"].endswith("--suite build")
    assert header["path"] == "build_h200.json" and list(frame["shared_build_ms"]) == [1.0, 2.0]
    assert header["note"] is None
    assert bench_results.load_suite("train", tmp_path) == []
    write(tmp_path / "train_h200.json", {**HEADER, "suite": "train", "note": "flex failed on b64",
                                         "rows": [{"case": "x", "ours_bwd_ms": 3.0}]})
    (header, frame), = bench_results.load_suite("train", tmp_path)
    assert header["note"] == "flex failed on b64" and list(frame["ours_bwd_ms"]) == [3.0]
