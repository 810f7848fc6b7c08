"""The MLP's first GEMM and gated GELU as one op (laya_build.model.geglu_linear, export.geglu_linear).

On the CPU the op computes the MLP's own arithmetic: a model with its MLPs replaced gives the
model's outputs bit for bit and exports with the pipeline's dynamic rows and tokens, the op kept
as one call.  The Triton kernel runs in Triton's interpreter against that arithmetic at every
launch configuration, with row and column counts that are not multiples of the blocks and with
and without a bias; the row count picks one configuration.  On a GPU the compiled kernel is
compared with cuBLAS's GEMM and the gated GELU, in the model's dtype.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from laya_build import PROJECT_ROOT

sys.path.insert(0, str(Path(__file__).parent))
from test_varlen_attention import batch, exported, small_model  # noqa: E402  (the same small model)

pytest.importorskip("triton")
pytestmark = pytest.mark.filterwarnings("ignore")

from laya_build.model import geglu_linear as gl  # noqa: E402


def calls(ep) -> list[str]:
    return [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]


def test_a_model_with_the_op_gives_its_outputs_bit_for_bit_and_exports_with_it():
    model, reference = small_model(), small_model()
    args = batch()
    assert gl.use(model) == 4  # every encoder layer's MLP
    assert all(type(layer.mlp) is gl.GegluMLP for layer in model.encoder.layers)
    assert model.state_dict().keys() == reference.state_dict().keys()  # the same parameters
    with torch.inference_mode():
        for e, g in zip(reference(*args), model(*args)):
            assert torch.equal(e, g)
    ep = exported(model)
    names = calls(ep)
    assert names.count("laya.geglu_linear.default") == 4
    gelus = calls(exported(reference)).count("aten.gelu.default")
    assert names.count("aten.gelu.default") == gelus - 4  # the MLPs' gated GELUs are inside the op; the head's stay
    other = batch((32, 9), width=32)
    with torch.inference_mode():
        for e, g in zip(reference(*other), ep.module()(*other)):
            assert torch.equal(e, g)


def test_a_model_whose_gate_is_another_activation_is_refused_with_what_it_computes():
    with pytest.raises(ValueError, match="export.geglu_linear: the kernel computes a gelu gate; .* 'silu'"):
        gl.use(small_model(hidden_activation="silu"))
    with pytest.raises(ValueError, match="no ModernBERT MLP"):
        gl.use(torch.nn.Sequential(torch.nn.Linear(4, 4)))


def test_the_row_count_selects_one_configuration():
    for rows in (1, 128, 511, 512, 1792):
        uses = [use for _, use in gl.selection(rows)]
        assert sorted(uses) == [0, 1], rows
        chosen = next(c for c, use in gl.selection(rows) if use)
        assert chosen["MIN_ROWS"] <= rows
        assert all(c["MIN_ROWS"] > rows for c in gl.CONFIGS if c["MIN_ROWS"] > chosen["MIN_ROWS"])


INTERPRETED = textwrap.dedent(
    """
    import json, sys, torch
    # Triton 3.6's interpreter turns a loop bound into an int with int(array); numpy >= 2.4 wants
    # a 0-d array there.  The same conversion, of the bound's one element.
    from triton.runtime import interpreter
    patch = interpreter._patch_lang_tensor
    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
    interpreter._patch_lang_tensor = patched
    from laya_build.model import geglu_linear as gl

    torch.manual_seed(0)
    worst = {}
    for dtype in (torch.float32, torch.float16):
        for M, K, half, bias in ((70, 96, 80, True), (5, 64, 40, False)):  # no multiple of any block
            x = torch.randn(M, K).to(dtype)
            w = (torch.randn(2 * half, K) / 8).to(dtype)
            b = torch.randn(2 * half).to(dtype) if bias else None
            ref = gl.reference(x, w, b)
            for config in json.loads(sys.argv[1]):
                out = torch.full((M, half), float("nan"), dtype=dtype)
                gl.launch(x, w, b, out, config)
                worst[f"{dtype} {M}x{K}x{half} bias {bias} {config}"] = (out.float() - ref.float()).abs().max().item()
    print(json.dumps(worst))
    """
)


def test_the_kernel_in_triton_s_interpreter_is_the_mlp_s_arithmetic():
    small = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32}  # the module's blocks, made small enough to repeat
    configs = [{**c, **small} for c in gl.CONFIGS] + [dict(c) for c in gl.CONFIGS]
    run = subprocess.run(
        [sys.executable, "-c", INTERPRETED, json.dumps(configs)],
        cwd=PROJECT_ROOT,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    worst = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(worst) == 2 * 2 * len(configs)
    for key, diff in worst.items():
        # fp32: the sums in another order; fp16: also the halves rounded before the gate, as the GEMM writes them
        assert diff <= (2e-5 if "float32" in key else 2e-2), key


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton kernel compiled needs a CUDA GPU")
def test_on_the_gpu_the_kernel_is_cublas_s_gemm_and_the_gated_gelu():
    torch.manual_seed(0)
    for M in (1, 77, 128, 600, 1792):  # each configuration, rows not a multiple of its block
        x = torch.randn(M, 1024, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(2 * 2624, 1024, device="cuda", dtype=torch.bfloat16) / 32
        for b in (None, torch.randn(2 * 2624, device="cuda", dtype=torch.bfloat16)):
            got = gl.geglu_linear(x, w, b)
            want = gl.reference(x, w, b)
            exact = gl.reference(x.float(), w.float(), None if b is None else b.float())
            assert got.shape == (M, 2624)
            # within the distance of cuBLAS's pair from fp32, and near the pair itself
            assert (got.float() - exact).abs().max() <= 2 * (want.float() - exact).abs().max() + 1e-2
            assert (got.float() - want.float()).abs().max() <= 0.0625
