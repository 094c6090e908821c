"""The block-centroid kernel against the torch formula of ``block_centroids`` on the CPU: in Triton's interpreter
on the CPU, compiled on a GPU. Half, bfloat16 and float32 keys; float64 and float32 sums; partial last blocks,
non-power-of-two block sizes and head dims, strided views, several lanes."""

from __future__ import annotations

import pytest
import torch

import topo_attn.topology.gpu.centroids as centroid_kernels
from topo_attn.topology.gpu.centroids import block_centroids_kernel
from topo_attn.topology import block_centroids

# (lanes, S, block_size, D): S a multiple of block_size or not, S < block_size, D not a power of two
SHAPES = [(3, 512, 16, 64), (2, 512, 64, 128), (3, 500, 128, 40), (2, 300, 48, 64), (2, 30, 64, 40),
          (1, 96, 48, 128), (4, 1, 16, 40)]


def _keys(lanes: int, seq: int, dim: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(lanes, seq, dim, generator=gen) * 2 + 0.5).to(dtype)


def _reference(keys: torch.Tensor, block_size: int) -> torch.Tensor:
    """The torch formula (``block_centroids`` on the CPU) in float64."""
    return block_centroids(keys.cpu(), block_size, torch.float64)


@pytest.mark.parametrize("key_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("lanes, seq, block_size, dim", SHAPES)
def test_float64_sums_of_half_keys_are_exact(lanes, seq, block_size, dim, key_dtype, device):
    """16-bit keys summed in float64 are exact in any order, and the division is correctly rounded: the
    kernel's centroids equal the torch ones bit for bit."""
    keys = _keys(lanes, seq, dim, key_dtype, seed=seq * dim + block_size)
    got = block_centroids_kernel(keys.to(device), block_size, torch.float64).cpu()
    assert got.dtype == torch.float64 and got.shape == (lanes, -(-seq // block_size), dim)
    assert torch.equal(got, _reference(keys, block_size))


@pytest.mark.parametrize("key_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("lanes, seq, block_size, dim", SHAPES[:4])
def test_float32_sums_and_float32_keys_are_close(lanes, seq, block_size, dim, key_dtype, device):
    """float32 sums, or float32 keys, round in another order than torch's: close to the float64 means."""
    keys = _keys(lanes, seq, dim, key_dtype, seed=seq + dim + block_size)
    want = _reference(keys, block_size)
    got64 = block_centroids_kernel(keys.to(device), block_size, torch.float64).cpu()
    torch.testing.assert_close(got64, want, rtol=1e-14, atol=1e-15)
    got32 = block_centroids_kernel(keys.to(device), block_size, torch.float32).cpu()
    assert got32.dtype == torch.float32
    torch.testing.assert_close(got32.double(), want, rtol=1e-6, atol=2e-6)


@pytest.mark.parametrize("view", ["transpose", "slice"])
def test_strided_keys(view, device):
    """Views with any strides are read in place: a transposed [S, L, D] and a slice with a feature stride."""
    gen = torch.Generator().manual_seed(3)
    if view == "transpose":
        base = torch.randn(200, 3, 64, generator=gen).to(torch.bfloat16).to(device)
        keys = base.transpose(0, 1)  # [L, S, D] with strides (D, L * D, 1)
    else:
        base = torch.randn(4, 260, 96, generator=gen).to(torch.bfloat16).to(device)
        keys = base[1:, 3:250, ::2]  # [3, 247, 48] with a feature stride of 2
    assert not keys.is_contiguous()
    got = block_centroids_kernel(keys, 48, torch.float64).cpu()
    assert torch.equal(got, _reference(keys.contiguous(), 48))


@pytest.mark.parametrize("view", ["contiguous", "slice"])
def test_keys_read_through_their_address(view, device):
    """With ``keys_at`` the kernel reads the keys at the address it holds, not those passed (which only give
    dtype, shape and strides): what a CUDA graph replayed for keys that move relies on."""
    gen = torch.Generator().manual_seed(5)
    stored = [torch.randn(4, 260, 96, generator=gen).to(torch.bfloat16).to(device) for _ in range(2)]
    shown, read = (s if view == "contiguous" else s[1:, 3:250, ::2] for s in stored)
    keys_at = torch.tensor([read.data_ptr()], dtype=torch.int64)
    keys_at = keys_at.pin_memory() if read.is_cuda else keys_at
    got = block_centroids_kernel(shown, 32, torch.float64, keys_at=keys_at).cpu()
    assert torch.equal(got, _reference(read, 32)) and not torch.equal(got, _reference(shown, 32))


def test_kernel_rejects_other_result_dtypes():
    with pytest.raises(TypeError, match="dtype must be"):
        block_centroids_kernel(torch.zeros(1, 4, 8), 2, torch.float16)


def test_cpu_keys_keep_the_torch_path(monkeypatch):
    """``block_centroids`` runs the kernel only for CUDA keys: CPU keys never reach the interpreter."""
    def fail(*args, **kwargs):
        raise AssertionError("the kernel ran for CPU keys")

    monkeypatch.setattr(centroid_kernels, "block_centroids_kernel", fail)
    keys = torch.randn(2, 3, 50, 8)
    assert block_centroids(keys, 16).shape == (2, 3, 4, 8)


@pytest.mark.cuda
@pytest.mark.parametrize("seq, block_size, dim", [(1000, 64, 128), (300, 48, 40), (20, 64, 64)])
def test_block_centroids_on_cuda_equal_the_cpu_path(seq, block_size, dim):
    """CUDA keys go through the kernel: bfloat16 keys in float64 give the CPU result bit for bit, for
    [B, H, S, D] keys and a strided view of them."""
    gen = torch.Generator().manual_seed(seq)
    keys = torch.randn(2, 3, seq, dim, generator=gen).to(torch.bfloat16)
    got = block_centroids(keys.cuda(), block_size)
    assert got.is_cuda and got.dtype == torch.float64 and got.shape == (2, 3, -(-seq // block_size), dim)
    assert torch.equal(got.cpu(), block_centroids(keys, block_size))
    view = keys.transpose(1, 2).contiguous().cuda().transpose(1, 2)  # [B, H, S, D] with S-major strides
    assert torch.equal(block_centroids(view, block_size).cpu(), block_centroids(keys, block_size))


@pytest.mark.parametrize("key_dtype, dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.float64),
                                              (torch.float32, torch.float32)])
@pytest.mark.parametrize("lanes, seq, block_size, dim", SHAPES)
def test_block_statistics_in_one_pass(lanes, seq, block_size, dim, key_dtype, dtype, device):
    """block_statistics_kernel: the same means as block_centroids_kernel, and the element-wise minimum and
    maximum of each block's real rows (a partial last block's padding never counts), exactly: they are keys."""
    from topo_attn.selection.stats import key_block_bounds
    from topo_attn.topology.gpu.centroids import block_statistics_kernel

    keys = _keys(lanes, seq, dim, key_dtype, seed=seq * 7 + dim + block_size)
    if seq % block_size:  # a partial last block of large keys: a padded zero would be its minimum or maximum
        keys[:, -(seq % block_size):] = keys[:, -(seq % block_size):].abs() + 1
        keys[1 % lanes, -1] = -keys[1 % lanes, -1]
    mean, lo, hi = block_statistics_kernel(keys.to(device), block_size, dtype)
    want_lo, want_hi = key_block_bounds(keys, block_size, dtype)  # the torch path, on the CPU
    assert lo.dtype == hi.dtype == mean.dtype == dtype
    assert torch.equal(lo.cpu(), want_lo) and torch.equal(hi.cpu(), want_hi)
    assert torch.equal(mean.cpu(), block_centroids_kernel(keys.to(device), block_size, dtype).cpu())


def test_block_statistics_of_strided_keys(device):
    from topo_attn.selection.stats import key_block_bounds
    from topo_attn.topology.gpu.centroids import block_statistics_kernel

    gen = torch.Generator().manual_seed(5)
    keys = torch.randn(200, 3, 64, generator=gen).to(torch.bfloat16).transpose(0, 1)  # strides (D, L * D, 1)
    _, lo, hi = block_statistics_kernel(keys.to(device), 64, torch.float32)
    want_lo, want_hi = key_block_bounds(keys, 64, torch.float32)
    assert torch.equal(lo.cpu(), want_lo) and torch.equal(hi.cpu(), want_hi)
