"""``export.native_geglu``: the MLP's first GEMM and gated GELU as ``laya_native::geglu_linear``.

On the CPU: the rows' interleaving, the op against the module's own arithmetic bit for bit, the
checks an export makes before it builds anything, and what a build without nvcc or CUTLASS says.
Where nvcc and CUTLASS's headers are here: the library with its CUDA kernels, the same bytes from
two checkouts, loadable in a process without a GPU, its kernels compiled without spills.  The
kernels' arithmetic on a GPU: tests/stages/test_native_cutlass_gpu.py.  The op in a released
package: tests/pipeline/test_native_library.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from laya_build import native
from laya_build.errors import StageError
from laya_build.model import native_geglu
from laya_build.records import sha256_file


def test_interleave_alternates_blocks_of_eight_input_and_gate_rows_and_halves_undoes_it():
    w = torch.arange(32 * 3).reshape(32, 3)  # 16 input rows, then 16 gate rows
    mixed = native_geglu.interleave(w)
    rows = mixed[:, 0].div(3, rounding_mode="floor").tolist()
    assert rows == [*range(0, 8), *range(16, 24), *range(8, 16), *range(24, 32)]
    assert torch.equal(native_geglu.halves(mixed), w)
    b = torch.arange(32)
    assert torch.equal(native_geglu.interleave(b), torch.tensor(rows))
    assert torch.equal(native_geglu.halves(native_geglu.interleave(b)), b)


@pytest.fixture(scope="module")
def cpu_library(tmp_path_factory):
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("no C++ compiler: the native op library cannot be built here")
    out = tmp_path_factory.mktemp("native")
    record = native.build(out)
    return out / record["path"]


def _fresh(code: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().splitlines()[-1]


CPU_OP = """
import json, sys, torch
import torch.nn.functional as F
from laya_build.model.native_geglu import interleave
torch.ops.load_library(sys.argv[1])
torch.manual_seed(0)
same = []
for dtype in (torch.float32, torch.bfloat16):
    for bias in (False, True):
        lin = torch.nn.Linear(32, 2 * 24, bias=bias).to(dtype)
        x = torch.randn(2, 5, 32, dtype=dtype)
        a, g = lin(x).chunk(2, -1)
        want = F.gelu(a) * g
        b = interleave(lin.bias.detach()) if bias else None
        got = torch.ops.laya_native.geglu_linear(x, interleave(lin.weight.detach()), b, [128, 2, -1, 0])
        same.append(got.shape == want.shape and torch.equal(got, want))
refusals = []
for args in ((x, torch.ones(5, 32, dtype=x.dtype), None, None), (x, torch.ones(48, 32), None, None),
             (x, interleave(lin.weight.detach()), None, [-1])):
    try:
        torch.ops.laya_native.geglu_linear(*args)
        refusals.append(None)
    except RuntimeError as exc:
        refusals.append(str(exc).splitlines()[0])
print(json.dumps({"same": same, "refusals": refusals}))
"""


def test_the_op_on_the_cpu_is_the_mlp_bit_for_bit_and_refuses_what_does_not_fit(cpu_library):
    import json

    got = json.loads(_fresh(CPU_OP, str(cpu_library)))
    assert got["same"] == [True] * 4
    odd, other_dtype, form = got["refusals"]
    assert "weight must be [2 x intermediate, K], intermediate a multiple of 8, its rows interleaved" in odd
    assert "x is BFloat16 and weight Float: give both one dtype" in other_dtype
    assert "groups of 2" in form


COUNTED = """
import json, sys, torch
torch.ops.load_library(sys.argv[1])
from laya_build.model.native_geglu import interleave
torch.manual_seed(0)
lin = torch.nn.Linear(32, 2 * 24, bias=False)
x = torch.randn(3, 20, 32)
w = interleave(lin.weight.detach())
counts = torch.tensor([20, 0, 7], dtype=torch.int32)
full = torch.ops.laya_native.geglu_linear(x, w, None, None)
got = torch.ops.laya_native.geglu_linear(x, w, None, None, counts)
real = torch.arange(20)[None, :] < counts[:, None]
refusals = []
for args in ((x.view(60, 32), w, None, None, counts), (x, w, None, None, counts.long()),
             (x, w, None, None, counts[:2])):
    try:
        torch.ops.laya_native.geglu_linear(*args)
        refusals.append(None)
    except RuntimeError as exc:
        refusals.append(str(exc).splitlines()[0])
print(json.dumps({"real": torch.equal(got[real], full[real]), "padding": got[~real].abs().sum().item(),
                  "padding_before": full[~real].abs().sum().item(), "refusals": refusals}))
