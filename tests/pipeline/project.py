"""A throw-away copy of the project (its own git repository) to run ``doit`` in."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from laya_build.records import sha256_file

ROOT = Path(__file__).resolve().parents[2]
TASK_LINE = re.compile(r"^(\.|--|!!) +(\S+)")
KERNEL_STAGES = ("tir", "probe_c", "lower_c", "cuda_source", "cuda_diff")
TIMING_KEYS = {"elapsed_s", "compile_s"}


@dataclass
class DoitRun:
    returncode: int
    stdout: str
    stderr: str

    def lines(self, mark: str) -> list[str]:
        return [m.group(2) for line in self.stdout.splitlines() if (m := TASK_LINE.match(line)) and m.group(1) == mark]

    @property
    def executed(self) -> list[str]:
        """Tasks doit ran (reporter lines ``.  task``)."""
        return self.lines(".")

    @property
    def up_to_date(self) -> list[str]:
        """Tasks doit skipped as up to date (``-- task``)."""
        return self.lines("--")


def start_doit(cwd, *args: str, env: dict | None = None) -> subprocess.Popen:
    """``doit args`` in ``cwd`` with this environment and ``env``, in a process group of its own
    (a signal to the group reaches all of it), its output (stderr in stdout) to read."""
    return subprocess.Popen(
        [sys.executable, "-m", "doit", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def project_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [f for f in out if not f.startswith("tests/") and (ROOT / f).is_file()]


def small_pipeline(cfg: dict, checkpoint: Path | None = None) -> None:
    """One kernel in one dtype, the fp32 CPU package and the cuda target (skipped without a
    GPU), few timed calls: every kind of task, cheaply.  ``checkpoint``: a local model
    (``model.path``) instead of the generated one."""
    if checkpoint is not None:
        cfg.setdefault("model", {})["path"] = str(checkpoint)
    cfg["kernels"]["variants"] = {"rope": cfg["kernels"]["variants"]["rope"]}
    cfg["cpu_checks"]["shapes"] = {"rope": cfg["cpu_checks"]["shapes"]["rope"]}
    cfg["cpu_checks"]["atol_overrides"] = {k: v for k, v in cfg["cpu_checks"]["atol_overrides"].items() if k == "rope"}
    cfg["cuda"].update(dtypes=["bfloat16"], baseline={"git_ref": "HEAD"}, expect="identical")
    cfg["probe"] = {"dtypes": ["bfloat16"]}
    cfg.setdefault("export", {})["targets"] = {"cpu": ["float32"], "cuda": ["bfloat16"]}
    fast = {"cpu": {"warmup": 0, "min_run_time_s": 0.01, "max_run_time_s": 0.05}}
    cfg["verify"] = {"timing": fast}
    cfg["latency"] = {"variants": ["eager_amp", "eager_bf16", "package", "package_graphed"], "timing": fast}


class Project:
    """A copy of the project in ``path``, committed as one git revision."""

    def __init__(self, path: Path):
        self.path = path
        for rel in project_files():
            dest = path / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest)
        self.git("init", "-q", "-b", "main")
        self.commit("copy of the project")

    def git(self, *args: str) -> str:
        env = {
            **os.environ,
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
        }
        return subprocess.run(["git", *args], cwd=self.path, env=env, capture_output=True, text=True, check=True).stdout

    def commit(self, message: str) -> str:
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", message)
        return self.git("rev-parse", "HEAD").strip()

    @property
    def config(self) -> dict:
        return yaml.safe_load((self.path / "pipeline.yaml").read_text())

    def write_config(self, data: dict) -> None:
        (self.path / "pipeline.yaml").write_text(yaml.safe_dump(data, sort_keys=False))

    def edit_config(self, fn) -> None:
        data = self.config
        fn(data)
        self.write_config(data)

    def doit(self, *args: str, timeout: float = 1800, env: dict | None = None) -> DoitRun:
        full = {**os.environ, "HF_HUB_OFFLINE": "1"}
        full.pop("PYTHONPATH", None)
        full.update(env or {})
        proc = subprocess.run(
            [sys.executable, "-m", "doit", *args],
            cwd=self.path,
            env=full,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return DoitRun(proc.returncode, proc.stdout, proc.stderr)

    def status(self, *, env: dict | None = None) -> dict[str, str]:
        """``doit list --all --status``: sub-task -> ``R`` (would run) / ``U`` (up to date)."""
        run = self.doit("list", "--all", "--status", "-q", env=env)
        assert run.returncode == 0, run.stdout + run.stderr
        out = {}
        for line in run.stdout.splitlines():
            mark, _, name = line.strip().partition(" ")
            if ":" in name and mark in ("R", "U", "I"):
                out[name.strip()] = mark
        return out

    def status_after_each_edit(self, edits: list[tuple[Path, bytes]]) -> list[dict[str, str]]:
        """The status :meth:`status` would give with each file of ``edits`` appended to in turn
        (``(path, appended bytes)``; put back after each): ONE process loads the graph and
        doit's dependency state, then asks doit's own ``get_status`` after every edit, as
        ``doit list --status`` does (the graph is derived from import closures that an appended
        comment leaves alone).  Saves a ``doit`` start per file."""
        code = (
            "import json, sys; sys.argv = ['doit']; import dodo\n"
            "from doit.cmd_base import ModuleTaskLoader; from doit.cmd_list import List\n"
            "from doit.doit_cmd import DoitMain\n"
            "import functools; seen = {}; original = List._execute\n"
            "@functools.wraps(original)\n"
            "def _execute(self, *a, **kw):\n"
            "    seen['cmd'] = self; return original(self, *a, **kw)\n"
            "List._execute = _execute\n"
            "assert DoitMain(ModuleTaskLoader(dodo)).run(['list', '--all', '-q']) == 0\n"
            "cmd = seen['cmd']; tasks = {t.name: t for t in cmd.task_list}\n"
            "marks = {'run': 'R', 'up-to-date': 'U', 'error': 'R'}\n"
            "out = []\n"
            "for path, extra in json.loads(sys.stdin.read()):\n"
            "    data = open(path, 'rb').read()\n"
            "    open(path, 'wb').write(data + extra.encode())\n"
            "    try:\n"
            "        status = cmd.dep_manager.get_status\n"
            "        out.append({n: marks[status(t, tasks).status] for n, t in tasks.items() if ':' in n})\n"
            "    finally:\n"
            "        open(path, 'wb').write(data)\n"
            "print(json.dumps(out))\n"
        )
        return self._python_json(code, json.dumps([(str(p), extra.decode()) for p, extra in edits]))

    def graph(self) -> dict[str, dict]:
        """Every sub-task's ``file_dep`` and whether it always runs, from the task graph."""
        code = (
            "import json, sys; sys.argv = ['doit']; import dodo; "
            "from doit.loader import load_tasks; "
            "print(json.dumps({t.name: {'file_dep': sorted(t.file_dep), "
            "'always': any(u is False for u, *_ in t.uptodate), 'targets': list(t.targets)} "
            "for t in load_tasks(vars(dodo)) if ':' in t.name}))"
        )
        return self._python_json(code)

    def _python_json(self, code: str, stdin: str = ""):
        """Run ``code`` in a Python process in the project (as doit would: offline, no
        inherited PYTHONPATH) and return the JSON of its last output line."""
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        env.pop("PYTHONPATH", None)
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=self.path, env=env, capture_output=True, text=True, input=stdin
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(proc.stdout.splitlines()[-1])

    @property
    def artifacts(self) -> Path:
        return self.path / "artifacts"

    def version_dir(self, version: str | None = None) -> Path:
        return self.artifacts / (version or self.config["version"])

    def generated(self) -> dict[str, str]:
        """sha256 of every generated source (.cu, .c, TIR scripts) by relative path."""
        vdir = self.version_dir()
        return {
            p.relative_to(vdir).as_posix(): sha256_file(p)
            for p in sorted(vdir.rglob("*"))
            if p.suffix in (".cu", ".c") or p.name.endswith(".tir.py")
        }

    def kernel_records(self) -> dict[str, dict]:
        """Every record of the kernel stages, without timings and with the copy's own commit sha
        (each copy is its own repository, committed at its own time) replaced by a placeholder."""
        vdir = self.version_dir()
        head = self.git("rev-parse", "HEAD").strip()
        out = {}
        for path in sorted(vdir.rglob("*.json")):
            record = json.loads(path.read_text().replace(head, "<commit>").replace(head[:12], "<commit>"))
            if record.get("stage") in KERNEL_STAGES:
                out[path.relative_to(vdir).as_posix()] = _strip_timing(record)
        return out


def _strip_timing(obj):
    if isinstance(obj, dict):
        return {k: _strip_timing(v) for k, v in obj.items() if k not in TIMING_KEYS}
    if isinstance(obj, list):
        return [_strip_timing(v) for v in obj]
    return obj
