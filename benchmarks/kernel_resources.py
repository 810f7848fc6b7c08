"""The project's Triton kernels compiled for Hopper (sm_90) without a GPU: registers, local memory
and the widths of global loads and stores, for each launch configuration.

    python benchmarks/kernel_resources.py [--out resources.json]

Triton ships its CUDA backend's ptxas and cuobjdump, so the cubin a GPU build makes from a kernel
can be made on any machine from the same source and the same specialisation: pointers and integer
arguments divisible by 16, as Inductor declares them for the package's launches (the exported
sizes are multiples of 16 tokens).  Rows: the add-and-norm kernel at the model's width (1,024,
bf16, with a weight) at every configuration of ``benchmarks/norm_probe.py``; the attention kernel
(head dim 64, rotary) at every configuration of each layer kind's table, and its gathered form (the
decision head's last layer, its queries at the positions read) at its one configuration.  Registers
decide how many programs share a multiprocessor (:func:`programs`); a configuration with local
memory spills.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.norm_probe import DEFAULT_CONFIGS, EPS, HIDDEN  # noqa: E402
from laya_build.model import add_norm as an  # noqa: E402
from laya_build.model import rotary_attention as ra  # noqa: E402

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
# a Hopper multiprocessor: 65,536 32-bit registers, given to warps 256 at a time; 64 warps and
# 32 programs at most
REGISTERS, GRANULE, WARPS, PROGRAMS = 65536, 256, 64, 32

NORM_SIGNATURE = {
    **dict.fromkeys(("A", "B", "W", "BIAS", "SUM", "OUT"), "*bf16"),
    "n_rows": "i32",
    **dict.fromkeys(("EPS", "N", "BLOCK_N", "ROWS", "HAS_WEIGHT", "HAS_BIAS"), "constexpr"),
}
ATTENTION_SIGNATURE = {
    **dict.fromkeys(("QKV", "COS", "SIN"), "*bf16"),
    "COUNTS": "*i32",
    "OUT": "*bf16",
    **dict.fromkeys(("S", "stride_qb", "stride_qs", "stride_cb", "stride_cs", "stride_ob", "stride_os"), "i32"),
    **dict.fromkeys(("H", "D", "WINDOW", "SCALE", "ROTARY", "BLOCK_M", "BLOCK_N", "PREFETCH"), "constexpr"),
}
GATHERED_SIGNATURE = {
    "QKV": "*bf16",
    "COUNTS": "*i32",
    "AT": "*i64",
    "OUT": "*bf16",
    **dict.fromkeys(("S", "P", "stride_qb", "stride_qs", "stride_ab", "stride_ob", "stride_os"), "i32"),
    **dict.fromkeys(("H", "D", "SCALE", "BLOCK_M", "BLOCK_N", "PREFETCH"), "constexpr"),
}

GATHERED_UNDIVIDED = ("P", "stride_ab")  # 1 + slots positions a row


def compiled(
    fn, signature: dict, constants: dict, num_warps: int, num_stages: int = 2, undivided: tuple = ()
) -> tuple[dict, str]:
    """``(resources, sass)`` of ``fn`` compiled for sm_90: cuobjdump's resource table as ints
    (``REG``, ``LOCAL``, ``STACK``, ...) and the disassembly.  Every argument but the constants
    and those named in ``undivided`` is declared divisible by 16."""
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, (name, kind) in enumerate(signature.items())
        if kind != "constexpr" and name not in undivided
    }
    source = ASTSource(fn=fn, signature=signature, constexprs=constants, attrs=attrs)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.TemporaryDirectory() as folder:
        cubin = Path(folder, "kernel.cubin")
        cubin.write_bytes(kernel.asm["cubin"])
        usage = subprocess.run([CUOBJDUMP, "--dump-resource-usage", str(cubin)], capture_output=True, text=True)
        sass = subprocess.run([CUOBJDUMP, "-sass", str(cubin)], capture_output=True, text=True)
    table = re.search(r"REG:\d+.*", usage.stdout)
    if usage.returncode or sass.returncode or not table:
        raise RuntimeError(f"cuobjdump failed on {fn.__name__}: {usage.stderr or sass.stderr or usage.stdout}")
    resources = {k: int(v) for k, v in re.findall(r"(\w+(?:\[\d+\])?):(\d+)", table.group(0))}
    return resources, sass.stdout


def memory_ops(sass: str) -> dict[str, int]:
    """Global loads and stores of a disassembly by width, e.g. ``{"LDG.E.128": 2}``."""
    return dict(Counter(re.findall(r"\b((?:LDG|STG)\.E(?:\.\w+)*)\b", sass)))


def norm_constants(rows: int, bias: bool = False) -> dict:
    return {"EPS": EPS, "N": HIDDEN, "BLOCK_N": HIDDEN, "ROWS": rows, "HAS_WEIGHT": True, "HAS_BIAS": bias}


def gathered_constants(config: dict) -> dict:
    constants = {"H": 16, "D": 64, "SCALE": 0.125 * ra.LOG2E}
    return {**constants, **{k: config[k] for k in ("BLOCK_M", "BLOCK_N", "PREFETCH")}}


def attention_constants(config: dict, window: int) -> dict:
    return {**gathered_constants(config), "WINDOW": window, "ROTARY": True}


def norm(config: dict, bias: bool = False) -> tuple[dict, str]:
    """The add-and-norm kernel at ``config`` (``ROWS``, ``num_warps``), :func:`compiled`."""
    return compiled(an._add_norm_kernel, NORM_SIGNATURE, norm_constants(config["ROWS"], bias), config["num_warps"])


def attention(config: dict, window: int) -> tuple[dict, str]:
    """The attention kernel (rotary) at a launch configuration of a layer kind's table, :func:`compiled`."""
    constants = attention_constants(config, window)
    return compiled(
        ra._rotary_attention_kernel, ATTENTION_SIGNATURE, constants, config["num_warps"], config["num_stages"]
    )