"""


def test_with_counts_the_padding_is_zero_and_the_real_positions_are_the_same_bits(cpu_library):
    got = json.loads(_fresh(COUNTED, str(cpu_library)))
    assert got["real"] is True
    assert got["padding"] == 0 and got["padding_before"] > 0
    flat, dtype, short = got["refusals"]
    assert "[rows, tokens, K] input, and x is [60, 32]: pass x unflattened, or no counts" in flat
    assert "is not an int32 vector of x's 3 rows" in dtype and "is not an int32 vector of x's 3 rows" in short


SKIPPED = """
import copy, json, sys, torch
sys.path.insert(0, "tests/stages")
torch.ops.load_library(sys.argv[1])
from test_varlen_attention import small_model
from test_head import inputs
from laya_build.model import attention, head, native_geglu
base = small_model().eval()
args = inputs(lengths=(48, 30, 17, 5), width=48)
outs, zero, ops = {}, {}, {}
for skip in (False, True):
    model = copy.deepcopy(base)
    attention.use(model, "fused")
    head.use(model, "fused", "all")
    native_geglu.use(model, [-1, 0], skip_padding=skip)
    seen = []
    for layer in model.encoder.layers:
        layer.mlp.Wo.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().clone()))
    with torch.no_grad():
        outs[skip] = model(*args)
        mask = args[1].bool()
        zero[skip] = [bool((s[~mask] == 0).all()) for s in seen]
        ep = torch.export.export(model, args)
        again = ep.module()(*args)
    calls = [n for n in ep.graph.nodes if n.target is torch.ops.laya_native.geglu_linear.default]
    ops[skip] = {"calls": len(calls), "with_counts": sum(len(n.args) == 5 for n in calls),
                 "exported_same": all(torch.equal(a, b) for a, b in zip(again, outs[skip])),
                 "held": [l.mlp.laya_counts is None for l in model.encoder.layers]}
print(json.dumps({"same": all(torch.equal(a, b) for a, b in zip(outs[False], outs[True])), "zero": zero, "ops": ops}))
"""


def test_skipping_padding_leaves_the_models_outputs_the_same_bits_and_the_export_hands_the_op_its_counts(
    cpu_library,
):
    """The real positions never read a padding position's MLP output: the decision model's
    outputs with the op told the rows' real positions are the bits of those without, while every
    layer's MLP output at padding is 0; the exported program passes the counts to every call and
    computes the same; no forward leaves its counts on the MLPs."""
    got = json.loads(_fresh(SKIPPED, str(cpu_library)))
    assert got["same"] is True
    assert got["zero"]["true"] == [True] * 4 and got["zero"]["false"] == [False] * 4
    plain, skipped = got["ops"]["false"], got["ops"]["true"]
    assert plain["calls"] == skipped["calls"] == 4 and (plain["with_counts"], skipped["with_counts"]) == (0, 4)
    assert plain["exported_same"] and skipped["exported_same"]
    assert skipped["held"] == [True] * 4


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"native_geglu": {}, "attention": {"cuda": "fused"}}, "export.native_geglu.cuda is off"),
        ({"native_geglu": {"cuda": True}, "attention": {"cuda": "sdpa"}}, "export.attention.cuda is sdpa"),
    ],
)
def test_skipping_padding_is_refused_without_the_op_or_the_counts(settings, says):
    from laya_build.errors import ConfigError
    from laya_build.stages.export import padding_skipped

    with pytest.raises(ConfigError, match=re.escape(says)):
        padding_skipped({"skip_padding": {"cuda": True}, **settings}, "cuda")
    assert padding_skipped({"skip_padding": {"cuda": False}, **settings}, "cuda") is False
    assert (
        padding_skipped(
            {"skip_padding": {"cuda": True}, "native_geglu": {"cuda": 256}, "attention": {"cuda": "fused"}}, "cuda"
        )
        is True
    )


BY_SIZE = """
import json, sys, types, torch
import torch.nn.functional as F
from torch.export import Dim
from laya_build.model import native_geglu
from laya_build.stages.children.package import restore_symbol_hints
torch.ops.load_library(sys.argv[1])
torch.manual_seed(0)
LEAST = 64  # positions: 2 x 16 below it, 2 x 32 and 2 x 128 from it on


class MLP(torch.nn.Module):  # ModernBERT's, with its Wi, act, drop and Wo
    def __init__(self, bias):
        super().__init__()
        self.Wi, self.act, self.drop = torch.nn.Linear(32, 2 * 24, bias=bias), torch.nn.GELU(), torch.nn.Identity()
        self.Wo = torch.nn.Linear(24, 32)

    def forward(self, x):
        a, g = self.Wi(x).chunk(2, -1)
        return self.Wo(self.drop(self.act(a) * g))


class Model(torch.nn.Module):
    def __init__(self, bias):
        super().__init__()
        self.encoder = torch.nn.Module()
        self.encoder.layers = torch.nn.ModuleList([torch.nn.Module()])
        self.encoder.layers[0].mlp = MLP(bias)

    def forward(self, x):
        return self.encoder.layers[0].mlp(x)


out = {}
for bias in (False, True):
    model = Model(bias).eval()
    sizes = [torch.randn(2, t, 32) for t in (16, 32, 128)]
    with torch.no_grad():
        want = [model(x) for x in sizes]
        native_geglu.use(model, [-1, 0], least=LEAST)
        ep = torch.export.export(model, (sizes[1],), dynamic_shapes=({1: 16 * Dim("t", min=1, max=8)},))
        conds = [n for n in ep.graph.nodes if n.target is torch.ops.higher_order.cond]
        branches = {name: [str(n.target) for n in getattr(ep.graph_module, name).graph.nodes]
                    for name in (conds[0].args[1].target, conds[0].args[2].target)} if conds else {}
        eager = [max((model(x) - w).abs().max().item() for x, w in zip(sizes, want))]
        torch.export.save(ep, sys.argv[2] + f"/ep-{bias}.pt2")
        loaded = torch.export.load(sys.argv[2] + f"/ep-{bias}.pt2")
        restore_symbol_hints(loaded)
        path = torch._inductor.aoti_compile_and_package(loaded, package_path=sys.argv[2] + f"/pk-{bias}.pt2")
        package = torch._inductor.aoti_load_package(path)
        aoti = [(package(x) - w).abs().max().item() for x, w in zip(sizes, want)]
    out[str(bias)] = {"conds": len(conds), "branches": branches, "eager": eager, "aoti": aoti}
