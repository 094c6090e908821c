"""Helpers shared by the tests (importable as ``helpers``: ``tests/`` is on pytest's path).

Kernel tests: random inputs, random valid schedules and the per-dtype error bound.

Topology tests: slow, obviously-correct references for #22's elder-rule salience and its schedule loop.
Both are written straight from the rules, with no cleverness, so the package's fast versions (a minimum
spanning tree by Prim, a vectorised schedule) can be checked against them. The distances come from
``topo_attn.centroid_distances`` (the package's one distance function), so a comparison tests the
algorithm and not float rounding.
"""

from __future__ import annotations

import os

import numpy as np
import torch

import topo_attn as ta

DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
"""Where kernel tests put their tensors: CUDA with the compiled kernel, else the CPU (Triton's interpreter;
tests/conftest.py sets ``TRITON_INTERPRET=1`` before this module is imported when no GPU is present)."""

# Error bound per dtype: a few units of the dtype's rounding (output and P are rounded to it), fp32 tight.
TOLERANCE = {torch.float32: 2e-5, torch.float16: 4 * 2.0**-10, torch.bfloat16: 4 * 2.0**-7}


def reference_grads(q, k, v, schedule, d_out, scale=None):
    """Output and (dq, dk, dv) through torch autograd and the float64 ``dense_masked_attention`` (inputs rounded
    to their dtype first, so only a kernel's own rounding counts)."""
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out = ta.dense_masked_attention(*leaves, schedule, scale=scale)
    out.backward(d_out.double())
    return out.detach(), [t.grad for t in leaves]


