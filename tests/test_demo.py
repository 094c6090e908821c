"""The demo, ``python -m topo_attn.demo``, runs and checks itself."""

from __future__ import annotations

import subprocess
import sys


def test_demo_runs_and_matches_reference():
    result = subprocess.run([sys.executable, "-m", "topo_attn.demo", "--seq-len", "300", "--block-size", "32",
                             "--topk", "2"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "causal blocks scheduled" in result.stdout
    assert "vs float64 reference" in result.stdout and result.stdout.rstrip().endswith("OK")
