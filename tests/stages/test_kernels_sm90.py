"""The project's Triton kernels compiled for Hopper (sm_90) on this machine, no GPU needed
(benchmarks/kernel_resources.py): Triton's own ptxas makes the cubin a GPU build makes, from the
same source and the specialisation Inductor declares for the package's launches.  The attention
kernel's registers here are the profiler's figures on an H100 (docs/measurements/runtime-h200.md).
Checked: no configuration a shape can select spills to local memory, the attention table's first
rows keep two programs a multiprocessor (the gathered form of the head's last layer too), and the
add-and-norm kernel moves its rows in 128-bit loads and stores.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("triton", reason="Triton does not import here")
an = pytest.importorskip("laya_build.model.add_norm", reason="Triton does not import here")
ra = pytest.importorskip("laya_build.model.rotary_attention", reason="Triton does not import here")

from benchmarks import kernel_resources as kr  # noqa: E402

pytestmark = pytest.mark.skipif(not os.access(kr.CUOBJDUMP, os.X_OK), reason="Triton's CUDA tools are not installed")


@pytest.mark.parametrize("config", an.CONFIGS, ids=lambda c: f"{c['ROWS']}rows-{c['num_warps']}warps")
@pytest.mark.parametrize("bias", [False, True], ids=["weight", "weight-and-bias"])
def test_the_add_norm_kernel_moves_its_rows_in_128_bit_accesses_without_spilling(config, bias):
    """The model's width (1,024, bf16): the two operands, the sum and the norm of each row of a
    program, and the parameters once, in 16-byte accesses (8 elements) and nothing narrower, as many
    a thread as the width over the program's threads needs; no local memory."""
    resources, sass = kr.norm(config, bias)
    assert resources["LOCAL"] == 0 and resources["STACK"] == 0, resources
    ops = kr.memory_ops(sass)
    assert set(ops) == {"LDG.E.128", "STG.E.128"}, ops
    each = max(1, 1024 // (config["num_warps"] * 32 * 8))  # 16-byte accesses a thread for one row's tensor
    assert ops["STG.E.128"] == 2 * config["ROWS"] * each, ops
    assert ops["LDG.E.128"] == (2 * config["ROWS"] + 1 + bias) * each, ops


@pytest.mark.parametrize("window", [-1, 64], ids=["global", "local"])
def test_no_attention_configuration_a_shape_can_select_spills(window):
    """Every configuration of a layer kind's table at the model's head dim (64), with rotary: no
    local memory; the first row (the 7 x 256 shape's) at most the registers of two programs a
    multiprocessor."""
    first = None
    for config in ra.configs(64, window):
        resources, sass = kr.attention(config, window)
        assert resources["LOCAL"] == 0 and resources["STACK"] == 0, (config, resources)
        first = first or kr.row("attention", config, resources, sass)
    assert first["programs_a_multiprocessor"] >= 2, first


def test_the_gathered_attention_kernel_does_not_spill():
    """The decision head's last layer, its queries at the positions read (head dim 64, 1 + slots
    positions a row: not a multiple of 16): no local memory, two programs a multiprocessor."""
    resources, _ = kr.gathered(ra.GATHERED)
    assert resources["LOCAL"] == 0 and resources["STACK"] == 0, resources
    assert kr.programs(resources["REG"], ra.GATHERED["num_warps"]) >= 2, resources


def test_a_kernel_that_does_not_compile_is_an_error_not_a_row():
    from triton.compiler.errors import CompilationError

    with pytest.raises(CompilationError, match="power of 2"):
        kr.compiled(an._add_norm_kernel, kr.NORM_SIGNATURE, {**kr.norm_constants(1), "BLOCK_N": 1000}, 4)


@pytest.mark.parametrize(
    "registers,warps,want",
    [(128, 8, 2), (129, 8, 1), (188, 4, 2), (168, 4, 3), (30, 4, 16), (61, 1, 32), (255, 1, 8)],
)
def test_programs_a_multiprocessor_follow_registers_in_granules_then_warps_then_programs(registers, warps, want):
    assert kr.programs(registers, warps) == want