def gathered(config: dict) -> tuple[dict, str]:
    """The gathered attention kernel at ``config``, :func:`compiled` (its positions' count and stride
    undivided)."""
    constants = gathered_constants(config)
    return compiled(
        ra._gathered_attention_kernel,
        GATHERED_SIGNATURE,
        constants,
        config["num_warps"],
        config["num_stages"],
        GATHERED_UNDIVIDED,
    )


def programs(registers: int, num_warps: int) -> int:
    """Programs of ``num_warps`` warps of ``registers`` a thread that fit a multiprocessor at once
    (shared memory aside)."""
    per_warp = -(-registers * 32 // GRANULE) * GRANULE
    return min(REGISTERS // (per_warp * num_warps), WARPS // num_warps, PROGRAMS)


def row(kernel: str, config: dict, resources: dict, sass: str) -> dict:
    return {
        "kernel": kernel,
        "config": config,
        "registers": resources["REG"],
        "local": resources["LOCAL"],
        "programs_a_multiprocessor": programs(resources["REG"], config["num_warps"]),
        "memory_ops": memory_ops(sass),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="write the rows here as JSON")
    args = ap.parse_args(argv)
    rows = [row("add_norm", c, *norm(c)) for c in DEFAULT_CONFIGS]
    for kind, window in (("attention global", -1), ("attention local", 64)):
        rows += [row(kind, c, *attention(c, window)) for c in ra.configs(64, window)]
    rows.append(row("attention gathered", ra.GATHERED, *gathered(ra.GATHERED)))
    for r in rows:
        ops = ", ".join(f"{k} {v}" for k, v in sorted(r["memory_ops"].items()))
        print(
            f"{r['kernel']:<17} {json.dumps(r['config']):<90} {r['registers']:>3} registers, local {r['local']}, "
            f"{r['programs_a_multiprocessor']} a multiprocessor; {ops}"
        )
    if args.out:
        result = {"triton": triton.__version__, "target": "cuda sm_90", "command": " ".join(sys.argv), "rows": rows}
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