print(json.dumps(out))
"""


def test_from_a_least_number_of_positions_the_op_runs_and_below_it_a_plain_linear_layer(cpu_library, tmp_path):
    """``native_geglu.use(..., least=N)``: each MLP is a ``torch.cond`` on its input's positions,
    the op from N on and a plain linear layer of the interleaved weight with the gated GELU of its
    blocks below; exported, saved, loaded and compiled by AOTInductor, the program gives the
    module's outputs on both sides of N, with and without a bias."""
    import json

    got = json.loads(_fresh(BY_SIZE, str(cpu_library), str(tmp_path)))
    for bias, run in got.items():
        assert run["conds"] == 1, bias
        native_branch, plain_branch = run["branches"].values()
        assert "laya_native.geglu_linear.default" in native_branch
        assert "laya_native.geglu_linear.default" not in plain_branch and "aten.linear.default" in plain_branch
        assert max(run["eager"]) < 1e-5 and max(run["aoti"]) < 1e-5, (bias, run)


def test_the_plain_form_is_the_mlps_gated_gelu_of_the_interleaved_weight():
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 2 * 24)
    x = torch.randn(3, 5, 32)
    a, g = lin(x).chunk(2, -1)
    got = native_geglu.plain(x, native_geglu.interleave(lin.weight), native_geglu.interleave(lin.bias), torch.nn.GELU())
    assert got.shape == (3, 5, 24) and torch.allclose(got, torch.nn.functional.gelu(a) * g, atol=1e-6)


CONFIG_NAMES = """
import ctypes, json, sys, torch
torch.ops.load_library(sys.argv[1])  # the op's library, as a serving process loads it
lib = ctypes.CDLL(sys.argv[1])
if not hasattr(lib, "laya_native_geglu_configs"):
    print(json.dumps(None))
else:
    lib.laya_native_geglu_config_name.restype = ctypes.c_char_p
    n = lib.laya_native_geglu_configs()
    names = [lib.laya_native_geglu_config_name(i).decode() for i in range(n)]
    print(json.dumps({"names": names, "past_the_end": lib.laya_native_geglu_config_name(n),
                      "op": torch.ops.laya_native.geglu_linear.default.name(),
                      "registered": list(torch.ops.laya_native.cutlass_configs("geglu")),
                      "linear": list(torch.ops.laya_native.cutlass_configs("linear"))}))
"""


def _configs(path: Path):
    """The library's launch configurations and op, as a fresh process (without a GPU) sees them;
    None where it holds no CUDA kernels.  (A process holds one library of the namespace: never
    loaded into the test's own.)"""
    import json

    return json.loads(_fresh(CONFIG_NAMES, str(path)))


def test_a_library_without_cuda_kernels_holds_none_of_their_symbols(cpu_library):
    assert _configs(cpu_library) is None
    names = _fresh(
        "import json, sys, torch; torch.ops.load_library(sys.argv[1]); "
        "print(json.dumps([list(torch.ops.laya_native.cutlass_configs(op)) for op in ('geglu', 'linear')]))",
        str(cpu_library),
    )
    assert names == "[[], []]"


def _model(activation="gelu", dtype=torch.bfloat16, bias=False, layers=2, intermediate=16):
    wi = torch.zeros(2 * intermediate, 4)
    mlp = SimpleNamespace(Wi=SimpleNamespace(weight=wi, bias=torch.zeros(2 * intermediate) if bias else None))
    return SimpleNamespace(
        encoder=SimpleNamespace(
            config=SimpleNamespace(hidden_activation=activation),
            embeddings=SimpleNamespace(tok_embeddings=SimpleNamespace(weight=torch.zeros(1, dtype=dtype))),
            layers=[SimpleNamespace(mlp=mlp)] * layers,
        )
    )


