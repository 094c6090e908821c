"""The static-cache decode step (``topo_attn.attention.static_decode``) against a float64 masked softmax: dense
and block-table modes (shared, per key/value head, per query head), lengths at and between block boundaries,
garbage past the length, both merge modes (``"kernel"``: one launch, the last split of each tile merges;
``"separate"``: a second launch merges), the split counters left at zero by every call, argument checks
before any launch, and ``torch.compile`` through the custom op without a recompile for a new length value.

On the CPU the kernels run in Triton's interpreter, so the shapes stay small, and the interpreter runs the
programs one after another: a program's partials are always complete before the next one counts, so only a
GPU exercises the concurrency of the in-kernel merge (the ``cuda`` tests, skipped here). What the CPU can
check of the semaphore, ``test_any_program_order_gives_the_reference`` checks by shuffling the order the
interpreter runs the programs in: exactly one program per tile merges, the last to count, whichever split
it is. (The barriers around the count are no-ops in the interpreter.)"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch._subclasses.fake_tensor import FakeTensorMode

import topo_attn.attention.static_decode as sd
from helpers import TOLERANCE, inputs  # in tests/
from topo_attn.launch import INTERPRETED
from topo_attn.attention.static_decode import static_decode

MERGES = ["kernel", "separate"]


def reference(q, k_cache, v_cache, n, block_table=None, block_size=64, scale=None) -> torch.Tensor:
    """Float64 masked softmax over the first ``n`` keys only (what lies past them never enters): query ``i`` at
    position ``n - L + i`` sees key ``j <= n - L + i`` whose block is in its head's table row (any block when
    dense); a query that sees nothing gives zeros."""
    B, H, L, D = q.shape
    group = H // k_cache.shape[1]
    k = k_cache[:, :, :n].double().repeat_interleave(group, dim=1)
    v = v_cache[:, :, :n].double().repeat_interleave(group, dim=1)
    keys = torch.arange(n)
    mask = (keys[None, :] <= n - L + torch.arange(L)[:, None]).expand(B, H, L, n)
    if block_table is not None:
        rows = block_table.cpu().long()[:, torch.arange(H) * block_table.shape[1] // H]  # [B, H, W]
        listed = (rows[..., :, None] == (keys // block_size)).any(-2)  # [B, H, n]
        mask = mask & listed[:, :, None, :]
    scale = D ** -0.5 if scale is None else scale
    scores = (q.double().cpu() @ k.cpu().transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v.cpu()
    return torch.where(mask.any(-1, keepdim=True), out, 0.0)


def random_table(gen: torch.Generator, rows: tuple[int, int], width: int, num_blocks: int,
                 diagonal: int | None = None) -> torch.Tensor:
    """An int32 table ``[B, G, width]``: each row lists 1 .. width distinct random blocks of ``0 .. num_blocks``
    in random order at random slots, ``-1`` elsewhere; block ``diagonal`` is in the even rows and not in the
    odd ones."""
    table = torch.full((*rows, width), -1, dtype=torch.int32)
    for r, row in enumerate(table.view(-1, width)):
        blocks = torch.randperm(num_blocks, generator=gen)
        if diagonal is not None:
            others = blocks[blocks != diagonal]
            blocks = torch.cat([torch.tensor([diagonal]), others]) if r % 2 == 0 else others
        count = 1 + int(torch.randint(min(width, len(blocks)), (1,), generator=gen))
        picked = blocks[:count] if diagonal is None or r % 2 else blocks[torch.randperm(count, generator=gen)]
        row[torch.randperm(width, generator=gen)[:count]] = picked.int()
    return table


def check(out, q, ref):
    assert out.dtype == q.dtype and out.shape == q.shape and out.is_contiguous()
    assert torch.isfinite(out).all()
    tol = TOLERANCE[q.dtype]
    torch.testing.assert_close(out.double().cpu(), ref, atol=tol, rtol=tol)


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list:
    """Record every kernel launch of the op (kernel name, grid, non-tensor arguments, compile-time ones), then
    launch it."""
    seen, real = [], sd.launch

    def recording(kernel, grid, args, meta):
        scalars = tuple(a for a in args if not isinstance(a, torch.Tensor))
        seen.append((kernel.fn.__name__ if hasattr(kernel, "fn") else str(kernel), grid, scalars, tuple(meta.items())))
        real(kernel, grid, args, meta)
    monkeypatch.setattr(sd, "launch", recording)
    return seen


def counters(device, tiles: int) -> torch.Tensor:
    """The split counters of ``merge="kernel"`` for ``tiles`` tiles on ``device`` (they must exist)."""
    found = [c for (where, count), c in sd.COUNTERS.items() if where.type == torch.device(device).type
             and count == tiles]
    assert len(found) == 1, f"split counters for {tiles} tiles on {device}: {len(found)} sets"
    return found[0]


# ------------------------------------------------------------------------------------------ dense cache
DENSE = [
    # B, H, H_kv, S_max, L, D, block_size, dtype, lengths        (what the lengths hit)
    (1, 2, 1, 200, 1, 32, 32, torch.float32, (1, 45, 64, 200)),  # 1 key, partial, a boundary, the full cache
    (2, 4, 2, 160, 3, 16, 32, torch.float16, (3, 66, 96, 160)),  # 66: queries 63 | 64 65 straddle a boundary
    (1, 4, 1, 97, 16, 64, 16, torch.bfloat16, (16, 40, 97)),     # L = 16; S_max not a multiple of the block
]


@pytest.mark.parametrize("merge", MERGES)
@pytest.mark.parametrize("case", DENSE, ids=lambda c: f"B{c[0]}-H{c[1]}-Hkv{c[2]}-S{c[3]}-L{c[4]}-{c[7]}")
def test_dense_matches_reference(case, merge, device, launches):
    """Every length, from one key to the full cache, on fresh inputs; the host splits each lane in more chunks
    than the short lengths have blocks (empty chunks); every launch is the same at every length: one (the
    split kernel, merging) per call with ``merge="kernel"``, two with ``"separate"``."""
    B, H, H_kv, S_max, L, D, block_size, dtype, lengths = case
    for n in lengths:
        q, k, v = inputs((B, H, L, D), (B, H_kv, S_max, D), dtype, device, seed=n)
        out = static_decode(q, k, v, torch.tensor([n], device=device), block_size=block_size, merge=merge)
        check(out, q, reference(q, k, v, n, block_size=block_size))
    split = launches[0][1][0]
    assert split > 1 and split > -(-min(lengths) // block_size)
    per_call = 1 if merge == "kernel" else 2
    assert len(launches) == per_call * len(lengths)
    assert all(entry == launches[i % per_call] for i, entry in enumerate(launches))
    assert ("WRITE", "merged" if merge == "kernel" else "partials") in launches[0][3]


# ------------------------------------------------------------------------------------------ block tables
TABLES = [
    # B, H, H_kv, G, S_max, L, D, block_size, dtype, lengths
    (2, 2, 2, 1, 256, 1, 32, 32, torch.float32, (77, 256)),      # one row per batch, shared by every head
    (1, 4, 2, 2, 256, 3, 32, 32, torch.bfloat16, (130, 96)),     # per kv head (GQA packing); 130: 127 | 128 129
    (2, 4, 2, 4, 200, 3, 16, 16, torch.float16, (50, 200)),      # per query head: rows differ inside a group
    (1, 4, 1, 1, 192, 16, 64, 64, torch.float32, (100, 150)),    # L = 16, shared by four heads of one kv head
]


@pytest.mark.parametrize("merge", MERGES)
@pytest.mark.parametrize("case", TABLES, ids=lambda c: f"B{c[0]}-H{c[1]}-Hkv{c[2]}-G{c[3]}-L{c[5]}-{c[8]}")
def test_table_matches_reference(case, merge, device):
    """Random rows: blocks in any order, ``-1`` slots anywhere, blocks past the length (ignored), the partly
    valid diagonal block in half of the rows."""
    B, H, H_kv, G, S_max, L, D, block_size, dtype, lengths = case
    num_blocks = -(-S_max // block_size)
    past = []
    for n in lengths:
        gen = torch.Generator().manual_seed(n)
        table = random_table(gen, (B, G), num_blocks + 2, num_blocks, diagonal=(n - 1) // block_size)
        past.append(bool((table >= -(-n // block_size)).any()))
        q, k, v = inputs((B, H, L, D), (B, H_kv, S_max, D), dtype, device, seed=n + 1)
        out = static_decode(q, k, v, torch.tensor(n, device=device), table.to(device), block_size=block_size,
                            merge=merge)
        check(out, q, reference(q, k, v, n, table, block_size))
    assert any(past), "some entry should lie past the length"


def test_rows_are_per_lane(device):
    """Each head reads its own row (G = H) and each kv head's rows serve its query heads (G = H_kv): the same
    rows read in another order (swapped heads) give a different answer."""
    B, H, H_kv, S_max, L, D, block_size = 1, 4, 2, 128, 1, 16, 16
    q, k, v = inputs((B, H, L, D), (B, H_kv, S_max, D), torch.float32, device, seed=4)
    length = torch.tensor(128, device=device)
    for G in (H_kv, H):
        table = random_table(torch.Generator().manual_seed(G), (B, G), 4, 8)
        out = static_decode(q, k, v, length, table.to(device), block_size=block_size)
        check(out, q, reference(q, k, v, 128, table, block_size))
        swapped = static_decode(q, k, v, length, table.flip(1).to(device), block_size=block_size)
        assert not torch.allclose(swapped, out, atol=1e-3)


@pytest.mark.parametrize("merge", MERGES)
def test_empty_row_gives_zeros(merge, device):
    """A row of ``-1`` only, or of blocks all past the length (inside the cache, past its end): its queries see
    nothing and get zeros, never NaN. The other lane's row holds the largest int32 beside valid blocks: it is
    skipped (its key position would overflow int32 and wrap to real keys)."""
    B, H, H_kv, S_max, L, D, block_size = 1, 2, 2, 96, 3, 16, 16
    q, k, v = inputs((B, H, L, D), (B, H_kv, S_max, D), torch.float16, device, seed=9)
    for row in ([-1, -1, -1], [4, 9, 5]):  # blocks 64.., 144.., 80.. past the length 40
        table = torch.tensor([[row, [2, 2**31 - 1, 0]]], dtype=torch.int32)
        out = static_decode(q, k, v, torch.tensor(40, device=device), table.to(device), block_size=block_size,
                            merge=merge)
        assert torch.equal(out[:, 0], torch.zeros_like(out[:, 0]))
        check(out, q, reference(q, k, v, 40, table, block_size))


# ------------------------------------------------------------------------------------------ the contract
@pytest.mark.parametrize("merge", MERGES)
@pytest.mark.parametrize("mode", ["dense", "table"])
def test_garbage_past_length_is_never_read(mode, merge, device):
    """NaN, inf and huge values at every position >= length (and listed blocks past it) leave the output
    unchanged bit for bit."""
    B, H, H_kv, S_max, L, D, block_size, n = 1, 4, 2, 160, 3, 32, 32, 70
    q, k, v = inputs((B, H, L, D), (B, H_kv, S_max, D), torch.bfloat16, device, seed=12)
    table = None if mode == "dense" else torch.tensor([[[4, 2, -1, 0], [3, -1, 1, 2]]], dtype=torch.int32).to(device)
    length = torch.tensor(n, device=device)
    out = static_decode(q, k, v, length, table, block_size=block_size, merge=merge)
    check(out, q, reference(q, k, v, n, table, block_size))
    k2, v2 = k.clone(), v.clone()
    k2[:, :, n:] = float("nan")
    k2[:, 0, n + 5:] = float("inf")
    v2[:, :, n:] = 1e30
    v2[:, 1, n + 3:] = float("nan")
    assert torch.equal(static_decode(q, k2, v2, length, table, block_size=block_size, merge=merge), out)


def test_length_dtypes_and_strides(device):
    """int32 and int64 lengths, a ``[]`` or ``[1]`` one, and caches / queries / tables with any strides give
    one answer."""
    B, H, H_kv, S_max, L, D, block_size, n = 1, 4, 2, 128, 3, 32, 16, 90
    gen = torch.Generator().manual_seed(8)
    q = torch.randn(B, 2 * L, H, D, generator=gen).to(device, torch.float16).transpose(1, 2)[:, :, L:]
    k, v = (torch.randn(B, S_max, H_kv, D, generator=gen).to(device, torch.float16).transpose(1, 2) for _ in range(2))
    table = random_table(gen, (B, 2 * H_kv), 6, 8)
    strided = table.to(device)[:, ::2]
    assert not (q.is_contiguous() or k.is_contiguous() or strided.is_contiguous())
    outs = [static_decode(q, k, v, torch.tensor(length, dtype=dtype, device=device), strided, block_size=block_size)
            for dtype in (torch.int32, torch.int64) for length in (n, [n])]
    check(outs[0], q, reference(q, k, v, n, strided, block_size))
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    dense = static_decode(q, k, v, torch.tensor(n, device=device), block_size=block_size, scale=0.1)
    check(dense, q, reference(q, k, v, n, block_size=block_size, scale=0.1))


@pytest.mark.parametrize("merge", MERGES)
def test_forced_split_counts(merge, device, launches):
    """Any split count is correct in both modes: one chunk (``"kernel"``: the program writes the output, no
    counter), two, three, more chunks than blocks (most empty, their partials weigh nothing)."""
    B, H, H_kv, S_max, L, D, block_size, n = 1, 2, 1, 128, 3, 16, 16, 75
    q, k, v = inputs((B, H, L, D), (B, H_kv, S_max, D), torch.float32, device, seed=2)
    table = random_table(torch.Generator().manual_seed(2), (B, 1), 10, 8, diagonal=4).to(device)
    length = torch.tensor(n, device=device)
    for block_table in (None, table):
        ref = reference(q, k, v, n, block_table, block_size)
        for num_splits in (1, 2, 3, 20):
            launches.clear()
            out = sd.static_decode_forward(q, k, v, length, block_table, block_size, D ** -0.5, num_splits, merge)
            check(out, q, ref)
            if merge == "kernel":
                assert len(launches) == 1 and launches[0][1][0] == num_splits
                assert ("WRITE", "direct" if num_splits == 1 else "merged") in launches[0][3]
            else:
                assert len(launches) == 2 and ("WRITE", "partials") in launches[0][3]
    if merge == "kernel":
        assert (counters(device, 1) == 0).all()


@pytest.mark.parametrize("shape,num_splits,merge_tile", [
    ((1, 2, 2, 1), 5, (1, 4)),   # B, H, H_kv, L: one query per tile; 4 splits per step, the second step part-empty
    ((1, 4, 2, 3), 3, (4, 1)),   # two heads x 3 (+1 padding) queries per tile, merged 4 rows at a time
])
def test_in_kernel_merge_in_steps(shape, num_splits, merge_tile, device, launches, monkeypatch):
    """With a small merge budget (``decode.MERGE_TILE``) the last split merges its tile in several steps: row
    chunks (``MERGE_M``) and split steps (``MERGE_S``) whose last one is partly past ``num_splits``."""
    monkeypatch.setattr(sd.decode, "MERGE_TILE", 64)
    B, H, H_kv, L = shape
    S_max, D, block_size, n = 160, 16, 16, 150
    q, k, v = inputs((B, H, L, D), (B, H_kv, S_max, D), torch.float16, device, seed=num_splits)
    out = sd.static_decode_forward(q, k, v, torch.tensor(n, device=device), None, block_size, D ** -0.5, num_splits)
    check(out, q, reference(q, k, v, n, block_size=block_size))
    meta = dict(launches[0][3])
    assert (meta["MERGE_M"], meta["MERGE_S"]) == merge_tile


@pytest.mark.parametrize("mode", ["dense", "table"])
def test_repeated_calls_reset_the_counters(mode, device):
    """The counters are zero after every call (checked directly), so calls in a row are each right: the same
    call twice (both outputs kept), then five calls with other lengths and inputs, at forced split counts and
    the host's."""
    B, H, H_kv, S_max, L, D, block_size = 1, 4, 2, 160, 2, 16, 16
    table = random_table(torch.Generator().manual_seed(5), (B, H_kv), 12, 10).to(device) if mode == "table" else None
    tiles = B * H_kv  # the GQA pair of heads shares a tile
    for num_splits in (2, 7, None):
        q, k, v = inputs((B, H, L, D), (B, H_kv, S_max, D), torch.bfloat16, device, seed=3)
        first, again = (sd.static_decode_forward(q, k, v, torch.tensor(100, device=device), table, block_size,
                                                 D ** -0.5, num_splits) for _ in range(2))
        ref = reference(q, k, v, 100, table, block_size)
        check(first, q, ref)
        check(again, q, ref)
        assert (counters(device, tiles) == 0).all()
        for n in (37, 160, 2, 64, 121):
            q, k, v = inputs((B, H, L, D), (B, H_kv, S_max, D), torch.bfloat16, device, seed=n)
            out = sd.static_decode_forward(q, k, v, torch.tensor(n, device=device), table, block_size, D ** -0.5,
                                           num_splits)
            check(out, q, reference(q, k, v, n, table, block_size))
            assert (counters(device, tiles) == 0).all()


