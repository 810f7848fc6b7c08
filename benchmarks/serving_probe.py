"""A serving process, measured: how long a fresh process takes to its first answer, which preload
the image needs, and whether the runner's CUDA graphs survive other CUDA work in the process
(docs/measurements/runtime-h200.md, docs/guides/serving.md).

    python benchmarks/serving_probe.py first RECORD INPUTS [--rounds N] [--preload a,b] [--out F]
        fresh processes, side by side per round (each round starting one variant later):
        `import torch` alone; runtime.start.start_build
        (hash while torch imports, the direct loader, graphs behind the first answer), and again
        with the CUDA context made by the load instead of beside the import;
        serving.open_build with torch's aoti_load_package (hash, load, every graph captured, then
        the call); each to its first answer
    python benchmarks/serving_probe.py preload RECORD INPUTS [--candidates none,tvm_ffi,tilelang]
        one fresh process per candidate preload: does the package load (the runtime's own loader)
        and answer (exit status, signal), and what the preload costs
    python benchmarks/serving_probe.py mixed RECORD INPUTS [--buckets JSON] [--preload a,b]
                                          [--without-workspace-fix]
        in this process: the runner's graphs, then another model, a torch.compile with CUDA
        graphs and autotuning, large allocations and frees, cleared cuBLAS workspaces; after each
        step, whether every graph still replays its first answer bit for bit (one JSON line per
        step).  --without-workspace-fix captures as the runner did before it kept its cuBLAS
        workspace in the graph's pool (to tell the cause from the fix)

RECORD is an aoti_package.json (its package is hashed against it), INPUTS the build's inputs.pt.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the mixed probe runs the runtime in this process
DEFAULT_BUCKETS = '[{"rows": 1, "tokens": 128}, {"rows": 7, "tokens": 256}]'

ARGV = (  # every child: argv = RECORD INPUTS BUCKETS PRELOAD
    "import json, sys, time\n"
    "t = time.perf_counter()\n"
    "record, inputs, buckets = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])\n"
    "preload = [p for p in sys.argv[4].split(',') if p]\n"
)
ANSWER = (  # the first answer of runner r, on the first saved batch
    "import torch\n"
    "inp = torch.load(inputs, weights_only=True)\n"
    "out = r(*(inp['batches'][0][k].to(r.device) for k in inp['arg_names']))\n"
    "out[0].sum().item()\n"
    "first = time.perf_counter() - t\n"
)
FIRST = {
    "import torch": ARGV + "import torch\nprint(json.dumps({'first_s': time.perf_counter() - t}))\n",
    "start_build": ARGV
    + "from laya_build.runtime.start import start_build\n"
    + "r = start_build(record, buckets=buckets, preload=preload)\n"
    + ANSWER
    + "print(json.dumps({'first_s': first, **r.start_timings, **r.capture_state()}))\n",
    "start_build, context by the load": ARGV  # the CUDA context made when the package loads
    + "from laya_build.runtime import start\n"
    + "start._cuda_context = lambda record: start._CudaContext.left_out('left to the load by the probe')\n"
    + "r = start.start_build(record, buckets=buckets, preload=preload)\n"
    + ANSWER
    + "print(json.dumps({'first_s': first, **r.start_timings, **r.capture_state()}))\n",
    "open_build": ARGV
    + "import torch\n"
    + "from laya_build.runtime import serving\n"
    + "r = serving.open_build(record, buckets=buckets, preload=preload, loader='aoti_load_package')\n"
    + ANSWER
    + "print(json.dumps({'first_s': first, 'capture_s': r.capture_s}))\n",
}


def _child(code: str, *argv: str, timeout: float = 600) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    wall = time.perf_counter() - start
    result = {"rc": proc.returncode, "wall_s": round(wall, 4)}
    if proc.returncode < 0:
        result["signal"] = signal.Signals(-proc.returncode).name
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if lines:
        result.update(json.loads(lines[-1]))
    if proc.returncode != 0:
        result["stderr"] = proc.stderr[-1500:]
    return result


def machine() -> dict:
    import torch

    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def first_cmd(args) -> dict:
    rows = []
    names = list(FIRST)
    for i in range(args.rounds):  # each round in another order: no variant always follows the same one
        for name in names[i % len(names) :] + names[: i % len(names)]:
            code = FIRST[name]
            rows.append(
                {
                    "round": i,
                    "variant": name,
                    **_child(code, str(args.record), str(args.inputs), args.buckets, args.preload),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return {"machine": machine(), "rows": rows}


PRELOAD_CHILD = (  # PRELOAD is one candidate: none, a module, or lib:<package> (its native library alone)
    ARGV
    + "import ctypes, importlib, importlib.util, os\n"
    + "import torch\n"
    + "imported = time.perf_counter()\n"
    + "name = sys.argv[4]\n"
    + "if name.startswith('lib:'):\n"
    + "    where = importlib.util.find_spec(name[4:]).submodule_search_locations[0]\n"
    + "    ctypes.CDLL(os.path.join(where, 'lib', f'lib{name[4:]}.so'), mode=ctypes.RTLD_GLOBAL)\n"
    + "elif name != 'none':\n"
    + "    importlib.import_module(name)\n"
    + "preloaded = time.perf_counter()\n"
    + "from laya_build.runtime import serving\n"
    + "r = serving.open_build(record, buckets=[])\n"
    + ANSWER
    + "print(json.dumps({'import_torch_s': imported - t, 'preload_s': preloaded - imported, 'first_s': first}))\n"
)


def preload_cmd(args) -> dict:
    rows = []
    for name in args.candidates.split(","):
        rows.append({"preload": name, **_child(PRELOAD_CHILD, str(args.record), str(args.inputs), "[]", name)})
        print(json.dumps(rows[-1]), flush=True)
    return {"machine": machine(), "rows": rows}


def mixed_cmd(args) -> dict:
    import torch

    from laya_build.runtime import serving

    if args.without_workspace_fix:  # capture as before the fix: the workspace of the warm-up calls
        capture = serving.DecisionRunner._capture

        def unfixed(self, slot):
            real = torch._C._cuda_clearCublasWorkspaces
            torch._C._cuda_clearCublasWorkspaces = lambda: None
            try:
                capture(self, slot)
            finally:
                torch._C._cuda_clearCublasWorkspaces = real

        serving.DecisionRunner._capture = unfixed
    inputs = torch.load(args.inputs, weights_only=True)
    runner = serving.open_build(
        args.record, buckets=json.loads(args.buckets), preload=[p for p in args.preload.split(",") if p]
    )
    calls = [tuple(b[k].to(runner.device) for k in inputs["arg_names"]) for b in inputs["batches"][:2]]

    def plain(a):  # the plain package call on the replay's own padded inputs, cut as the replay is
        rows, _, slots = runner.shape(a)
        decision, act = runner.plain(*runner.padded_inputs(a))
        return decision[:rows, :slots], act[:rows]

    refs = [runner(*a) for a in calls]
    plains = [plain(a) for a in calls]
    steps = []

    def check(step: str) -> None:
        torch.cuda.synchronize()
        same = all(torch.equal(x, y) for a, ref in zip(calls, refs) for x, y in zip(runner(*a), ref))
        steps.append({"step": step, "replay_unchanged": same})
        print(json.dumps(steps[-1]), flush=True)

    other = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    with torch.no_grad():
        for _ in range(3):
            other(torch.randn(512, 1024, device="cuda")).sum().item()
        check("another model")
        compiled = torch.compile(other, mode="max-autotune")  # CUDA graph trees clear cuBLAS workspaces
        for _ in range(4):
            compiled(torch.randn(64, 1024, device="cuda")).sum().item()
        check("torch.compile max-autotune")
    for _ in range(3):
        big = [torch.full((64 << 20,), float("nan"), device="cuda") for _ in range(8)]
        del big
        torch.cuda.empty_cache()
    junk = [torch.full((16 << 20,), 7.0, device="cuda") for _ in range(16)]
    check("allocations and frees")
    torch._C._cuda_clearCublasWorkspaces()
    junk += [torch.full((16 << 20,), -3.0, device="cuda") for _ in range(16)]
    check("cuBLAS workspaces cleared")
    del junk
    # the replays' first answers against the plain calls made then, and the plain calls made now
    replay_vs_plain = all(torch.equal(x, y) for ref, p in zip(refs, plains) for x, y in zip(ref, p))
    replay_vs_plain_now = all(torch.equal(x, y) for ref, a in zip(refs, calls) for x, y in zip(ref, plain(a)))
    done = {"done": True, "replay_vs_plain": replay_vs_plain, "replay_vs_plain_after": replay_vs_plain_now}
    print(json.dumps(done), flush=True)
    return {"machine": machine(), "workspace_fix": not args.without_workspace_fix, "steps": steps, **done}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("first", "preload", "mixed"))
    parser.add_argument("record", type=Path)
    parser.add_argument("inputs", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--buckets", default=DEFAULT_BUCKETS)
    parser.add_argument("--preload", default="", help="modules imported before the load, comma-separated")
    parser.add_argument("--candidates", default="none,lib:tvm_ffi,tvm_ffi,tilelang")
    parser.add_argument("--without-workspace-fix", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = {"first": first_cmd, "preload": preload_cmd, "mixed": mixed_cmd}[args.command](args)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    with contextlib.suppress(BrokenPipeError):
        print(json.dumps({"summary": args.command, "rows": len(result.get("rows", result.get("steps", [])))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
