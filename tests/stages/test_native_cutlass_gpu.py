"""The native library's CUTLASS kernels on CUDA.

``laya_native::geglu_linear``: against cuBLAS's GEMM and torch's gated GELU at every launch
configuration and row counts with and without a partial tile, with the GEMM's output rounded as
the kernel rounds it.  ``laya_native::linear``'s CUTLASS path (stream-K): against ``F.linear`` with
and without the residual, at every configuration, the same bits on every call, cuBLASLt below the
row bound.  Both in a CUDA graph as the runtime replays them, and the refusals.  Skipped without a
Hopper GPU, nvcc or CUTLASS's headers."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from laya_build.records import sha256_file
from tests.stages.cuda_graphs import replayed, replays

pytestmark = [
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
        reason="needs a GPU of compute capability 9.0 (the kernel is sm_90a)",
    ),
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc"),
]

HIDDEN, GLU = 1024, 2624


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from laya_build import native
    from laya_build.errors import StageError
    from laya_build.runtime.serving import load_library

    try:
        native.cutlass_include()
    except StageError as exc:
        pytest.skip(f"needs CUTLASS's headers: {exc}")
    out = tmp_path_factory.mktemp("native-geglu")
    record = native.build(out, cuda_kernels=True)
    path = out / record["path"]
    load_library(path, sha256_file(path), what="test")  # never a second copy: one library of the namespace
    counts = [len(torch.ops.laya_native.cutlass_configs(op)) for op in ("geglu", "linear")]
    return torch.ops.laya_native.geglu_linear, *counts


def pair(x, w):
    """cuBLAS's GEMM rounded to bf16, then torch's gated GELU in fp32 rounded once: what the kernel computes."""
    y = F.linear(x, w).float()
    return (F.gelu(y[..., :GLU]) * y[..., GLU:]).to(torch.bfloat16)


def operands(m, seed=0):
    from laya_build.model.native_geglu import interleave

    torch.manual_seed(seed)
    x = torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2 * GLU, HIDDEN, device="cuda", dtype=torch.bfloat16) * HIDDEN**-0.5
    return x, w, interleave(w).contiguous()


@pytest.mark.parametrize("m", [1, 7, 128, 200, 1792])
def test_every_configuration_computes_the_gated_gelu_of_the_gemm(built, m):
    op, configs, _ = built
    x, w, wi = operands(m)
    want = pair(x, w)
    for config in range(configs):
        got = op(x, wi, None, [-1, config])
        assert got.shape == (m, GLU) and got.dtype == torch.bfloat16
        # the products summed in another order than cuBLAS's: a bf16 rounding of the GEMM's output apart
        torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-2, msg=lambda s, c=config: f"config {c}: {s}")


def test_the_row_count_chooses_the_configuration_and_leading_dims_are_kept(built):
    op, configs, _ = built
    x, w, wi = operands(7 * 256, seed=1)
    x3 = x.view(7, 256, HIDDEN)
    got = op(x3, wi, None, [256, configs - 1, -1, 0])
    assert got.shape == (7, 256, GLU)
    assert torch.equal(got.view(-1, GLU), op(x, wi, None, [-1, 0]))
    small = op(x[:128], wi, None, [256, configs - 1, -1, 0])
    assert torch.equal(small, op(x[:128], wi, None, [-1, configs - 1]))


def test_an_unaligned_view_is_copied_and_computed_alike(built):
    op, _, _ = built
    x, w, wi = operands(129, seed=2)
    padded = torch.zeros(129 * HIDDEN + 1, device="cuda", dtype=torch.bfloat16)
    shifted = padded[1:].view(129, HIDDEN)  # 2 bytes past an aligned address
    shifted.copy_(x)
    assert torch.equal(op(shifted, wi, None, None), op(x, wi, None, None))


def test_a_graph_replay_is_the_plain_call(built):
    op, _, _ = built
    x, _, wi = operands(1792, seed=3)
    plain = op(x, wi, None, None)
    assert torch.equal(replayed(lambda: op(x, wi, None, None)), plain)


# Rows of real positions and padding: 29 of 128 (one row tile of 64 real, one not), a row with
# none, whole rows real, rows that end inside a tile, at the shapes a forward runs.
COUNTS = {
    (1, 128): [29],
    (7, 256): [29, 48, 42, 134, 167, 71, 124],
    (4, 512): [512, 0, 300, 1],
    (3, 64): [0, 0, 0],
    (2, 16): [16, 3],
}


@pytest.mark.parametrize(("rows", "tokens"), list(COUNTS))
def test_with_counts_padding_is_zero_and_real_positions_are_the_same_bits(built, rows, tokens):
    """Every configuration, those that skip the row tiles of padding (no cluster) and those that
    compute them: the real positions' outputs are the bits of the call without counts, the
    padding's 0, also in a buffer that held other values before (every output written once)."""
    op, configs, _ = built
    x, _, wi = operands(rows * tokens, seed=5)
    x3 = x.view(rows, tokens, HIDDEN)
    counts = torch.tensor(COUNTS[(rows, tokens)], device="cuda", dtype=torch.int32)
    real = torch.arange(tokens, device="cuda")[None, :] < counts[:, None].long()
    for config in range(configs):
        full = op(x3, wi, None, [-1, config])
        noise = torch.full_like(full, float("nan"))
        del noise  # the allocator hands its block to the next output: every element must be written
        got = op(x3, wi, None, [-1, config], counts)
        assert torch.equal(got[real], full[real]), f"config {config}: real positions differ"
        assert not got[~real].any(), f"config {config}: padding positions not 0"


