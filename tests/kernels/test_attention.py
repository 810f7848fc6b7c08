"""Tests of ``kernels.attention.attn_kernel``.

CPU cases compile the scalar fp32 specialisation (``compile_cpu``, cached per session by the
``cpu_kernel`` fixture: one dynamic ``B=None, L=None`` kernel serves every shape of a window
size) and compare valid query rows with the float64 ``attn_reference`` (atol 2e-5, rtol 0);
padded query rows are checked separately (finite, and exactly 0).  Every output starts as
NaN so a row the kernel forgets to write fails.

GPU cases (bf16/fp16 output against the CPU kernel on the same 16-bit-rounded inputs) skip
without CUDA; the CUDA lowering cases need no GPU.
"""

from __future__ import annotations

import pytest
import torch

from kernels import attn_kernel
from kernels.attention import PROBE_ARGS
from kernels.probe import cuda_source
from kernels.reference import attn_reference
from kernels.testing import CPU_ATOL, GPU_TOL, as_16bit, nan_like, randn

H, DH = 2, 16  # small heads keep the scalar CPU kernels fast
TILES = dict(block_M=32, block_N=16)  # unequal tiles: query and key tiles go partial separately


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------
def make_qkv(B: int, L: int, heads: int = H, dh: int = DH) -> torch.Tensor:
    return randn(B, L, 3, heads, dh)


def lengths(lens) -> torch.Tensor:
    return torch.tensor(lens, dtype=torch.int32)


def valid_rows(lens: torch.Tensor, L: int) -> torch.Tensor:
    """``[B, L]`` mask of the valid query rows."""
    return torch.arange(L)[None, :] < lens[:, None].long()


def run(kernel, qkv: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    B, L, _, heads, dh = qkv.shape
    out = nan_like((B, L, heads * dh), dtype=qkv.dtype, device=qkv.device)
    kernel(qkv, lens.to(qkv.device), out)
    return out


def check(out: torch.Tensor, qkv: torch.Tensor, lens: torch.Tensor, window: int = 0) -> None:
    """Valid query rows match the reference; padded query rows are finite."""
    valid = valid_rows(lens, qkv.shape[1])
    expected = attn_reference(qkv, lens, window=window)
    torch.testing.assert_close(out.double()[valid], expected[valid], atol=CPU_ATOL, rtol=0)
    assert torch.isfinite(out[~valid]).all(), "padded query rows must stay finite"


# --------------------------------------------------------------------------------------
# CPU numerics: static shapes
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "lens",
    [[80, 80, 80], [80, 37, 1], [0, 80, 50]],
    ids=["full", "unequal", "empty-first"],
)
def test_static_shape(cpu_kernel, lens):
    """B=3, L=80 fixed at compile time; 80 is not a multiple of the 32-row query tile."""
    kernel = cpu_kernel(attn_kernel, 3, 80, H, DH, **TILES)
    qkv, lens = make_qkv(3, 80), lengths(lens)
    check(run(kernel, qkv, lens), qkv, lens)


def test_probe_shape_default_tiles(cpu_kernel):
    """The canonical probe shape (kernels.probe) with the default tiles."""
    B, L = PROBE_ARGS["B"], PROBE_ARGS["L"]
    kernel = cpu_kernel(attn_kernel, **PROBE_ARGS)
    qkv, lens = make_qkv(B, L, PROBE_ARGS["H"], PROBE_ARGS["Dh"]), lengths([L, 77])
    check(run(kernel, qkv, lens), qkv, lens)


# --------------------------------------------------------------------------------------
# CPU numerics: runtime B and L (one compiled kernel)
# --------------------------------------------------------------------------------------
DYNAMIC_SHAPES = [
    (1, 1, [1]),  # a single token
    (1, 5, [5]),  # L below both tile sizes
    (2, 16, [16, 9]),  # exactly one key tile, half a query tile
    (3, 32, [32, 0, 17]),  # exactly one query tile; an empty sequence
    (2, 45, [45, 44]),  # partial query and key tiles
    (4, 67, [67, 1, 30, 66]),  # unequal lengths
    (1, 100, [100]),  # several query and key tiles
]