@pytest.mark.parametrize(
    ("model", "target", "says"),
    [
        (_model(activation="silu"), "cpu", "hidden_activation is 'silu': set export.native_geglu.cpu to false"),
        (_model(intermediate=12), "cpu", "in blocks of 8 and this model's intermediate_size is 12"),
        (_model(dtype=torch.float16), "cuda", "CUDA kernel is bfloat16 and this export is float16"),
        (_model(bias=True), "cuda", "adds no bias and this model's MLPs have one"),
    ],
)
def test_an_export_the_kernel_cannot_compute_is_refused_before_anything_is_built(model, target, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        native_geglu.check(model, target)


def test_the_cpu_target_takes_any_dtype_and_mlp_biases():
    native_geglu.check(_model(dtype=torch.float32, bias=True), "cpu")


def test_without_nvcc_the_build_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(native, "tool_path", lambda role: None if role == "nvcc" else shutil.which("g++"))
    with pytest.raises(StageError, match="no nvcc was found on PATH") as caught:
        native.build(tmp_path, cuda_kernels=True)
    assert "turn export.native_geglu.cuda off and empty export.native_cutlass.cuda" in caught.value.hint
    assert not (tmp_path / "liblaya_native.so").exists()


def test_without_cutlass_the_build_names_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTLASS_PATH", str(tmp_path / "nowhere"))
    with pytest.raises(StageError, match=r"CUTLASS_PATH=.*nowhere has no CUTLASS 3 headers") as caught:
        native.cutlass_include()
    assert "CUTLASS_PATH" in caught.value.hint


def test_the_kernels_source_is_compiled_from_a_path_fixed_by_its_content():
    first = native.fixed_source()
    assert first == native.fixed_source()
    assert first.parent.name == sha256_file(native.CUDA_SOURCE)[:16]
    assert first.read_bytes() == native.CUDA_SOURCE.read_bytes()


# The compiles of one step (the CUDA source's parts) run at the same time: each of these two waits
# for the file the other writes, which only two processes running at once get past.
MEET = """
import pathlib, sys, time
pathlib.Path(sys.argv[1]).touch()
start = time.monotonic()
while not pathlib.Path(sys.argv[2]).exists():
    if time.monotonic() - start > float(sys.argv[3]):
        print("alone", sys.argv[1]); sys.exit(3)
    time.sleep(0.01)
print("met", sys.argv[1])
"""


def _meet(tmp_path, wait_s: float) -> list[list[str]]:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    return [[sys.executable, "-c", MEET, a, b, str(wait_s)], [sys.executable, "-c", MEET, b, a, str(wait_s)]]


def test_the_compiles_of_a_step_run_at_the_same_time_up_to_the_jobs_given(tmp_path):
    results, first = native.run_together(_meet(tmp_path, 60), jobs=2)
    assert first is None
    assert [r[:2] for r in results] == [(0, f"met {tmp_path / 'a'}\n"), (0, f"met {tmp_path / 'b'}\n")]

    (tmp_path / "a").unlink(), (tmp_path / "b").unlink()
    results, first = native.run_together(_meet(tmp_path, 1), jobs=1)  # one at a time: the first waits alone
    assert first == 0 and results[0][:2] == (3, f"alone {tmp_path / 'a'}\n") and results[0][2] >= 1
    assert results[1][0] is None, "after a failure the compiles not started yet do not start"
    assert not (tmp_path / "b").exists()


def test_the_first_compile_that_fails_ends_the_others_of_its_step(tmp_path):
    import signal
    import time

    slow = [sys.executable, "-c", "import time; time.sleep(120)"]
    bad = [sys.executable, "-c", "import sys; print('no such kernel'); sys.exit(2)"]
    start = time.monotonic()
    results, first = native.run_together([slow, bad], jobs=2)
    assert time.monotonic() - start < 60
    assert first == 1 and results[1][:2] == (2, "no such kernel\n")
    assert results[0][0] == -signal.SIGTERM


def test_a_failed_compile_names_its_status_and_output_and_the_steps_after_it_do_not_run(tmp_path):
    log, after = tmp_path / "native_build.log", tmp_path / "linked"
    ok = [sys.executable, "-c", "print('part 0 compiled')"]
    bad = [sys.executable, "-c", "import sys; print('error: part 1'); sys.exit(2)"]
    link = [sys.executable, "-c", f"open({str(after)!r}, 'w')"]
    with pytest.raises(StageError, match=r"failed with exit status 2:\nerror: part 1") as caught:
        native.compile_library([[ok, bad], [link]], str(log), jobs=1)  # one at a time: ok ends before bad fails
    assert str(log) in caught.value.hint
    text = log.read_text()
    assert text.index("part 0 compiled") < text.index("error: part 1"), "the log keeps the commands' order"
    assert re.search(r"part 0 compiled\n# exit status 0 in [\d.]+ s\n", text)
    assert not after.exists()


def test_the_cuda_source_names_how_many_parts_it_compiles_in():
    parts = native.cuda_parts()
    assert parts >= 2
    source = native.CUDA_SOURCE.read_text()
    assert all(f"#elif LAYA_PART == {p}" in source for p in range(1, parts))
    assert f"#elif LAYA_PART == {parts}" not in source
    command = native.cuda_compile_command(Path("part.o"), 3) if shutil.which("nvcc") else None
    if command is not None:
        assert "-DLAYA_PART=3" in command and "-frandom-seed=laya_native.3" in command


# ---------------------------------------------------------------------- with nvcc and CUTLASS here


def _cuda_toolchain() -> str | None:
    """Why the CUDA kernels cannot be compiled here, or None."""
    if shutil.which("nvcc") is None:
        return "no nvcc on PATH"
    try:
        native.cutlass_include()
        native.cuda_library_dir()
    except StageError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="module")
def cuda_library(tmp_path_factory):
    if (reason := _cuda_toolchain()) is not None:
        pytest.skip(f"the CUDA kernels cannot be compiled here: {reason}")
    out = tmp_path_factory.mktemp("native-cuda")
    record = native.build(out, cuda_kernels=True)
    return out / record["path"], record


