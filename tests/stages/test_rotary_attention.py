"""Rotary and attention as one op (laya_build.model.rotary_attention, export.attention.cuda: fused).

On the CPU the op runs its reference (transformers' rotary, SDPA with the boolean masks): the
model's outputs must be sdpa's bit for bit, with right padding of several lengths and local
layers whose window is narrower than the sequence.  The Triton kernel itself runs here in
Triton's interpreter (numpy on the CPU) against that reference, at launch configurations whose
query and key blocks differ, on rows that are full, padded, one position and empty; on a GPU
the same in bf16 compiled.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from laya_build import PROJECT_ROOT
from laya_build.model import attention, rotary

pytestmark = pytest.mark.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(__file__))
from test_varlen_attention import batch, exported, small_model  # noqa: E402  (the same small model)


@pytest.mark.parametrize("mode", ["computed", "table"])
def test_fused_gives_the_sdpa_outputs_bit_for_bit_with_one_op_a_layer(mode, monkeypatch):
    from laya_build.model import rotary_attention

    model = small_model()
    rotary.use(model, mode)
    args = batch()
    with torch.no_grad():
        expected = model(*args)
        attention.use(model, "fused")
        seen, counted = [], []
        real, counts = rotary_attention.reference, attention.row_key_counts
        monkeypatch.setattr(rotary_attention, "reference", lambda *a: (seen.append((a[3].tolist(), a[5])), real(*a))[1])
        monkeypatch.setattr(attention, "row_key_counts", lambda *a, **k: (counted.append(1), counts(*a, **k))[1])
        attention.register()  # the mask function as patched
        got = model(*args)
    assert model.encoder.config._attn_implementation == attention.FUSED_NAME
    # every layer ran the op on the packed Wqkv output, with the rows' key counts and its window
    assert seen == [([48, 30, 17], -1), ([48, 30, 17], 8), ([48, 30, 17], 8), ([48, 30, 17], -1)]
    assert len(counted) == 1  # once a forward, not once a layer or a kind of layer
    for e, g in zip(expected, got):
        assert torch.equal(e, g)


def test_fused_exports_as_one_op_a_layer_with_dynamic_rows_and_tokens():
    model = small_model()
    attention.use(model, "fused")
    program = exported(model)
    ops = [n for n in program.graph.nodes if n.target is torch.ops.laya.rotary_attention.default]
    assert len(ops) == 4
    sdpa = [n for n in program.graph.nodes if n.target is torch.ops.aten.scaled_dot_product_attention.default]
    assert len(sdpa) == 1  # the decision head's one layer: none in the encoder
    other = batch((32, 9), width=32)  # another row count and width than the traced example
    with torch.inference_mode():
        for e, g in zip(small_model()(*other), program.module()(*other)):
            torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("order", ["attention first", "rotary first"])
def test_fused_with_tables_gathers_their_halves_once_a_forward_for_every_layer(order):
    """With the tabulated rotary the fused layers read the tables' first halves from one
    ``laya::rotary_rows`` op a forward, for every kind of layer: the exported program holds one,
    each layer reads its kind's cos and sin from it (the global layers other rows than the local
    ones), and no table is indexed besides.  The table is told by the export (``halves``) when it
    comes after the attention, by the attention when it comes before."""
    model = small_model()
    reference = small_model()
    steps = [lambda: attention.use(model, "fused"), lambda: rotary.use(model, "table", halves=True)]
    for step in steps if order == "attention first" else steps[::-1]:
        step()
    assert model.encoder.rotary_emb.halves
    attention.use(model, "fused")  # again: the halves are not checked (or halved) twice
    program = exported(model)
    nodes = program.graph.nodes
    rows = [n for n in nodes if n.target is torch.ops.laya.rotary_rows.default]
    assert len(rows) == 1
    layers = [n for n in nodes if n.target is torch.ops.laya.rotary_attention.default]
    assert len(layers) == 4
    picked = []
    for layer in layers:  # cos and sin: two tables of the one rotary_rows
        cos, sin = layer.args[1:3]
        assert cos.args[0] is rows[0] and sin.args[0] is rows[0], layer.args[1:3]
        assert cos.target is sin.target is torch.ops.aten.select.int and sin.args[2] == cos.args[2] + 1
        picked.append(cos.args[2])
    kinds = model.encoder.config.layer_types  # every third layer global (small_model)
    assert [picked[i] for i, kind in enumerate(kinds) if kind == "full_attention"] == [0, 0]
    assert [picked[i] for i, kind in enumerate(kinds) if kind == "sliding_attention"] == [2, 2]
    index = [n for n in nodes if n.target is torch.ops.aten.index.Tensor]
    assert not index, [n.args for n in index]
    other = batch((32, 9), width=32)
    with torch.inference_mode():
        for e, g in zip(reference(*other), program.module()(*other)):
            torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
        for args in (other, batch((16, 5), width=16)):  # eager, two shapes: nothing of one forward is kept
            for e, g in zip(reference(*args), model(*args)):
                torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
    assert model.encoder.rotary_emb._pending is None


def test_rotary_rows_are_the_tables_rows_at_the_positions():
    from laya_build.model import rotary_attention as ra

    tables = torch.randn(3, 40, 4)
    ids = torch.tensor([[0, 3, 39], [5, 5, 1]])
    rows = torch.ops.laya.rotary_rows(tables, ids)
    assert rows.shape == (3, 2, 3, 4)
    for t in range(3):
        assert torch.equal(rows[t], tables[t][ids])
    with pytest.raises(RuntimeError, match=r"tables must be \[T, P, H\]"):
        ra.rotary_rows(tables[0], ids)


def test_a_halved_table_keeps_only_the_halves_and_stays_halved():
    model = small_model()
    rotary.use(model, "table")
    table = model.encoder.rotary_emb
    whole = {name: buf.clone() for name, buf in table.named_buffers()}
    table.halves = True
    assert [name for name, _ in table.named_buffers()] == ["halves_tables"]
    expected = [whole[f"{kind}_{fn}"][:, :8] for kind in table.types for fn in ("cos", "sin")]
    assert torch.equal(table.halves_tables, torch.stack(expected))
    table.halves = True  # again: nothing changes
    assert torch.equal(table.halves_tables, torch.stack(expected))
    with pytest.raises(ValueError, match="cannot give whole tables again"):
        table.halves = False


def reads_directly(node, source) -> bool:
    """Whether ``node`` reads ``source`` through elementwise, cast and view ops only (a sum of
    the mask, however it was compared, cast or sliced first)."""
    passes = ("aten.ne", "aten.eq", "aten._to_copy", "aten.slice", "aten.view", "aten.alias", "aten.to")
    todo = list(node.all_input_nodes)
    while todo:
        n = todo.pop()
        if n is source:
            return True
        if n.op == "call_function" and str(n.target).startswith(passes):
            todo.extend(n.all_input_nodes)
    return False


def test_the_table_shares_one_gather_within_a_forward_and_keeps_nothing_outside(monkeypatch):
    """Outside an encoder forward each ask gathers its own rows (a partial ask, then the same ids
    changed in place, gives the new rows); within :meth:`one_forward` the asks for the same ids
    share one gather, and nothing is held after it."""
    from laya_build.model import rotary_attention as ra

    model = small_model()
    rotary.use(model, "table", halves=True)
    table = model.encoder.rotary_emb
    gathers = []
    real = ra.rotary_rows
    monkeypatch.setattr(ra, "rotary_rows", lambda *a: (gathers.append(1), real(*a))[1])
    x = torch.empty(0)
    ids = torch.arange(10)[None]
    want = {kind: table.halves_tables[2 * i : 2 * i + 2, ids[0]] for i, kind in enumerate(table.types)}
    first = table(x, ids, "full_attention")
    assert torch.equal(torch.stack(first)[:, 0], want["full_attention"])
    ids += 3  # the same tensor, changed in place
    moved = {kind: table.halves_tables[2 * i : 2 * i + 2, ids[0]] for i, kind in enumerate(table.types)}
    assert torch.equal(torch.stack(table(x, ids, "sliding_attention"))[:, 0], moved["sliding_attention"])
    assert len(gathers) == 2 and table._pending is None
    with table.one_forward():
        got = {kind: torch.stack(table(x, ids, kind))[:, 0] for kind in reversed(table.types)}
        assert len(gathers) == 3
        other = torch.arange(4)[None]  # other ids: a gather of their own
        table(x, other, "full_attention")
        assert len(gathers) == 4
    assert all(torch.equal(got[k], moved[k]) for k in table.types) and table._pending is None


def test_the_counted_encoder_takes_what_the_encoder_took():
    """The encoder with the key counts made once: the mask positionally or by name, none, a mask
    of other nonzero values (a count of nonzeros, as transformers' masks), the dict of masks
    transformers makes (passed through); a 4D mask is refused with what to pass; the head falls
    back to its own counts for a mask that is not the encoder's."""
    from laya_build.model import head

    model, reference = small_model(), small_model()
    attention.use(model, "fused")
    head.use(model, "fused", "all")
    ids, mask, *rest = batch((32, 9), width=32)
    with torch.no_grad():
        want = reference.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        for got in (
            model.encoder(ids, mask).last_hidden_state,
            model.encoder(input_ids=ids, attention_mask=mask * 2).last_hidden_state,
            model.encoder(
                input_ids=ids, attention_mask=dict.fromkeys(("full_attention", "sliding_attention"), mask.sum(-1))
            ).last_hidden_state,
        ):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        full = torch.ones_like(mask)
        torch.testing.assert_close(
            model.encoder(input_ids=ids).last_hidden_state,
            reference.encoder(input_ids=ids, attention_mask=full).last_hidden_state,
            atol=1e-5,
            rtol=1e-5,
        )
        with pytest.raises(ValueError, match=r"takes a \[rows, tokens\] padding mask.*2D attention mask"):
            model.encoder(input_ids=ids, attention_mask=mask[:, None, None, :].bool())
        for e, g in zip(reference(ids, mask * 2, *rest), model(ids, mask * 2, *rest)):
            torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
        model.encoder(input_ids=ids, attention_mask=mask)
        assert model.encoder.key_counts[0] is mask
        other = mask.clone()
        other[0, 20:] = 0
        assert attention.forward_counts(model.encoder, other).tolist() == [20, 9]  # not the encoder's mask
        assert attention.forward_counts(model.encoder, mask).tolist() == [32, 9]  # the encoder's, taken
        assert model.encoder.key_counts is None


def test_the_encoder_makes_the_key_counts_once_for_itself_and_the_head():
    """With fused attention the key counts are one sum a forward: the encoder's layers (both
    kinds) and the decision head's read the same node."""
    from laya_build.model import head

    model = small_model()
    attention.use(model, "fused")
    head.use(model, "fused", "all")
    rotary.use(model, "table", halves=True)
    program = exported(model)
    nodes = program.graph.nodes
    mask = next(n for n in nodes if n.name == "attention_mask")
    sums = [n for n in nodes if n.target is torch.ops.aten.sum.dim_IntList and reads_directly(n, mask)]
    assert len(sums) == 1, [n.args for n in sums]
    ops = (torch.ops.laya.rotary_attention.default, torch.ops.laya.packed_attention.default)
    readers = [n for n in nodes if n.target in ops]
    assert len(readers) == 5  # four encoder layers, one head layer
    counts = {n.args[3] if n.target is torch.ops.laya.rotary_attention.default else n.args[1] for n in readers}
    assert len(counts) == 1
    other = batch((32, 9), width=32)
    reference = small_model()
    with torch.inference_mode():
        for e, g in zip(reference(*other), program.module()(*other)):
            torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
        for e, g in zip(reference(*other), model(*other)):
            torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
    assert model.encoder.key_counts is None  # taken by the head: nothing of the forward is held


def test_without_triton_fused_is_refused_with_what_to_do(monkeypatch):
    monkeypatch.delitem(sys.modules, "laya_build.model.rotary_attention", raising=False)
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton fails
    with pytest.raises(ValueError, match="export.attention fused needs Triton.*choose sdpa or bias"):
        attention.use(small_model(), "fused")


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
    from laya_build.model import rotary_attention as ra

    torch.manual_seed(0)
    B, S, H, D = 4, 80, 2, 64  # 80: not a multiple of the blocks
    counts = torch.tensor([80, 33, 1, 0], dtype=torch.int32)
    inv = 1.0 / 10000 ** (torch.arange(0, D, 2) / D)
    pos = torch.arange(S)[:, None] * inv[None]
    emb = torch.cat((pos, pos), -1)
    shifted = torch.arange(B)[:, None, None] * 7 + torch.arange(S)[None, :, None]  # other positions a row
    own = torch.cat([shifted * inv] * 2, -1)
    worst = {}
    for dtype in (torch.float32, torch.float16):
        qkv = torch.randn(B, S, 3, H, D).to(dtype)
        for name, (cos, sin) in {"one table": (emb.cos()[None], emb.sin()[None]),
                                 "a table a row": (own.cos(), own.sin()),
                                 "no rotary": (None, None)}.items():
            if cos is not None:  # the halves the kernel reads
                cos, sin = ra.half(cos.to(dtype)).contiguous(), ra.half(sin.to(dtype)).contiguous()
            for window in (-1, 5, 40):
                ref = ra.reference(qkv, cos, sin, counts, D ** -0.5, window)
                for config in json.loads(sys.argv[1]):
                    out = torch.full((B, S, H, D), float("nan"), dtype=dtype)
                    ra.launch(qkv, cos, sin, counts, D ** -0.5, window, out, config=config)
                    assert (out[3] == 0).all(), "an empty row is not 0"
                    key = f"{dtype} {name} window {window} {config}"
                    worst[key] = (out.float() - ref.float()).abs().max().item()
        # the gathered kernel: 11 query positions a row (not a multiple of a block), the first,
        # the last, repeated ones, padding, and -1 and S (outside the row: 0)
        at = torch.stack([torch.randint(0, S, (11,)) for _ in range(B)])
        at[:, :4] = torch.tensor([0, S - 1, -1, S])
        at[0, 4:6] = 5
        ref = ra.gathered_reference(qkv, counts, at, D ** -0.5)
        assert (ref[:, 2:4] == 0).all()
        for config in ({}, {"BLOCK_N": 32, "PREFETCH": False}, {"BLOCK_M": 32}):
            out = torch.full((B, 11, H, D), float("nan"), dtype=dtype)
            ra.launch_gathered(qkv, counts, at, D ** -0.5, out, config=config)
            assert (out[3] == 0).all() and (out[:, 2:4] == 0).all(), "an empty row or a position outside is not 0"
            worst[f"gathered {dtype} {config}"] = (out.float() - ref.float()).abs().max().item()
    # the rows kernel: 150 positions (not a multiple of its block) of three [40, 32] tables, ids
    # a row, some outside the tables (a row of 0)
    tables = torch.randn(3, 40, D // 2)
    ids = torch.randint(-3, 45, (3, 50))
    inside = ((ids >= 0) & (ids < 40))[None, ..., None]
    want = torch.where(inside, tables[:, ids.clamp(0, 39)], 0.0)
    got = torch.full((3, 3, 50, D // 2), float("nan"))
    ra.launch_rows(tables, ids, got)
    worst["rows"] = (got - want).abs().max().item()
    print(json.dumps(worst))
    """
)


def interpreted(code: str, configs: list[dict]) -> dict:
    """``code`` run in a fresh interpreter under Triton's interpreter (``TRITON_INTERPRET=1``) with
    ``configs`` as JSON in ``sys.argv[1]``; its last stdout line, as JSON."""
    import json

    run = subprocess.run(
        [sys.executable, "-c", code, json.dumps(configs)],
        cwd=PROJECT_ROOT,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_kernel_in_triton_s_interpreter_is_the_reference():
    pytest.importorskip("triton")
    configs = [
        {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "PREFETCH": True},
        {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "PREFETCH": False},
        {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2, "PREFETCH": True},  # blocks of different sizes
        {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2, "PREFETCH": False},
    ]
    from laya_build.model import rotary_attention as ra

    configs += [c for c in ra.ALL_CONFIGS if c not in configs]  # every configuration a shape can select
    worst = interpreted(INTERPRETED, configs)
    assert worst.pop("rows") == 0  # a copy: bit for bit
    assert len(worst) == 2 * 3 * 3 * len(configs) + 2 * 3  # and the gathered kernel's 3 configurations a dtype
    for key, err in worst.items():
        limit = 1e-5 if "float32" in key else 4e-3  # fp16: rounding of p and of the output
        assert err <= limit, f"{key}: {err}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton kernel compiled needs a CUDA GPU")
def test_the_kernel_on_cuda_is_the_reference():
    from laya_build.model import rotary_attention as ra

    torch.manual_seed(0)
    B, S, H, D = 4, 256, 16, 64
    qkv = torch.randn(B, S, 3, H, D, device="cuda", dtype=torch.bfloat16)
    pos = torch.arange(S, device="cuda")[:, None] * (1.0 / 10000 ** (torch.arange(0, D, 2, device="cuda") / D))[None]
    cos, sin = pos.cos().to(torch.bfloat16)[None], pos.sin().to(torch.bfloat16)[None]  # one half of each table
    counts = torch.tensor([256, 77, 16, 0], device="cuda", dtype=torch.int32)  # full, padded, short, empty
    for window in (-1, 64, 8):  # global; local as the model's; a window that skips key blocks
        got = torch.ops.laya.rotary_attention(qkv, cos, sin, counts, D**-0.5, window)
        ref = ra.reference(qkv.float(), cos.float(), sin.float(), counts, D**-0.5, window)
        assert (got.float() - ref).abs().max().item() < 2e-2
        assert (got[3] == 0).all()
        plain = torch.ops.laya.packed_attention(qkv, counts, D**-0.5, window)  # no rotary: the head's
        ref = ra.reference(qkv.float(), None, None, counts, D**-0.5, window)
        assert (plain.float() - ref).abs().max().item() < 2e-2
        assert (plain[3] == 0).all()
        ref = ra.reference(qkv.float(), cos.float(), sin.float(), counts, D**-0.5, window)
        for config in ra.ALL_CONFIGS:  # each configuration a shape can select, whichever this one selects
            out = torch.full_like(got, float("nan"))
            ra.launch(qkv, cos, sin, counts, D**-0.5, window, out, config=config)
            assert (out.float() - ref).abs().max().item() < 2e-2, config
            assert (out[3] == 0).all()
        short = torch.ops.laya.rotary_attention(
            qkv[:1, :128], cos[:, :128], sin[:, :128], counts[:1] // 2, D**-0.5, window
        )
        ref = ra.reference(
            qkv[:1, :128].float(), cos[:, :128].float(), sin[:, :128].float(), counts[:1] // 2, D**-0.5, window
        )
        assert (short.float() - ref).abs().max().item() < 2e-2  # 1 x 128: the smallest query blocks
    at = torch.tensor([[0, 255, 3, 3, -1], [0, 76, 77, 200, 5], [0, 15, 1, 2, S], [0, 1, 2, 3, 4]], device="cuda")
    gathered = torch.ops.laya.gathered_attention(qkv, counts, at, D**-0.5)  # the head's last layer
    ref = ra.gathered_reference(qkv.float(), counts, at, D**-0.5)
    assert gathered.shape == (B, 5, H, D) and (gathered.float() - ref).abs().max().item() < 2e-2
    assert (gathered[3] == 0).all() and (gathered[0, 4] == 0).all() and (gathered[2, 4] == 0).all()
    tables = torch.randn(4, 8192, D // 2, device="cuda", dtype=torch.bfloat16)
    ids = torch.arange(S, device="cuda")[None]
    rows = torch.ops.laya.rotary_rows(tables, ids)
    assert torch.equal(rows, tables[:, ids])


def test_no_float_reaches_the_kernel_as_a_runtime_argument():
    """Inductor hands a Python float given to a user's Triton kernel as fp64, which turned the
    kernel's softmax state to fp64 and failed its compile inside AOTInductor on the H200 (eager
    Triton passes fp32): every float the launch passes must be a compile-time constant."""
    from laya_build.model import rotary_attention as ra

    launched = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append((grid, args, kwargs))

    B, S, H, D = 2, 48, 2, 64
    qkv = torch.zeros(B, S, 3, H, D)
    cos = sin = torch.zeros(1, S, D // 2)
    ra.launch(qkv, cos, sin, torch.full((B,), S, dtype=torch.int32), D**-0.5, 8, torch.empty(B, S, H, D), Recorder())
    ((grid, args, kwargs),) = launched[:1]
    assert grid == (1, B * H)
    assert not [a for a in args if isinstance(a, float)]
    assert kwargs["SCALE"] == pytest.approx(D**-0.5 * 1.4426950408889634)
    assert kwargs["WINDOW"] == 8 and kwargs["num_warps"] == ra.CONFIG["num_warps"] and kwargs["ROTARY"]
    ra.launch(qkv, None, None, torch.full((B,), S, dtype=torch.int32), D**-0.5, -1, torch.empty(B, S, H, D), Recorder())
    assert launched[1][2]["ROTARY"] is False and not [a for a in launched[1][1] if isinstance(a, float)]
    constants = set(ra._rotary_attention_kernel.constexprs)
    names = ra._rotary_attention_kernel.arg_names
    constexprs = ("H", "D", "WINDOW", "SCALE", "ROTARY", "BLOCK_M", "BLOCK_N", "PREFETCH")
    assert {names.index(k) for k in constexprs} <= constants


def test_a_shape_selects_one_configuration_and_a_symbolic_shape_adds_no_guard():
    """The largest query block whose programs fill the GPU once runs; exactly one configuration a
    shape.  With the sizes symbolic (as AOTInductor compiles the op for every token count) the
    choice is an expression of them, the same for every shape, and adds no guard."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    from laya_build.model import rotary_attention as ra

    def chosen(rows, length, heads):
        uses = [use for _, use in ra.selection(rows, length, heads)]
        assert sorted(uses) == [0] * (len(uses) - 1) + [1]
        return ra.CONFIGS[uses.index(1)]["BLOCK_M"]

    assert [c["BLOCK_M"] for c in ra.CONFIGS] == sorted((c["BLOCK_M"] for c in ra.CONFIGS), reverse=True)
    assert chosen(1, 128, 16) == 16 and chosen(7, 256, 16) == 128  # the two serving shapes measured
    assert chosen(3, 256, 16) == 64  # 96 programs of 128 queries, 192 of 64
    shapes = [(b, 16 * t, h) for b in (1, 2, 3, 4, 7, 9) for t in (1, 2, 5, 8, 16, 32) for h in (1, 4, 16)]
    for b, s, h in shapes:
        block = chosen(b, s, h)
        programs = -(-s // block) * b * h
        bigger = [c["BLOCK_M"] for c in ra.CONFIGS if c["BLOCK_M"] > block]
        assert programs >= ra.WAVE or block == ra.CONFIGS[-1]["BLOCK_M"], (b, s, h)
        assert all(-(-s // m) * b * h < ra.WAVE for m in bigger), (b, s, h)

    env = ShapeEnv()

    def size(name, hint):
        symbol = env.create_symbol(hint, ConstantSource(name), dynamic_dim=DimDynamic.DYNAMIC)
        return env.create_symintnode(symbol, hint=hint), symbol

    (rows, r), (length, n) = size("rows", 7), size("tokens", 256)
    uses = [use for _, use in ra.selection(rows, length, 16)]
    assert not env.guards
    for b, s, _ in shapes:
        values = [int(use.node.expr.subs({r: b, n: s})) for use in uses]
        assert ra.CONFIGS[values.index(1)]["BLOCK_M"] == chosen(b, s, 16) and sum(values) == 1


def test_a_concrete_shape_launches_its_configuration_alone_and_large_head_dims_keep_small_blocks():
    """In eager (concrete sizes) one launch a call, the selected configuration's; a configuration
    whose query block times the head dim exceeds the measured accumulator is never compiled or
    launched for that head dim, while the module's configuration stays for every head dim."""
    from laya_build.model import rotary_attention as ra

    for b, s in ((1, 128), (7, 256), (3, 256), (4, 512)):
        chosen = [c for c, use in ra.selection(b, s, 16) if use == 1]
        assert ra.launches(b, s, 16, 64) == [(chosen[0], 1)]
    for d in ra.HEAD_DIMS:
        blocks = [c["BLOCK_M"] for c in ra.configs(d)]
        assert ra.CONFIG in ra.configs(d) and blocks[-1] == 16
        assert all(c is ra.CONFIG or c["BLOCK_M"] * d <= ra.ACCUMULATOR for c in ra.configs(d))
        assert (128 in blocks) == (d <= 64)
        assert ra.launches(7, 256, 16, d)[0][0]["BLOCK_M"] == (128 if d <= 64 else 64)


def test_global_and_local_layers_choose_from_tables_of_their_own():
    """A global layer (window < 0) and a local one select by the same rule from their own tables:
    at 7 x 256 the global layer's 128 x 64 blocks with 8 warps, the local layer's 128 x 32 with 4;
    the same small blocks at 1 x 128."""
    from laya_build.model import rotary_attention as ra

    (first_global, _), *_ = ra.launches(7, 256, 16, 64, -1)
    (first_local, _), *_ = ra.launches(7, 256, 16, 64, 64)
    assert first_global is ra.GLOBAL_CONFIGS[0] and (first_global["BLOCK_N"], first_global["num_warps"]) == (64, 8)
    assert first_local is ra.CONFIGS[0] and (first_local["BLOCK_N"], first_local["num_warps"]) == (32, 4)
    assert ra.launches(1, 128, 16, 64, -1) == ra.launches(1, 128, 16, 64, 64) == [(ra.SMALL, 1)]
    for window in (-1, 64):
        assert [c["BLOCK_M"] for c in ra.configs(64, window)] == [128, 64, 16]
        assert [c["BLOCK_M"] for c in ra.configs(128, window)] == [64, 16]  # 128 x 128 is past the accumulator
    assert set(map(repr, ra.ALL_CONFIGS)) == set(map(repr, ra.CONFIGS + ra.GLOBAL_CONFIGS))


def test_a_configuration_not_selected_launches_no_program():
    from laya_build.model import rotary_attention as ra

    grids = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: grids.append((grid, kwargs["BLOCK_M"]))

    B, S, H, D = 2, 48, 2, 64
    qkv, counts = torch.zeros(B, S, 3, H, D), torch.full((B,), S, dtype=torch.int32)
    for config, use in ra.selection(B, S, H):
        ra.launch(qkv, None, None, counts, 0.1, -1, torch.empty(B, S, H, D), Recorder(), config, use)
    assert sorted(grids, key=lambda g: g[1]) == [((3, B * H), 16), ((0, B * H), 64), ((0, B * H), 128)]


def test_layouts_the_kernel_cannot_read_are_refused():
    from laya_build.model import rotary_attention as ra

    B, S, H, D = 2, 16, 2, 32
    cos = sin = torch.zeros(1, S, D // 2)
    counts = torch.full((B,), S, dtype=torch.int32)
    packed = torch.zeros(B, S, 3 * H * D)
    with pytest.raises(RuntimeError, match="a view of the packed Wqkv output"):
        ra.rotary_attention(packed.view(B, S, H, 3, D).transpose(2, 3), cos, sin, counts, 0.1, -1)
    with pytest.raises(RuntimeError, match=r"cos and sin must be \[1 or B, S, D / 2\]"):
        ra.rotary_attention(packed.view(B, S, 3, H, D), cos[0], sin[0], counts, 0.1, -1)
    whole = torch.zeros(1, S, D)  # a whole table: the op takes one half of it
    with pytest.raises(RuntimeError, match=r"cos and sin must be \[1 or B, S, D / 2\], got \(1, 16, 32\)"):
        ra.rotary_attention(packed.view(B, S, 3, H, D), whole, whole, counts, 0.1, -1)
    with pytest.raises(RuntimeError, match=r"counts must be \[B\]"):
        ra.rotary_attention(packed.view(B, S, 3, H, D), cos, sin, torch.ones(B, 1, S, S), 0.1, -1)


def test_what_the_cuda_kernel_cannot_run_is_named():
    """Head dims its half-head dots cannot index, and fp32 (whose products would be TF32)."""
    from laya_build.model import rotary_attention as ra

    for head_dim in ra.HEAD_DIMS:
        for dtype in (torch.bfloat16, torch.float16):
            assert ra.cuda_refusal(head_dim, dtype) is None
    for head_dim in (8, 16, 48, 96, 512):
        assert f"this model's is {head_dim}" in ra.cuda_refusal(head_dim, torch.bfloat16)
    assert "this model is torch.float32" in ra.cuda_refusal(64, torch.float32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA model: torch.cuda.is_available() is False")
def test_a_cuda_model_the_kernel_cannot_run_is_refused_at_once():
    """Refused when the attention is chosen, with what to choose instead, not at trace time (the
    small model's heads are 16 wide; fp32 is refused by the same check, unit-tested above)."""
    for model in (small_model().cuda().bfloat16(), small_model().cuda()):
        with pytest.raises(
            ValueError,
            match=r"fused on CUDA needs a head dim of 32, 64, 128, 256 \(this model's is 16\): choose sdpa or bias",
        ):
            attention.use(model, "fused")


def test_a_rotary_whose_table_halves_differ_is_refused_for_fused():
    """The kernel reads one half of each table (transformers' repeat it): a model whose rotary
    module gives two different halves is refused when the attention is chosen, naming the table."""
    model = small_model()
    real = model.encoder.rotary_emb

    class Skewed(torch.nn.Module):
        def forward(self, x, position_ids, layer_type):
            cos, sin = real(x, position_ids, layer_type)
            if layer_type == "sliding_attention":
                sin = torch.cat((sin[..., : sin.shape[-1] // 2], 2 * sin[..., sin.shape[-1] // 2 :]), -1)
            return cos, sin

    model.encoder.rotary_emb = Skewed()
    with pytest.raises(
        ValueError,
        match=r"fused reads one half of each rotary table, but the sliding_attention sin table's two halves "
        r"differ \(by up to .*\): choose sdpa or bias",
    ):
        attention.use(model, "fused")
    model.encoder.rotary_emb = real
    rotary.use(model, "table")  # the tabulated rotary passes, as the module it tabulates
    attention.use(model, "fused")
