"""``laya_native::linear`` on CUDA: cuBLASLt through the project's library against torch's own GEMM
and against the same algorithm called from Python (``benchmarks/cublaslt_probe.py``'s ``Lt``),
in a CUDA graph as the runtime replays it, and a named algorithm cuBLASLt refuses.  Skipped
without a GPU."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from laya_build.records import sha256_file
from tests.stages.cuda_graphs import replayed

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="needs a C++ compiler"),
]


@pytest.fixture(scope="module")
def op(tmp_path_factory):
    from laya_build import native
    from laya_build.runtime.serving import load_library

    out = tmp_path_factory.mktemp("native")
    record = native.build(out)
    load_library(out / record["path"], sha256_file(out / record["path"]), what="test")
    torch.ones(8, 8, device="cuda", dtype=torch.bfloat16) @ torch.ones(8, 8, device="cuda", dtype=torch.bfloat16)
    return torch.ops.laya_native.linear


SHAPES = [((128, 1024), 3072), ((7, 256, 2624), 1024), ((3, 1024), 5248)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_heuristics_algorithm_computes_linear(op, dtype, with_bias):
    torch.manual_seed(0)
    for x_shape, n in SHAPES:
        k = x_shape[-1]
        x = torch.randn(*x_shape, device="cuda", dtype=dtype)
        w = torch.randn(n, k, device="cuda", dtype=dtype) * k**-0.5
        b = torch.randn(n, device="cuda", dtype=dtype) if with_bias else None
        got, want = op(x, w, b, None), F.linear(x, w, b)
        assert got.shape == want.shape and got.dtype == dtype
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


def test_a_named_algorithm_is_the_one_called_from_python_bit_for_bit(op):
    from benchmarks.cublaslt_probe import Lt, words_of

    lt = Lt(torch, 32 << 20)
    version = cublaslt_version(lt)
    torch.manual_seed(1)
    m, n, k = 128, 1024, 2624
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
    problem = lt.problem(m, n, k)
    algorithms = lt.algorithms(problem, 4)
    assert algorithms
    for algo in algorithms:
        want = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        lt.matmul(problem, algo, x, w, want)
        words = [int(v, 16) - (1 << 64) if int(v, 16) >= 1 << 63 else int(v, 16) for v in words_of(algo)]
        got = op(x, w, None, [version, -1, *words])
        torch.cuda.synchronize()
        assert torch.equal(got, want)


def test_a_graph_replay_is_the_plain_call(op):
    torch.manual_seed(2)
    x = torch.randn(1792, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(5248, 1024, device="cuda", dtype=torch.bfloat16) * 1024**-0.5
    plain = op(x, w, None, None)
    assert torch.equal(replayed(lambda: op(x, w, None, None)), plain)


def cublaslt_version(lt) -> int:
    import ctypes

    lt.lib.cublasLtGetVersion.restype = ctypes.c_size_t
    return int(lt.lib.cublasLtGetVersion())


def test_an_algorithm_cublaslt_refuses_names_the_problem(op):
    from benchmarks.cublaslt_probe import Lt

    version = cublaslt_version(Lt(torch, 1 << 20))
    x = torch.randn(128, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"does not accept the algorithm .* M=128 N=1024 K=1024 bfloat16"):
        op(x, w, None, [version, -1, *[-1] * 8])
    with pytest.raises(RuntimeError, match="groups of 9"):
        op(x, w, None, [version, 128, 1, 2])


def test_algorithms_of_another_cublaslt_run_the_heuristics_choice(op, capfd):
    """Words chosen with another cuBLASLt version may name other kernels there: not used (torch's
    C++ warning handler writes the warning to stderr)."""
    x = torch.randn(128, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    got = op(x, w, None, [1, -1, *[-1] * 8])
    torch.cuda.synchronize()
    assert "algorithms were chosen with cuBLASLt 1 and this process has cuBLASLt" in capfd.readouterr().err
    torch.testing.assert_close(got, F.linear(x, w), atol=2e-2, rtol=2e-2)


def test_operands_at_any_16_byte_offset(op):
    """Weights inside AOTInductor's constant blob are 64-byte aligned, views may be 16: the op
    tells cuBLASLt the alignment the operands have."""
    base = torch.randn(2 * 1024 * 1024 + 64, device="cuda", dtype=torch.bfloat16)
    xs = torch.randn(128 * 1024 + 64, device="cuda", dtype=torch.bfloat16)
    for offset in (8, 32, 64):  # elements of 2 bytes: 16-, 64- and 128-byte offsets
        w = base[offset : offset + 1024 * 1024].view(1024, 1024)
        x = xs[offset : offset + 128 * 1024].view(128, 1024)
        torch.testing.assert_close(op(x, w, None, None), F.linear(x, w), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("with_bias", [False, True])
def test_a_residual_is_added_in_the_epilogue_before_the_one_rounding(op, with_bias):
    """``residual``: cuBLASLt's C matrix, added to the fp32 product: the output is the fp32 sum
    rounded once (within a bf16 step: the product's own sum order is cuBLAS's), the residual is
    not written, and a graph replay is the plain call.  A residual at a 16-byte offset and one
    with another shape are handled as the operands are."""
    torch.manual_seed(3)
    for m, n, k in ((128, 1024, 2624), (1792, 1024, 1024)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if with_bias else None
        r = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 4
        kept = r.clone()
        got = op(x, w, b, None, residual=r)
        exact = x.float() @ w.float().T + r.float() + (b.float() if b is not None else 0)
        torch.testing.assert_close(got.float(), exact, atol=0.05, rtol=2**-7)
        assert torch.equal(r, kept)
        twice = (F.linear(x, w, b) + r).float()
        assert (got.float() - exact).abs().mean() <= (twice - exact).abs().mean()  # one rounding, not two
        spare = torch.empty(m * n + 8, device="cuda", dtype=torch.bfloat16)
        shifted = spare[8:].view(m, n)
        shifted.copy_(r)
        torch.testing.assert_close(op(x, w, b, None, residual=shifted), got, atol=0.05, rtol=2**-7)
    with pytest.raises(RuntimeError, match=r"residual \[128, 1\] BFloat16 is not the output's shape \[128, 1024\]"):
        op(x[:128], w, b, None, residual=r[:128, :1])
    assert torch.equal(replayed(lambda: op(x, w, b, None, residual=r)), got)