def inputs(shape_q, shape_kv, dtype, device, seed):
    """Fresh random ``q, k, v`` (``torch.randn``, drawn on the CPU so every device sees the same values)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(shape_q, generator=gen).to(device, dtype)
    k = torch.randn(shape_kv, generator=gen).to(device, dtype)
    v = torch.randn(shape_kv, generator=gen).to(device, dtype)
    return q, k, v


def random_schedule(gen: torch.Generator, seq_len: int, block_size: int, lanes=None, density: float = 0.4,
                    diagonal: bool | None = None, device="cpu", q_len: int | None = None) -> ta.BlockSchedule:
    """A random valid schedule: random causal blocks, at least one per row; the diagonal is present in some
    rows and absent in others unless ``diagonal`` says otherwise. ``q_len``: the rows of the last ``q_len``
    queries of ``seq_len`` keys (default: all)."""
    n = ta.num_blocks(seq_len, block_size)
    first = (seq_len - (q_len or seq_len)) // block_size
    rows = n - first
    shape = (rows, n) if lanes is None else (*lanes, rows, n)
    causal = torch.ones(rows, n, dtype=torch.bool).tril(first)
    mask = (torch.rand(shape, generator=gen) < density) & causal
    eye = torch.zeros(rows, n, dtype=torch.bool)
    eye[torch.arange(rows), first + torch.arange(rows)] = True
    if diagonal is True:
        mask |= eye
    elif diagonal is False:
        mask &= ~eye
        if first == 0:
            mask[..., 0, 0] = True  # row 0 can only hold block 0
    empty = ~mask.any(-1)  # rows left empty get one random causal block
    pick = (torch.rand(shape[:-1], generator=gen) * (first + torch.arange(rows) + 1)).long()
    mask |= empty[..., None] & (torch.arange(n) == pick[..., None])
    return ta.BlockSchedule.from_block_mask(mask, block_size, seq_len, q_len=q_len).to(device)


def padded_copy(schedule: ta.BlockSchedule, extra: int, seed: int = 0) -> ta.BlockSchedule:
    """The same schedule as the kit's GPU builders give it without reading the entry count back
    (:attr:`~topo_attn.BlockSchedule.padded`): its entries followed by ``extra`` unused ones, random values out
    of range too, as an uninitialised buffer holds."""
    gen = torch.Generator().manual_seed(seed)
    junk = torch.randint(-2**31, 2**31 - 1, (extra,), generator=gen, dtype=torch.int64).to(torch.int32)
    return ta.BlockSchedule.unchecked(schedule.offsets, torch.cat([schedule.indices, junk.to(schedule.device)]),
                                      schedule.block_size, schedule.seq_len, schedule.lanes, schedule.transposed,
                                      schedule.q_len, padded=True)


def all_pairs_salience(dist: np.ndarray) -> np.ndarray:
    """#22's elder-rule salience from a symmetric distance matrix ``[n, n]``.

    All pairs ``(d, i, j)`` with ``i < j`` are sorted by ``(d, i, j)``. Union-find with member sets: when an
    edge joins two components, every block of the smaller one (equal sizes: the one holding ``i``) gets
    salience ``d``, overwriting earlier values; then they merge. Never written: 0. One block: 1."""
    n = dist.shape[0]
    if n == 1:
        return np.ones(1)
    pairs = [(float(dist[i, j]), i, j) for i in range(n) for j in range(i + 1, n)]
    pairs.sort()
    salience = [0.0] * n
    owner = list(range(n))  # owner[b]: id of the component holding block b
    members = {b: {b} for b in range(n)}  # component id -> its blocks
    for d, i, j in pairs:
        ci, cj = owner[i], owner[j]
        if ci == cj:
            continue
        if len(members[ci]) <= len(members[cj]):
            small, large = ci, cj
        else:
            small, large = cj, ci
        for b in members[small]:
            salience[b] = d
            owner[b] = large
        members[large] |= members.pop(small)
    return np.array(salience, dtype=np.float64)


def kruskal_merges(dist: np.ndarray) -> list[tuple[int, int, float]]:
    """The edges ``(i, j, d)`` along which Kruskal over all pairs sorted by ``(d, i, j)`` merges two
    components, in merge order (plain union-find with member sets)."""
    n = dist.shape[0]
    pairs = sorted((float(dist[i, j]), i, j) for i in range(n) for j in range(i + 1, n))
    owner = list(range(n))
    members = {b: {b} for b in range(n)}
    merges = []
    for d, i, j in pairs:
        ci, cj = owner[i], owner[j]
        if ci == cj:
            continue
        merges.append((i, j, d))
        for b in members[cj]:
            owner[b] = ci
        members[ci] |= members.pop(cj)
    return merges


def _top_blocks(salience: list[float], topk: int) -> list[int]:
    """The ``topk`` most salient blocks; ties go to the lower block index."""
    ranked = sorted(range(len(salience)), key=lambda b: (-salience[b], b))
    return ranked[:topk]


def loop_schedule(salience_1d: np.ndarray, nb: int, window: int, sinks: int,
                  topk: int) -> tuple[list[int], list[int]]:
    """#22's per-row loop: for each query block ``qb``, the set of sinks ``0..sinks-1``, the window
    ``max(0, qb-window)..qb`` and the global top-k salient blocks that are ``<= qb``, sorted.

    Returns CSR ``(offsets, indices)`` as plain lists."""
    salience = [float(s) for s in salience_1d]
    assert len(salience) == nb
    top = _top_blocks(salience, topk)
    offsets, indices = [0], []
    for qb in range(nb):
        chosen: set[int] = set()
        for s in range(sinks):
            if s <= qb:
                chosen.add(s)
        for k in range(max(0, qb - window), qb + 1):
            chosen.add(k)
        for b in top:
            if b <= qb:
                chosen.add(b)
        row = sorted(chosen)
        indices.extend(row)
        offsets.append(len(indices))
    return offsets, indices


def garbage_static_cache(batch: int, kv_heads: int, max_len: int, dim: int,
                         seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(buffer, keys)``: a static key cache ``[B, H_kv, S_max, D]`` full of garbage (NaN and huge values) and
    the real keys to write into it."""
    gen = torch.Generator().manual_seed(seed)
    buffer = 1e30 * torch.randn(batch, kv_heads, max_len, dim, generator=gen)
    buffer[..., ::3, :] = float("nan")
    return buffer, torch.randn(batch, kv_heads, max_len, dim, generator=gen)