@pytest.mark.parametrize("B,L,lens", DYNAMIC_SHAPES, ids=[f"B{b}-L{l}" for b, l, _ in DYNAMIC_SHAPES])
def test_dynamic_shape(cpu_kernel, B, L, lens):
    kernel = cpu_kernel(attn_kernel, None, None, H, DH, **TILES)
    qkv, lens = make_qkv(B, L), lengths(lens)
    check(run(kernel, qkv, lens), qkv, lens)


def test_dynamic_kernel_reused_across_shapes(cpu_kernel):
    """One kernel object, called with shrinking and growing shapes in turn."""
    kernel = cpu_kernel(attn_kernel, None, None, H, DH, **TILES)
    for B, L, lens in [(4, 67, [67, 1, 30, 66]), (1, 5, [5]), (3, 32, [32, 0, 17]), (2, 45, [45, 44])]:
        qkv, lens = make_qkv(B, L), lengths(lens)
        check(run(kernel, qkv, lens), qkv, lens)


@pytest.mark.parametrize("B,lens", [(1, [48]), (3, [48, 20, 0])], ids=["B1", "B3"])
def test_dynamic_batch_only(cpu_kernel, B, lens):
    kernel = cpu_kernel(attn_kernel, None, 48, H, DH, **TILES)
    qkv, lens = make_qkv(B, 48), lengths(lens)
    check(run(kernel, qkv, lens), qkv, lens)


@pytest.mark.parametrize("L,lens", [(7, [7, 3]), (70, [70, 33])], ids=["L7", "L70"])
def test_dynamic_length_only(cpu_kernel, L, lens):
    kernel = cpu_kernel(attn_kernel, 2, None, H, DH, **TILES)
    qkv, lens = make_qkv(2, L), lengths(lens)
    check(run(kernel, qkv, lens), qkv, lens)


# --------------------------------------------------------------------------------------
# CPU numerics: sliding window
# --------------------------------------------------------------------------------------
WINDOW_SHAPES = [(2, 70, [70, 41]), (3, 40, [40, 0, 13])]


@pytest.mark.parametrize("window", [1, 5, 16, 33])
@pytest.mark.parametrize("B,L,lens", WINDOW_SHAPES, ids=["B2-L70", "B3-L40"])
def test_sliding_window(cpu_kernel, window, B, L, lens):
    """Windows narrower than, equal to and wider than a key tile (16) and a query tile (32)."""
    kernel = cpu_kernel(attn_kernel, None, None, H, DH, window=window, **TILES)
    qkv, lens = make_qkv(B, L), lengths(lens)
    check(run(kernel, qkv, lens), qkv, lens, window=window)


@pytest.mark.parametrize("L", [40, 23])
def test_window_at_least_length_is_full_attention(cpu_kernel, L):
    kernel = cpu_kernel(attn_kernel, None, None, H, DH, window=40, **TILES)
    qkv, lens = make_qkv(2, L), lengths([L, L - 3])
    out = run(kernel, qkv, lens)
    check(out, qkv, lens, window=0)
    check(out, qkv, lens, window=40)


# --------------------------------------------------------------------------------------
# CPU numerics: padding
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("window", [0, 5])
def test_padded_rows_zero_and_padding_values_ignored(cpu_kernel, window):
    """Padded query rows are exactly 0; (finite) junk stored at padded positions is ignored."""
    B, L, lens = 3, 50, lengths([50, 0, 21])
    kernel = cpu_kernel(attn_kernel, None, None, H, DH, window=window, **TILES)
    qkv = make_qkv(B, L)
    padded = ~valid_rows(lens, L)
    qkv[padded] = 1e4  # Q, K and V of every padded token
    out = run(kernel, qkv, lens)
    check(out, qkv, lens, window=window)
    assert (out[padded] == 0).all()