def test_the_library_with_cuda_kernels_loads_without_a_gpu_and_names_its_configurations(cuda_library):
    path, record = cuda_library
    assert record["cuda_source"] == {"path": native.CUDA_SOURCE_REL, "sha256": sha256_file(native.CUDA_SOURCE)}
    assert record["cuda_parts"] == native.cuda_parts()
    log = (path.parent / "native_build.log").read_text()
    assert [int(p) for p in re.findall(r"-DLAYA_PART=(\d+) ", log)] == list(range(native.cuda_parts()))
    assert len(re.findall(r"^# exit status 0 in [\d.]+ s$", log, re.MULTILINE)) == native.cuda_parts() + 1
    assert record["cutlass"].count(".") == 2 and record["cuda_compiler"]
    got = _configs(path)
    names = got["names"]
    assert got["registered"] == names, "the op names what the C entry points hold"
    assert len(names) >= 2 and all(re.match(r"(cooperative|pingpong) \d+x\d+x64 cluster \dx\d$", n) for n in names)
    assert len(set(names)) == len(names)
    assert got["past_the_end"] is None and got["op"] == "laya_native::geglu_linear"
    from laya_build.config.sections import section

    defaults = section("export", None)["cutlass_configs"]
    assert max(defaults["geglu"][1::2]) < len(names), "the default configurations exist"
    assert got["linear"] and max(defaults["linear"][1::2]) < len(got["linear"])


def test_the_library_with_cuda_kernels_is_the_same_bytes_from_another_checkout_and_on_one_core(
    cuda_library, tmp_path, monkeypatch
):
    path, _ = cuda_library
    elsewhere = tmp_path / "checkout" / "laya_build" / "native"
    elsewhere.mkdir(parents=True)
    for source in (native.SOURCE, native.CUDA_SOURCE):
        shutil.copy2(source, elsewhere / source.name)
    monkeypatch.setattr(native, "SOURCE", elsewhere / native.SOURCE.name)
    monkeypatch.setattr(native, "CUDA_SOURCE", elsewhere / native.CUDA_SOURCE.name)
    monkeypatch.setattr(native, "usable_cores", lambda: 1)  # and on one core: the parts one after the other
    record = native.build(tmp_path / "out", cuda_kernels=True)
    assert record["sha256"] == sha256_file(path)
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith((".cuda-", ".lib"))]


def test_every_kernel_is_compiled_for_hopper_without_spills(cuda_library):
    path, _ = cuda_library
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is None:
        try:
            from triton.backends.nvidia import __file__ as nvidia  # Triton ships one

            bundled = Path(nvidia).parent / "bin" / "cuobjdump"
            cuobjdump = str(bundled) if bundled.is_file() else None
        except ImportError:
            pass
    if cuobjdump is None:
        pytest.skip("no cuobjdump (the CUDA toolkit's, or Triton's) to read the kernels with")
    listing = subprocess.run([cuobjdump, "-res-usage", str(path)], capture_output=True, text=True, check=True).stdout
    kernels = re.findall(r"Function (\S+):\n\s*(REG:\d+ STACK:\d+ SHARED:\d+ LOCAL:\d+)", listing)
    geglu = [name for name, _ in kernels if "GegluEpilogue" in name]
    stream_k = [name for name, _ in kernels if "StreamKScheduler" in name]
    assert len(geglu) == len(_configs(path)["names"]), listing[:2000]
    assert len(stream_k) == 4, "linear's: two tiles, each with and without the residual"
    assert len(kernels) == len(geglu) + len(stream_k)
    for name, usage in kernels:
        assert "STACK:0 " in usage and "LOCAL:0" in usage, f"{name}: {usage}"
    elf = subprocess.run([cuobjdump, "-lelf", str(path)], capture_output=True, text=True, check=True).stdout
    assert elf.count(".sm_90.cubin") == native.cuda_parts(), "one cubin a part, each kernel in one of them"
    sass = subprocess.run([cuobjdump, "-sass", str(path)], capture_output=True, text=True, check=True).stdout
    for kernel in sass.split("Function : ")[1:]:  # Hopper's own: warpgroup MMA, TMA loads, register reallocation
        assert all(op in kernel for op in ("HGMMA", "UTMALDG", "USETMAXREG")), kernel[:200]


@pytest.mark.parametrize(
    ("configs", "says"),
    [
        ({"geglu": [256, 2, -1], "linear": [-1, 0]}, "export.cutlass_configs.geglu holds 3 integers, not [m_max"),
        ({"geglu": [-1, -1], "linear": [-1, 0]}, "names configuration -1, cuBLASLt, which the gated GELU kernel"),
        ({"geglu": [-1, 0], "linear": [256, -1, -1, 9]}, "export.cutlass_configs.linear names configuration 9, "),
    ],
)
def test_launch_configurations_the_library_does_not_hold_are_refused(monkeypatch, configs, says):
    from laya_build.errors import ConfigError
    from laya_build.stages.export import cutlass_configs

    held = {"geglu": ["g0", "g1"], "linear": ["l0", "l1", "l2"]}
    monkeypatch.setattr(torch.ops, "laya_native", SimpleNamespace(cutlass_configs=held.get), raising=False)
    with pytest.raises(ConfigError, match=re.escape(says)):
        cutlass_configs({"cutlass_configs": configs}, ["geglu", "linear"], cuda_kernels=True)