def write_static_keys(buffer: torch.Tensor, keys: torch.Tensor, stats, start: int, q_len: int) -> int:
    """Write keys ``start .. start + q_len - 1`` into the static cache ``buffer`` and update ``stats`` (a
    ``StaticBlockStats``) as a step would; returns the new length."""
    buffer[..., start:start + q_len, :] = keys[..., start:start + q_len, :]
    stats.update(buffer, torch.tensor([start], device=buffer.device), q_len)
    return start + q_len


def write_in_steps(buffer: torch.Tensor, keys: torch.Tensor, stats, prefill: int, chunk: int, last: int,
                   check) -> None:
    """Fill the static cache ``buffer`` with ``keys`` as a generation would (:func:`write_static_keys`): a
    prefill of ``prefill`` keys, a chunk of ``chunk``, one key per step, then the last ``last`` at once;
    ``check(stats, keys, length)`` after each write."""
    max_len = buffer.shape[2]
    length = write_static_keys(buffer, keys, stats, 0, prefill)
    check(stats, keys, length)
    length = write_static_keys(buffer, keys, stats, length, chunk)
    check(stats, keys, length)
    while length < max_len - last:
        length = write_static_keys(buffer, keys, stats, length, 1)
        check(stats, keys, length)
    assert write_static_keys(buffer, keys, stats, length, last) == max_len
    check(stats, keys, max_len)


def _identifier(rng: np.random.Generator) -> str:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return "".join(rng.choice(letters, int(rng.integers(3, 10))))


def write_corpus(root, count: int, seed: int = 0, folder: str = "pkg", folders: int = 5) -> None:
    """``count`` Python-like files (functions and assignments with random identifiers) in ``folders`` folders
    ``<folder>0``, ``<folder>1``, ... (file ``i`` in ``<folder><i % folders>/mod_<i>.py``)."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        lines = [f'"""Module {i}."""', "import os", ""]
        for _ in range(int(rng.integers(2, 6))):
            name, arg = _identifier(rng), _identifier(rng)
            lines += [f"def {name}({arg}):", f"    {_identifier(rng)} = {arg} + {int(rng.integers(1000))}",
                      f"    return {_identifier(rng)}({arg})", ""]
        path = root / f"{folder}{i % folders}" / f"mod_{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines))


def write_train_corpus(base) -> list:
    """The corpus roots of the training tests: :func:`write_corpus`'s 300 files under a ``stdlib`` root
    (``base/lib``) and 400 more (seed 1) in one package ``site0`` of a ``site-packages`` root (``base/site``), so
    that ``train`` can build its per-file evaluation set of two documents of 256 bytes (one of the standard
    library, one of the package)."""
    write_corpus(base / "lib", 300)
    write_corpus(base / "site", 400, seed=1, folder="site", folders=1)
    return [("stdlib", (base / "lib").resolve()), ("site-packages", (base / "site").resolve())]


def save_tiny_lm(folder, documents: int, length: int, positions: int = 512):
    """A tiny byte-level Llama (2 layers, hidden 64, 4 query / 2 key-value heads of 16, random weights of
    initializer range 0.1, seed 0) and ``documents`` held-out documents of ``length`` printable bytes, saved
    into ``folder`` as ``python -m topo_attn.lm train`` writes them; returns ``folder``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=positions,
                         initializer_range=0.1, attn_implementation="sdpa")
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    rng = np.random.default_rng(0)
    np.savez(folder / "eval_set.npz",
             documents=rng.integers(ord("("), ord("~"), (documents, length)).astype(np.uint8))
    return folder