def test_all_sequences_empty(cpu_kernel):
    kernel = cpu_kernel(attn_kernel, None, None, H, DH, **TILES)
    qkv, lens = make_qkv(2, 20), lengths([0, 0])
    out = run(kernel, qkv, lens)
    assert (out == 0).all()


# --------------------------------------------------------------------------------------
# Factory contract
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gpu_rejects_non_16bit_dtype(dtype):
    with pytest.raises(ValueError, match="bfloat16.*float16"):
        attn_kernel.get_tir(2, 64, H, DH, dtype=dtype)


def test_negative_window_rejected():
    with pytest.raises(ValueError, match="window"):
        attn_kernel.get_tir(2, 64, H, DH, window=-1, cpu=True, dtype="float32")


def test_cpu_and_gpu_specialisations_differ_only_in_scopes_and_scheduling():
    """Same PrimFunc name and signature; the GPU one uses shared/fragment tiles, the swizzle
    and the pipelined loop, the CPU one none of them."""
    gpu = attn_kernel.get_tir(None, None, H, DH, window=5)
    cpu = attn_kernel.get_tir(None, None, H, DH, window=5, cpu=True, dtype="float32")
    assert gpu.attrs["global_symbol"] == cpu.attrs["global_symbol"] == "attention"
    assert [p.name for p in gpu.params] == [p.name for p in cpu.params]
    gpu_script, cpu_script = gpu.script(), cpu.script()
    for marker in ("threadblock_swizzle_pattern", "shared", "local.fragment", "num_stages"):
        assert marker in gpu_script, marker
        assert marker not in cpu_script, marker


# --------------------------------------------------------------------------------------
# GPU: lowering (no GPU needed) and numerics (CUDA only)
# --------------------------------------------------------------------------------------
# both dtypes on the pipeline's arch (wgmma), and the mma path of sm_80 once (each ~5-10 s)
@pytest.mark.parametrize(("dtype", "arch"), [("bfloat16", "sm_90"), ("float16", "sm_90"), ("bfloat16", "sm_80")])
def test_lowers_to_cuda(dtype, arch):
    src = cuda_source(attn_kernel, kwargs=PROBE_ARGS, dtype=dtype, arch=arch)
    assert "__global__ void" in src and "attention_kernel" in src
    assert ("bfloat16_t" if dtype == "bfloat16" else "half_t") in src
    assert "rasterization2DRow" in src  # the GPU swizzle
    assert ("wgmma" if arch == "sm_90" else "mma") in src  # tensor-core GEMMs


def test_lowers_to_cuda_dynamic_window():
    src = cuda_source(attn_kernel, (None, None, 16, 64), {"window": 64}, dtype="bfloat16", arch="sm_90")
    assert "attention_kernel" in src and "wgmma" in src


# The last shape is mostly padding: many query tiles with no valid row (a TMA/shared-memory
# hazard of empty key loops on sm_90, see attention._key_tile_range).
GPU_SHAPES = [(2, 128, [128, 77]), (3, 200, [200, 0, 150]), (16, 640, [640] + [3, 0, 70] * 5)]


@pytest.mark.parametrize("window", [0, 64])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_gpu_matches_cpu_kernel(cpu_kernel, gpu_kernel, dtype, window):
    """bf16/fp16 GPU output vs the fp32 CPU kernel on the same 16-bit-rounded inputs."""
    heads, dh = 4, 64
    gpu = gpu_kernel(attn_kernel, None, None, heads, dh, window=window, dtype=dtype)
    cpu = cpu_kernel(attn_kernel, None, None, heads, dh, window=window)
    for B, L, lens in GPU_SHAPES:
        qkv16, lens = as_16bit(make_qkv(B, L, heads, dh), dtype), lengths(lens)
        expected = run(cpu, qkv16.float(), lens)
        out = run(gpu, qkv16.cuda(), lens).cpu()
        valid = valid_rows(lens, L)
        torch.testing.assert_close(out.float()[valid], expected[valid], **GPU_TOL[dtype])
        assert (out[~valid] == 0).all(), "padded query rows must be 0 (and finite)"