def test_the_record_names_the_configurations_an_export_calls(monkeypatch):
    from laya_build.stages.export import cutlass_configs

    held = {"geglu": ["g0", "g1", "g2"], "linear": ["l0", "l1"]}
    monkeypatch.setattr(torch.ops, "laya_native", SimpleNamespace(cutlass_configs=held.get), raising=False)
    cfg = {"cutlass_configs": {"geglu": [256, 2, -1, 0], "linear": [256, -1, -1, 1]}}
    got = cutlass_configs(cfg, ["geglu", "linear"], cuda_kernels=True)
    assert got == {
        "geglu": [256, 2, -1, 0],
        "linear": [256, -1, -1, 1],
        "names": {"geglu 2": "g2", "geglu 0": "g0", "linear 1": "l1"},
    }
    assert cutlass_configs(cfg, ["linear"], cuda_kernels=False) == {"linear": [256, -1, -1, 1], "names": {}}
    assert cutlass_configs(cfg, [], cuda_kernels=True) is None


TILES_CHECK = """
#define LAYA_PADDING_TILES_ONLY
#include "{source}"
#include <cstdio>
#include <random>
#include <vector>

using namespace laya_padding;

// One call as the kernel runs it: ``grid`` CTAs, each from its own index, a grid's length at a
// time, computing work_of's tiles; each computed tile zeroing zeroed_by's.  Every row tile with a
// real position (by brute force over the positions) must be computed once in each column, every
// other one zeroed once in each column and never computed, the padding flagged where it is.
int check(const std::vector<int>& counts, int tokens, int tile_m, int tiles_n, int grid) {
  const int rows = int(counts.size()), M = rows * tokens, tiles_m = (M + tile_m - 1) / tile_m;
  Padding p{counts.data(), rows, tokens, true};
  std::vector<int> real(tiles_m, 0);
  bool any = false;
  for (int m = 0; m < M; ++m) {
    const bool pad = m % tokens >= counts[m / tokens];
    if (pad != is_padding(p, m)) return 1;
    if (!pad) real[m / tile_m] = 1, any = true;
  }
  if (!any) real[0] = 1;  // no real position: tile 0 is computed
  const uint64_t tiles = real_tiles(p, tile_m);
  std::vector<int> computed(tiles_m * tiles_n, 0), zeroed(tiles_m * tiles_n, 0);
  for (int cta = 0; cta < grid; ++cta) {
    int m = 0, n = 0;
    for (uint64_t index = cta; work_of(tiles, tiles_n, index, m, n); index += grid) {
      if (m < 0 || m >= tiles_m || n < 0 || n >= tiles_n) return 2;
      ++computed[m * tiles_n + n];
      for (uint64_t mine = zeroed_by(tiles, tiles_m, m); mine != 0; mine &= mine - 1) {
        ++zeroed[lowest(mine) * tiles_n + n];
      }
    }
  }
  for (int t = 0; t < tiles_m; ++t) {
    if (((tiles >> t) & 1) != uint64_t(real[t])) return 3;
    for (int n = 0; n < tiles_n; ++n) {
      const int c = computed[t * tiles_n + n], z = zeroed[t * tiles_n + n];
      if (real[t] ? (c != 1 || z != 0) : (c != 0 || z != 1)) return 4;
    }
  }
  return 0;
}

int main() {
  std::mt19937 rng(1234);
  int cases = 0, bad = 0;
  const int tiles[] = {64, 128, 256};
  for (int round = 0; round < 3000; ++round) {
    const int rows = 1 + int(rng() % 8), tokens = 16 * (1 + int(rng() % 32)), tile_m = tiles[rng() % 3];
    if ((rows * tokens + tile_m - 1) / tile_m > kMaxTiles) continue;
    std::vector<int> counts(rows);
    for (int& c : counts) {
      const int kind = int(rng() % 5);  // none, all, more than all, a few, any
      c = kind == 0 ? 0 : kind == 1 ? tokens : kind == 2 ? tokens + 7 : kind == 3 ? 1 + int(rng() % 16)
                                                                                 : int(rng() % (tokens + 1));
    }
    const int tiles_n = 1 + int(rng() % 30), grid = 1 + int(rng() % 140);
    const int why = check(counts, tokens, tile_m, tiles_n, grid);
    ++cases;
    if (why != 0 && bad++ < 5) std::printf("failed %d: rows %d tokens %d tile %d\\n", why, rows, tokens, tile_m);
  }
  // the saved 7 x 256 batch at 128-row tiles: 9 of 14 row tiles computed
  const std::vector<int> saved{29, 48, 42, 134, 167, 71, 124};
  Padding p{saved.data(), 7, 256, true};
  std::printf("cases %d bad %d saved %d %d\\n", cases, bad, ones(real_tiles(p, 128)), check(saved, 256, 128, 28, 132));
  return bad != 0;
}
"""


