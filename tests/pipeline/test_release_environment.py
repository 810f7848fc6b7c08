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