def test_a_replay_follows_the_counts_it_reads(built):
    """A captured call reads the counts at replay: other counts, other tiles skipped, each replay
    the plain call's bits."""
    op, configs, _ = built
    x, _, wi = operands(7 * 256, seed=6)
    x3 = x.view(7, 256, HIDDEN)
    counts = torch.tensor(COUNTS[(7, 256)], device="cuda", dtype=torch.int32)
    plain = [op(x3, wi, None, [256, 2, -1, 7], counts).clone()]
    others = torch.tensor([256, 1, 129, 0, 64, 200, 5], device="cuda", dtype=torch.int32)
    plain.append(op(x3, wi, None, [256, 2, -1, 7], others).clone())
    static = counts.clone()
    outs = []
    for replay in replays(lambda: op(x3, wi, None, [256, 2, -1, 7], static), times=2):
        outs.append(replay.clone())
        static.copy_(others)
    assert torch.equal(outs[0], plain[0]) and torch.equal(outs[1], plain[1])


def test_counts_refusals_name_what_is_wrong(built):
    op, _, _ = built
    x, _, wi = operands(64, seed=7)
    with pytest.raises(RuntimeError, match=r"\[rows, tokens, K\] input"):
        op(x, wi, None, None, torch.tensor([3], device="cuda", dtype=torch.int32))
    with pytest.raises(RuntimeError, match="is not an int32 vector of x's 2 rows"):
        op(x.view(2, 32, HIDDEN), wi, None, None, torch.tensor([3, 4], device="cuda"))
    with pytest.raises(RuntimeError, match="give them one device"):
        op(x.view(2, 32, HIDDEN), wi, None, None, torch.tensor([3, 4], dtype=torch.int32))


def test_refusals_name_what_is_wrong(built):
    op, configs, _ = built
    x, _, wi = operands(16, seed=4)
    with pytest.raises(RuntimeError, match="adds no bias"):
        op(x, wi, torch.zeros(2 * GLU, device="cuda", dtype=torch.bfloat16), None)
    with pytest.raises(RuntimeError, match="runs bfloat16 on CUDA"):
        op(x.half(), wi.half(), None, None)
    with pytest.raises(RuntimeError, match=f"configuration {configs} is not one of"):
        op(x, wi, None, [-1, configs])
    with pytest.raises(RuntimeError, match="groups of 2"):
        op(x, wi, None, [-1])


# ---------------------------------------------------------------------- linear through CUTLASS


@pytest.mark.parametrize(("m", "k"), [(1792, 1024), (1792, 2624), (300, 1024), (7, 2624)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_every_cutlass_configuration_computes_linear_and_adds_the_residual_before_rounding(built, m, k, with_residual):
    _, _, configs = built
    torch.manual_seed(5)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(HIDDEN, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
    r = torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16) if with_residual else None
    product = x.float() @ w.float().t()
    want = (product + r.float() if with_residual else product).to(torch.bfloat16)  # one rounding
    for config in range(configs):
        got = torch.ops.laya_native.linear(x, w, None, None, r, cutlass=[-1, config])
        assert got.shape == (m, HIDDEN) and got.dtype == torch.bfloat16
        torch.testing.assert_close(got, want, rtol=2**-7, atol=2e-2, msg=lambda s, c=config: f"config {c}: {s}")
        again = torch.ops.laya_native.linear(x, w, None, None, r, cutlass=[-1, config])
        assert torch.equal(got, again), f"config {config}: partial tiles summed in a fixed order"


def test_below_the_row_bound_the_call_is_cublaslts(built):
    torch.manual_seed(6)
    x = torch.randn(128, 2624, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(HIDDEN, 2624, device="cuda", dtype=torch.bfloat16) * 2624**-0.5
    plain = torch.ops.laya_native.linear(x, w, None, None)
    assert torch.equal(torch.ops.laya_native.linear(x, w, None, None, cutlass=[256, -1, -1, 0]), plain)


def test_a_cutlass_graph_replay_is_the_plain_call(built):
    torch.manual_seed(7)
    x = torch.randn(1792, 2624, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(HIDDEN, 2624, device="cuda", dtype=torch.bfloat16) * 2624**-0.5
    r = torch.randn(1792, HIDDEN, device="cuda", dtype=torch.bfloat16)

    def call():
        return torch.ops.laya_native.linear(x, w, None, None, r, cutlass=[-1, 0])

    plain = call()
    for out in replays(call, times=3):  # the stream-K workspace's flags are reset on every replay
        assert torch.equal(out, plain)


def test_cutlass_refusals_name_what_is_wrong(built):
    _, _, configs = built
    x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(HIDDEN, 1024, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="CUTLASS kernels add no bias"):
        torch.ops.laya_native.linear(
            x, w, torch.zeros(HIDDEN, device="cuda", dtype=torch.bfloat16), None, cutlass=[-1, 0]
        )
    with pytest.raises(RuntimeError, match="CUTLASS kernels run bfloat16"):
        torch.ops.laya_native.linear(x.half(), w.half(), None, None, cutlass=[-1, 0])
    with pytest.raises(RuntimeError, match=f"CUTLASS configuration {configs} is not one of"):
        torch.ops.laya_native.linear(x, w, None, None, cutlass=[-1, configs])