def test_the_computed_row_tiles_are_those_with_a_real_position_and_every_other_one_is_zeroed_once(tmp_path):
    """The skipping scheduler's and epilogue's arithmetic (host and device code of the kernels'
    source, built for the host with the C++ compiler): over random rows, counts (none real, all,
    more than the row, a few, any), row tiles of 64, 128 and 256 positions, column tiles and grid
    sizes, every row tile with a real position is computed once in each column and every other
    one zeroed once and never computed; the padding flag agrees with the counts."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    program = tmp_path / "tiles_check.cc"
    program.write_text(TILES_CHECK.replace("{source}", str(native.CUDA_SOURCE)))
    exe = tmp_path / "tiles_check"
    subprocess.run([compiler, "-std=c++17", "-O1", "-x", "c++", str(program), "-o", str(exe)], check=True, timeout=300)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout
    cases, bad, saved, saved_check = re.match(r"cases (\d+) bad (\d+) saved (\d+) (\d+)", proc.stdout).groups()
    assert int(cases) > 1000 and bad == "0"
    assert (saved, saved_check) == ("9", "0")


LAYOUT_CHECK = """
#include "{source}"
#include <cstdio>

// Every thread's accumulator fragment, as the epilogue reads it: for i a multiple of 8 and r 0 or
// 2, values i + r, i + r + 1 must be one row's columns n, n + 1 of an input block (n % 16 < 8, n
// even) and values i + r + 4, i + r + 5 the same row's columns n + 8, n + 9: their gates.
template <class Config>
int check(int index) {
  using namespace cute;
  using TiledMma = typename Config::Mainloop::TiledMma;
  using Tile = typename Config::Mainloop::TileShape;
  TiledMma mma;
  int bad = 0, pairs = 0;
  for (int t = 0; t < int(size(mma)); ++t) {
    auto c = mma.get_thread_slice(t).partition_C(make_identity_tensor(make_shape(size<0>(Tile{}), size<1>(Tile{}))));
    for (int i = 0; i < int(size(c)); i += 8) {
      for (int r = 0; r < 4; r += 2, ++pairs) {
        auto a = c(i + r);  // an input block's column n (n % 16 < 8, even), n + 1, their gates 8 on
        bool ok = get<1>(a) % 16 < 8 && get<1>(a) % 2 == 0;
        for (int v = 1; v < 6; ++v) {
          if (v == 2 || v == 3) continue;
          auto b = c(i + r + v);
          ok = ok && get<0>(b) == get<0>(a) && get<1>(b) == get<1>(a) + (v % 4) + (v >= 4 ? 8 : 0);
        }
        bad += !ok;
      }
    }
  }
  printf("%d %d %d %d\\n", index, int(size(mma)), pairs, bad);
  return bad;
}

template <size_t... I>
int check_all(std::index_sequence<I...>) {
  return (check<std::tuple_element_t<I, laya_cuda::GegluConfigs>>(I) + ...);
}