@pytest.fixture
def shuffled_programs(monkeypatch: pytest.MonkeyPatch) -> list:
    """Make the interpreter run each launch's programs in a seeded random order (it runs them one after
    another, split 0 first). Returns one dict per launch: ``tiles`` (grid axis 1), ``ran``, the ``(split,
    tile)`` programs in the order they ran, and ``merged``, those that called :func:`sd.merge_tile`."""
    if not INTERPRETED:
        pytest.skip("reorders Triton's interpreter")
    from triton.runtime.interpreter import interpreter_builder as builder

    gen, launches = torch.Generator().manual_seed(0), []
    real_dim, real_idx, real_merge = builder.set_grid_dim, builder.set_grid_idx, sd.merge_tile

    def set_grid_dim(nx, ny, nz):
        real_dim(nx, ny, nz)
        launches.append(dict(order=torch.randperm(nx * ny * nz, generator=gen).tolist(), tiles=ny, ran=[], merged=[]))

    def set_grid_idx(x, y, z):
        launch, (_, ny, nz) = launches[-1], builder.grid_dim
        i = launch["order"][(x * ny + y) * nz + z]
        launch["ran"].append((i // (ny * nz), i // nz % ny))
        real_idx(i // (ny * nz), i // nz % ny, i % nz)

    def merge_tile(*args):  # the kernel looks the helper up in the module when the interpreter runs it
        launches[-1]["merged"].append(launches[-1]["ran"][-1])
        return real_merge(*args)
    monkeypatch.setattr(builder, "set_grid_dim", set_grid_dim)
    monkeypatch.setattr(builder, "set_grid_idx", set_grid_idx)
    monkeypatch.setattr(sd, "merge_tile", merge_tile)
    return launches


@pytest.mark.parametrize("mode", ["dense", "table"])
def test_any_program_order_gives_the_reference(mode, device, shuffled_programs):
    """Programs run in a random order (a stand-in for a GPU's): exactly one program per tile merges, the last
    of the tile to run (to count), whichever split it is; the output is the reference's at several split
    counts and lengths, and the counters end at zero. The orders really differ from the chunk order: in some
    launch a tile's split 0 runs last."""
    B, H, H_kv, S_max, L, D, block_size = 2, 2, 2, 128, 3, 16, 16
    table = random_table(torch.Generator().manual_seed(1), (B, H), 9, 8).to(device) if mode == "table" else None
    for num_splits, n in ((2, 128), (3, 50), (5, 99), (8, 17)):
        q, k, v = inputs((B, H, L, D), (B, H_kv, S_max, D), torch.float16, device, seed=num_splits)
        out = sd.static_decode_forward(q, k, v, torch.tensor(n, device=device), table, block_size, D ** -0.5,
                                       num_splits)
        check(out, q, reference(q, k, v, n, table, block_size))
        assert (counters(device, B * H) == 0).all()
    assert len(shuffled_programs) == 4
    for launch in shuffled_programs:
        last = {tile: split for split, tile in launch["ran"]}  # the last program of each tile to run
        assert sorted(launch["merged"], key=lambda p: p[1]) == [(last[t], t) for t in range(launch["tiles"])]
    assert any(split == 0 for launch in shuffled_programs for split, _ in launch["merged"])


# ------------------------------------------------------------------------------------------ argument checks
def valid_args(device: str = "cpu") -> dict:
    q, k, v = inputs((1, 4, 2, 16), (1, 2, 64, 16), torch.float32, device, seed=0)
    table = torch.tensor([[[0, 1, -1], [2, -1, 0]]], dtype=torch.int32, device=device)
    return dict(q=q, k_cache=k, v_cache=v, length=torch.tensor(10, device=device), block_table=table,
                block_size=16, scale=None, merge="kernel")


def _on_device(tensor):
    """``tensor`` moved to the device of the arguments' q (so that its own check, not the device's, fires)."""
    return lambda a: tensor.to(a["q"].device)


def _set(name, value):
    return lambda a: {**a, name: value(a) if callable(value) else value}


BAD = [
    ("q-not-tensor", _set("q", lambda a: a["q"].tolist()), TypeError, "q must be a torch.Tensor"),
    ("q-3d", _set("q", lambda a: a["q"][0]), ValueError, r"q must have shape \[B, H, L, D\]"),
    ("q-float64", _set("q", lambda a: a["q"].double()), TypeError, "q must be float16, bfloat16 or float32"),
    ("q-no-query", _set("q", lambda a: a["q"][:, :, :0]), ValueError, "q must hold 1 to 16 queries"),
    ("q-17-queries", _set("q", lambda a: a["q"][:, :, :1].expand(1, 4, 17, 16)), ValueError, "got 17"),
    ("q-head-dim", _set("q", lambda a: a["q"][..., :8]), ValueError, "head dimension"),
    ("k-dtype", _set("k_cache", lambda a: a["k_cache"].half()), TypeError, "k_cache must have q's dtype"),
    ("v-dtype", _set("v_cache", lambda a: a["v_cache"].bfloat16()), TypeError, "v_cache must have q's dtype"),
    ("k-device", _set("k_cache", lambda a: a["k_cache"].to("meta")), ValueError, "k_cache is on meta"),
    ("v-3d", _set("v_cache", lambda a: a["v_cache"][0]), ValueError, "v_cache must have shape"),
    ("kv-shapes", _set("v_cache", lambda a: a["v_cache"][:, :, :32]), ValueError, "same shape"),
    ("k-batch", lambda a: {**a, "k_cache": a["k_cache"].expand(2, -1, -1, -1),
                           "v_cache": a["v_cache"].expand(2, -1, -1, -1)}, ValueError, "q's B"),
    ("kv-heads", lambda a: {**a, "k_cache": a["k_cache"][:, :1].expand(1, 3, 64, 16),
                            "v_cache": a["v_cache"][:, :1].expand(1, 3, 64, 16)}, ValueError, "multiple"),
    ("cache-short", lambda a: {**a, "k_cache": a["k_cache"][:, :, :1], "v_cache": a["v_cache"][:, :, :1]},
     ValueError, "S_max >= L"),
    ("length-int", _set("length", 10), TypeError, "length must be a torch.Tensor"),
    ("length-float", _set("length", lambda a: a["length"].float()), TypeError, "length must be an int32 or int64"),
    ("length-bool", _set("length", _on_device(torch.tensor(True))), TypeError, "length must be an int32 or int64"),
    ("length-two", _set("length", _on_device(torch.tensor([10, 11]))), ValueError, "length must hold one element"),
    ("length-device", _set("length", lambda a: a["length"].to("meta")), ValueError, "length is on meta"),
    ("block-24", _set("block_size", 24), ValueError, "block_size must be a power of two >= 16, got 24"),
    ("block-8", _set("block_size", 8), ValueError, "block_size must be a power of two >= 16, got 8"),
    ("block-float", _set("block_size", 16.0), TypeError, "block_size must be an int"),
    ("table-list", _set("block_table", [[[0]]]), TypeError, "block_table must be a torch.Tensor"),
    ("table-int64", _set("block_table", lambda a: a["block_table"].long()), TypeError, "block_table must be an int32"),
    ("table-2d", _set("block_table", lambda a: a["block_table"][0]), ValueError, r"block_table must have shape \[B"),
    ("table-groups", _set("block_table", _on_device(torch.zeros(1, 3, 3, dtype=torch.int32))), ValueError, "G in"),
    ("table-batch", _set("block_table", _on_device(torch.zeros(2, 1, 3, dtype=torch.int32))), ValueError, "B = 1"),
    ("table-width-0", _set("block_table", _on_device(torch.zeros(1, 1, 0, dtype=torch.int32))), ValueError, "W >= 1"),
    ("table-device", _set("block_table", lambda a: a["block_table"].to("meta")), ValueError, "block_table is on meta"),
    ("scale-nan", _set("scale", float("nan")), ValueError, "scale must be finite"),
    ("scale-zero", _set("scale", 0.0), ValueError, "scale must be finite and non-zero"),
    ("scale-str", _set("scale", "0.1"), TypeError, "scale must be a float"),
    ("merge-name", _set("merge", "fused"), ValueError, "merge must be 'kernel' or 'separate', got 'fused'"),
    ("merge-case", _set("merge", "Kernel"), ValueError, "merge must be 'kernel' or 'separate', got 'Kernel'"),
    ("merge-none", _set("merge", None), TypeError, r"merge must be a str \('kernel' or 'separate'\), got NoneType"),
]


@pytest.mark.parametrize("mutate,error,message", [pytest.param(*b[1:], id=b[0]) for b in BAD])
def test_bad_arguments_raise_before_any_launch(mutate, error, message, launches, device):
    """Each bad argument raises its error, one line naming it, and nothing was launched; the valid call beside
    it launches (so the check of no launch can fail)."""
    args = valid_args(device)
    with pytest.raises(error, match=message) as info:
        static_decode(**mutate(args))
    assert "\n" not in str(info.value)
    assert launches == []
    static_decode(**args)
    assert len(launches) == 1


def test_values_are_never_read_by_the_checks(device):
    """The checks read metadata only: fake tensors (shapes, no values; reading one raises) pass them, and the
    fake implementation gives the output's shape and dtype."""
    with FakeTensorMode() as mode:
        args = {name: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t
                for name, t in valid_args(device).items()}
        assert sd.check_static_decode(**args) == (16, 0.25)
        out = sd.static_decode_fake(*args.values())
    assert out.shape == args["q"].shape and out.dtype == args["q"].dtype


# ------------------------------------------------------------------------------------------ torch.compile
def decode_step(q, k_cache, v_cache, length, block_table, merge="kernel"):
    return static_decode(q, k_cache, v_cache, length, block_table, block_size=32, merge=merge) * 2


@pytest.mark.parametrize("backend,mode,merge", [
    ("eager", "dense", "kernel"), ("eager", "table", "kernel"), ("aot_eager", "dense", "kernel"),
    ("aot_eager", "table", "kernel"), ("aot_eager", "dense", "separate"),
])
def test_compile_fullgraph_one_graph_for_every_length(backend, mode, merge, device):
    """``torch.compile(fullgraph=True)`` traces through the custom op (no graph break), gives the eager output,
    and a new length value (a new tensor, or the same one refilled in place) compiles nothing new."""
    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend)
    step = torch.compile(decode_step, fullgraph=True, backend=counter)
    q, k, v = inputs((1, 4, 3, 16), (1, 2, 128, 16), torch.float32, device, seed=6)
    table = None if mode == "dense" else torch.tensor([[[3, -1, 0, 1], [2, 0, -1, -1]]], dtype=torch.int32).to(device)
    length = torch.tensor([40], dtype=torch.int32, device=device)
    for n in (40, 97, 128):
        length.fill_(n)
        out = step(q, k, v, length, table, merge)
        torch.testing.assert_close(out, decode_step(q, k, v, length, table, merge), atol=0, rtol=0)
        check(out / 2, q, reference(q, k, v, n, table, 32))
    out = step(q, k, v, torch.tensor([64], dtype=torch.int32, device=device), table, merge)
    check(out / 2, q, reference(q, k, v, 64, table, 32))
    assert counter.frame_count == 1
    assert counter.op_count >= 2  # the op and the product
    torch._dynamo.reset()


def test_custom_op_registered():
    """The op is registered once under its name, with the schema the wrapper calls."""
    op = torch.ops.topo_attn.static_decode.default
    assert "Tensor? block_table" in str(op._schema) and "float scale" in str(op._schema)
    assert 'str merge="kernel"' in str(op._schema)


def test_counters_are_not_made_during_graph_capture(monkeypatch):
    """Making the counters (a zeroing) during CUDA graph capture would capture it instead of running it: the
    first call for a (device, tile count) raises there instead, saying what to do; existing counters serve."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setitem(sd.COUNTERS, (torch.device("cuda", 0), 3), "made before")
    with pytest.raises(RuntimeError, match="call it once with these shapes before capturing"):
        sd.merge_counters(torch.device("cuda", 0), 5)
    assert sd.merge_counters(torch.device("cuda", 0), 3) == "made before"
    assert (torch.device("cuda", 0), 5) not in sd.COUNTERS


# ------------------------------------------------------------------------------------------ CUDA graphs
@pytest.mark.cuda
@pytest.mark.parametrize("merge", MERGES)
@pytest.mark.parametrize("mode", ["dense", "table"])
def test_one_cuda_graph_serves_every_length(mode, merge):
    """Captured once, replayed at several lengths set in place: the reference's answer at each, with no host
    sync in the eager call either."""
    B, H, H_kv, S_max, L, D, block_size = 2, 8, 2, 4096, 1, 128, 64
    q, k, v = inputs((B, H, L, D), (B, H_kv, S_max, D), torch.bfloat16, "cuda", seed=0)
    gen = torch.Generator().manual_seed(0)
    table = None if mode == "dense" else random_table(gen, (B, H_kv), 24, S_max // block_size).cuda()
    length = torch.tensor(1000, device="cuda")
    static_decode(q, k, v, length, table, block_size=block_size, merge=merge)  # compile outside the checks
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        static_decode(q, k, v, length, table, block_size=block_size, merge=merge)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = static_decode(q, k, v, length, table, block_size=block_size, merge=merge)
    for n in (1, 64, 1000, 4000, S_max, 1000):
        length.fill_(n)
        graph.replay()
        torch.cuda.synchronize()
        check(out, q, reference(q, k, v, n, table, block_size))
    assert all((c == 0).all() for c in sd.COUNTERS.values())


@pytest.mark.cuda
@pytest.mark.parametrize("num_splits", [None, 2, 37, 128])
@pytest.mark.parametrize("mode", ["dense", "table"])
def test_in_kernel_merge_under_concurrency(mode, num_splits):
    """The in-kernel merge with the programs really running at once: 200 calls back to back without a sync
    (random lengths, so each call's answer differs and a merge of stale or missing partials shows), then each
    output against the reference, and the counters all zero at the end."""
    B, H, H_kv, S_max, L, D, block_size = 2, 8, 2, 8192, 1, 128, 64
    q, k, v = inputs((B, H, L, D), (B, H_kv, S_max, D), torch.bfloat16, "cuda", seed=0)
    gen = torch.Generator().manual_seed(1)
    table = None if mode == "dense" else random_table(gen, (B, H_kv), 96, S_max // block_size).cuda()
    lengths = torch.randint(1, S_max + 1, (200,), generator=gen).tolist()
    outs = [sd.static_decode_forward(q, k, v, torch.tensor(n, device="cuda"), table, block_size, D ** -0.5,
                                     num_splits) for n in lengths]
    torch.cuda.synchronize()
    assert all((c == 0).all() for c in sd.COUNTERS.values())
    for n, out in zip(lengths[:40], outs[:40]):
        check(out, q, reference(q, k, v, n, table, block_size))
    seps = [sd.static_decode_forward(q, k, v, torch.tensor(n, device="cuda"), table, block_size, D ** -0.5,
                                     num_splits, "separate") for n in lengths]
    for out, sep in zip(outs, seps):
        torch.testing.assert_close(out, sep, atol=TOLERANCE[q.dtype], rtol=TOLERANCE[q.dtype])
