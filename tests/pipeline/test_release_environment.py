"""What a release records of its environment, asked cheaply: TileLang's bundled TVM version is read
from the installed files, without importing TileLang, and is the version an import reports."""

from __future__ import annotations

import json
import subprocess
import sys

from laya_build import PROJECT_ROOT


def test_the_tvm_version_is_read_without_importing_tilelang():
    code = (
        "import json, sys\n"
        "from laya_build.release.publish import tvm_version\n"
        "read = tvm_version()\n"
        "imported_before = sorted(m for m in ('tilelang', 'tvm', 'torch') if m in sys.modules)\n"
        "import tilelang, tvm\n"
        "print(json.dumps({'read': read, 'imported': tvm.__version__, 'before': imported_before}))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["before"] == []
    assert out["read"] == out["imported"] and out["read"]


def test_the_package_list_is_pips_own_without_starting_pip():
    """In a fresh interpreter (as the release and package processes are), the text pip prints."""
    env = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(PROJECT_ROOT)}
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    ours = subprocess.run(
        [sys.executable, "-c", "from laya_build.environment import pip_list_freeze; print(pip_list_freeze())"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert pip.returncode == 0 and ours.returncode == 0, pip.stderr + ours.stderr
    assert ours.stdout.strip() == pip.stdout.strip() and "torch==" in ours.stdout


def test_the_recorded_collect_env_is_torchs_own_and_leaves_torch_as_it_was():
    from torch.utils import collect_env

    from laya_build.environment import collect_env_info, pip_list_freeze

    run = collect_env.run
    started = []

    def counting(command):
        started.append(command)
        return run(command)

    collect_env.run = counting
    try:
        ours = collect_env_info()
        ours_started = list(started)
        started.clear()
        torchs = dict(collect_env.get_env_info()._asdict())
    finally:
        collect_env.run = run
    assert ours == torchs
    assert ours["pip_packages"] and "torch==" in ours["pip_packages"]
    assert all(line in pip_list_freeze().splitlines() for line in ours["pip_packages"].splitlines())
    # the same commands but pip's own, which torch's run started and ours answered
    pip_runs = [c for c in started if isinstance(c, list) and c[1:3] == ["-mpip", "list"]]
    assert len(pip_runs) == 1 and pip_runs[0] not in ours_started
    assert sorted(map(str, ours_started)) == sorted(str(c) for c in started if c not in pip_runs)