int main() { return check_all(std::make_index_sequence<laya_cuda::kConfigs>{}) != 0; }
"""


def test_every_thread_holds_two_adjacent_outputs_inputs_and_gates_where_the_epilogue_reads_them(tmp_path):
    """The GEGLU epilogue's premise, for every launch configuration and every thread: CuTe's own
    partition of the tile (host code, no GPU needed) puts two adjacent outputs' input products at
    fragment values i + r, i + r + 1 and their gates at i + r + 4, i + r + 5."""
    if (reason := _cuda_toolchain()) is not None:
        pytest.skip(f"the CUDA kernels cannot be compiled here: {reason}")
    program = tmp_path / "layout_check.cu"
    program.write_text(LAYOUT_CHECK.replace("{source}", str(native.CUDA_SOURCE)))
    include = native.cutlass_include()
    exe = tmp_path / "layout_check"
    subprocess.run(
        [
            native.nvcc(),
            *native.NVCC_FLAGS,
            f"-isystem={include}",
            f"-isystem={include.parent / 'tools' / 'util' / 'include'}",
            str(program),
            "-o",
            str(exe),
            f"-L{native.cuda_library_dir()}",
            *(flag for flag in native.CUDA_LINK if flag.startswith("-l")),  # the libraries, for nvcc
            "-ldl",
        ],
        check=True,
        capture_output=True,
        timeout=900,
    )
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    rows = [list(map(int, line.split())) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0, proc.stdout
    assert [r[0] for r in rows] == list(range(len(rows))) and len(rows) >= 2
    for index, threads, pairs, bad in rows:
        assert threads in (128, 256) and pairs > 0 and bad == 0, (index, threads, pairs, bad)


def test_the_probe_suggests_the_fastest_configuration_of_each_op_at_each_row_count():
    from benchmarks.native_cutlass_probe import SMALL, suggest

    def row(op, m, config, us=None, **more):
        return {"op": op, "M": m, "config": config, **({"us": us} if us is not None else {"error": "x"}), **more}

    rows = [
        {"op": "geglu", "M": 128, "name": "cublas, geglu", "us": 1.0},  # no configuration: not a candidate
        row("geglu", 128, 0, 9.0),
        row("geglu", 128, 2, 7.5),
        row("geglu", 1792, 0, 30.0),
        row("geglu", 1792, 2, 31.0),
        row("geglu", 1792, 4),  # failed: a row without a time does not win
    ]
    for m, times in ((128, {-1: 4.0, 0: 6.0}), (1792, {-1: 10.0, 0: 8.0, 1: 8.5})):
        for gemm in ("attn_out", "mlp_out"):
            for residual in (False, True):
                rows += [row("linear", m, c, us, gemm=gemm, residual=residual) for c, us in times.items()]
    rows.append(row("linear", 1792, 3, 1.0, gemm="attn_out", residual=False))  # timed for one GEMM only
    rows += [row("wi", m, c, 0.5, gemm="Wi", residual=False) for m in (128, 1792) for c in (1, 2)]  # no op's
    assert suggest(rows) == {"geglu": [SMALL, 2, -1, 0], "linear": [SMALL, -1, -1, 0]}
    assert suggest([r for r in rows if r["op"] == "linear" and r["M"] == 128]) == {}


def test_the_probes_candidates_rewrite_the_geglu_table_and_its_parts_of_the_cuda_source():
    import re

    from benchmarks.native_cutlass_probe import candidate_name, candidate_source, parse_candidate
    from laya_build import native

    text = native.CUDA_SOURCE.read_text()
    committed = re.findall(r'^    "((?:cooperative|pingpong) [^"]+)",$', text, re.MULTILINE)
    assert len(committed) == 10
    # every name of the committed table reads back as itself: the probe can name them beside new ones
    assert [candidate_name(parse_candidate(name)) for name in committed] == committed
    lines = [
        committed[7],
        "cooperative 128x192x64 cluster 1x1 raster N swizzle 4",
        "pingpong 64x192x64 cluster 2x2 stages 4",
    ]
    source = candidate_source(text, [parse_candidate(line) for line in lines])
    table = source[source.index("// laya-geglu-table: begin") : source.index("// laya-geglu-table: end")]
    assert "Config3" not in table and re.findall(r'^    "([^"]+)",$', table, re.MULTILINE) == lines
    assert "Kernel<Shape<_128, _192, _64>, Shape<_1, _1, _1>, Cooperative, Raster::AlongN, 4, 0>" in table
    assert "Kernel<Shape<_64, _192, _64>, Shape<_2, _2, _1>, Pingpong, Raster::Heuristic, 1, 4>" in table
    # the first two differ only in the order of tiles: one kernel, one part; the linear op's two parts stay
    assert re.search(r"^#define LAYA_PARTS 4$", source, re.MULTILINE)
    assert "#define LAYA_PART_2(X) X(run<Config0>, GEGLU) X(run<Config1>, GEGLU)\n" in source
    assert "#define LAYA_PART_3(X) X(run<Config2>, GEGLU)\n" in source
    assert source.count("X(run_linear<Linear0>, LINEAR)") == 1 and "LAYA_PART_4" not in source
    for part in range(1, 4):
        assert f"#elif LAYA_PART == {part}\nLAYA_PART_{part}(LAYA_DEFINE)\n" in source
        assert f"LAYA_PART_{part}(LAYA_DECLARE)" in source
    # outside the two marked regions the source is the library's
    assert source[: source.index("// laya-geglu-table: begin")] == text[: text.index("// laya-geglu-table: begin")]
    assert source[source.index("// laya-geglu-parts: end") :] == text[text.index("// laya-geglu-parts: end") :]


@pytest.mark.parametrize(
    "line",
    ["cooperative 128x192", "cooperative 128x192x64 cluster 3x1", "warped 64x64x64", "cooperative 128x192x64 raster X"],
)
def test_a_candidate_that_is_not_a_launch_configuration_is_refused_with_the_form_to_write(line):
    from benchmarks.native_cutlass_probe import parse_candidate

    with pytest.raises(ValueError, match=r"is not a launch configuration: write e\.g\. 'cooperative 128x192x64"):
        parse_candidate(line)


def test_an_export_with_a_least_number_of_positions_records_it_and_each_mlp_is_a_cond(cpu_library, tmp_path):
    """The export stage with ``export.native_geglu.cpu`` a number: the record says the number, and
    each encoder layer's MLP in the saved program is a cond whose one branch calls the op."""
    from laya_build.records import read_record
    from tests.stage_calls import run_export, run_model

    run_model({}, tmp_path / "model")
    run_export(
        {"native_geglu": {"cpu": 64}},
        tmp_path / "model" / "checkpoint",
        tmp_path / "model" / "inputs.pt",
        tmp_path / "export",
        "cpu",
        "float32",
    )
    record = read_record(tmp_path / "export" / "export.json")
    assert record["native_geglu"] == 64
    counted = _fresh(
        "import json, sys, torch\n"
        "torch.ops.load_library(sys.argv[1])\n"
        "from laya_build.model import native_linear\n"
        "native_linear.register_fake()\n"
        "ep = torch.export.load(sys.argv[2])\n"
        "conds = [n for n in ep.graph.nodes if n.target is torch.ops.higher_order.cond]\n"
        "calls = [n for c in conds for n in getattr(ep.graph_module, c.args[1].target).graph.nodes\n"
        "         if 'geglu_linear' in str(n.target)]\n"
        "print(json.dumps([len(conds), len(calls)]))",
        str(tmp_path / "export" / record["native_library"]["path"]),
        str(tmp_path / "export" / "exported.pt2"),
    )
    conds, calls = json.loads(counted)
    assert conds == calls == 2  # the generated model's two encoder layers (laya_build/model/defaults.yaml)
