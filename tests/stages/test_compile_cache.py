"""The package compile's Inductor cache folder (``laya_build.stages.package.compile_cache_key``,
``laya_build.runner.folders.inductor_cache``): AOTInductor writes its path into the package, so
the same exported programs compile at the same path, one build at a time, whoever builds them
(another user's build is waited for), whatever their ``$TMPDIR`` and from whichever Python
environment; other programs compile beside them at once (real processes, also of another user,
each holding a folder as the package stage does, and real package compiles: the CPU package, and
on a GPU machine a CUDA one)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from pathlib import Path

import pytest

from laya_build.runner import folders
from laya_build.stages.package import compile_cache_key

HOLD = """
import sys, time
from pathlib import Path
from laya_build.runner.folders import inductor_cache
with inductor_cache(sys.argv[1], shared=sys.argv[4] == "shared") as cache:
    Path(sys.argv[2]).write_text(str(cache))
    if sys.argv[3].replace(".", "", 1).isdigit():  # seconds
        time.sleep(float(sys.argv[3]))
    else:  # a file: until the test makes it
        deadline = time.monotonic() + 120
        while not Path(sys.argv[3]).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
"""


def _programs(*shas: str) -> list[dict]:
    names = ("decision", "decision_single_slot")
    return [{"name": n, "exported": {"sha256": s}} for n, s in zip(names, shas)]


def test_the_key_is_the_stage_target_dtype_and_a_digest_of_the_programs():
    one = compile_cache_key("cuda", "bfloat16", _programs("a" * 64, "b" * 64))
    assert one == compile_cache_key("cuda", "bfloat16", _programs("a" * 64, "b" * 64))
    assert one.startswith("package-cuda-bfloat16-") and len(one.rsplit("-", 1)[1]) == 16
    others = {
        compile_cache_key("cuda", "bfloat16", _programs("a" * 64, "c" * 64)),
        compile_cache_key("cuda", "bfloat16", _programs("a" * 64)),
        compile_cache_key("cuda", "float32", _programs("a" * 64, "b" * 64)),
        compile_cache_key("cpu", "bfloat16", _programs("a" * 64, "b" * 64)),
    }
    assert one not in others and len(others) == 4


def _hold(key: str, marker, seconds: float, env: dict, shared: bool = False) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", HOLD, key, str(marker), str(seconds), "shared" if shared else "own"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _unique(digit: str) -> list[dict]:  # programs no other test's build compiles
    return _programs(uuid.uuid4().hex + digit * 32)


@pytest.mark.parametrize("shared", [False, True], ids=["own", "shared"])
def test_other_programs_compile_at_once_and_the_same_programs_take_turns(tmp_path, shared):
    """In the user's own folder (one ``$TMPDIR``), and in the shared one, where the build that
    takes turns has another ``$TMPDIR`` and still gets the same folder."""
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp-1")}  # this user's folders, under the test's own
    (tmp_path / "tmp-1").mkdir(), (tmp_path / "tmp-2").mkdir()
    mine = compile_cache_key("cpu", "float32", _unique("1"))
    other = compile_cache_key("cpu", "float32", _unique("2"))
    holder = _hold(mine, tmp_path / "held", 120, {**env, "LAYA_TASK": "aoti_package:cpu-float32"}, shared)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "held").exists():
            assert holder.poll() is None and time.monotonic() < deadline, holder.communicate()[0]
            time.sleep(0.05)
        held = (tmp_path / "held").read_text()
        if shared:
            assert held == str(folders.SHARED_COMPILE_ROOT / mine)
        else:
            assert held.startswith(str(tmp_path / "tmp-1")) and held.endswith(mine)
        beside = _hold(other, tmp_path / "beside", 0, env, shared)
        out = beside.communicate(timeout=60)[0]  # the holder keeps its folder for 120 s
        assert beside.returncode == 0 and "waiting" not in out, out
        assert (tmp_path / "beside").read_text() != (tmp_path / "held").read_text()

        if shared:
            env = {**env, "TMPDIR": str(tmp_path / "tmp-2")}
        same = _hold(mine, tmp_path / "same", 0, env, shared)
        deadline = time.monotonic() + 60
        lines = []
        for line in same.stdout:  # it says what it waits for, then waits
            lines.append(line)
            if "waiting" in line or time.monotonic() > deadline:
                break
        waits_for = (
            f"the compile folder {folders.SHARED_COMPILE_ROOT / mine}" if shared else f"the Inductor cache {mine}"
        )
        assert any(f"waiting for {waits_for}" in line for line in lines), lines
        # and whom: the holder's pid, its task and its checkout
        whom = f"held by pid {holder.pid}, `aoti_package:cpu-float32 in {Path.cwd()}`, started "
        assert any(whom in line for line in lines), lines
        assert same.poll() is None and not (tmp_path / "same").exists()
    finally:
        holder.kill()
        holder.wait()
    same.communicate(timeout=60)  # its turn, once the holder is gone
    assert same.returncode == 0 and (tmp_path / "same").read_text() == (tmp_path / "held").read_text()


NOBODY = 65534
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def other_user():
    if os.getuid() != 0:
        pytest.skip("needs root, to make a folder another user's")
    return NOBODY


@pytest.fixture
def as_other_user(other_user):
    """How to run this checkout's Python as another user (``nobody``), with a ``$TMPDIR`` and home
    of its own: ``prefix`` (``setpriv``; the process keeps only the capability to read and search
    any file, CAP_DAC_READ_SEARCH, so that a checkout or a Python in root's home can be read:
    what it writes, and the uid every check of the code compares, are ``nobody``'s) and the
    keywords of ``subprocess``; skips where that cannot run."""
    place = Path(tempfile.mkdtemp(prefix="laya-other-user-", dir="/tmp"))
    os.chmod(place, 0o755)
    home = place / "home"
    home.mkdir()
    os.chown(home, other_user, other_user)
    prefix = [
        "setpriv",
        f"--reuid={other_user}",
        f"--regid={other_user}",
        "--clear-groups",
        "--inh-caps=-all,+dac_read_search",
        "--ambient-caps=+dac_read_search",
        "--",
    ]
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(home), "LOGNAME": "nobody", "USER": "nobody"}
    kwargs = {"cwd": REPO, "env": env}
    probe_code = "import os, laya_build.runner.folders; print(os.getuid())"
    try:
        probe = subprocess.run([*prefix, sys.executable, "-c", probe_code], capture_output=True, text=True, **kwargs)
        said = probe.stdout.strip() if probe.returncode == 0 else (probe.stderr.strip().splitlines() or ["?"])[-1]
    except OSError as exc:
        said = str(exc)
    if said != str(other_user):
        shutil.rmtree(place)
        pytest.skip(f"this checkout's Python cannot run as another user here: {said}")
    yield {"prefix": prefix, "place": place, "kwargs": kwargs}
    shutil.rmtree(place)


def test_a_shared_root_of_another_user_is_not_used(tmp_path, monkeypatch, other_user):
    """Its owner could swap a folder inside it: the compile takes the user's own folder and says so."""
    root = tmp_path / "compile"
    root.mkdir(mode=0o777)
    os.chmod(root, 0o1777)
    os.chown(root, other_user, other_user)
    monkeypatch.setattr(folders, "SHARED_COMPILE_ROOT", root)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    lines = []
    monkeypatch.setattr(folders.log, "info", lines.append)
    key = compile_cache_key("cpu", "float32", _unique("3"))
    with folders.inductor_cache(key, shared=True) as cache:
        assert not cache.shared and cache.path.parent == folders.inductor_root() and cache.path.is_dir()
    assert lines == [
        f"[laya] the shared compile folder {root / key} cannot be used: it belongs to uid {other_user}, neither this "
        f"user nor root (to share it, have root make it as /tmp is: `install -d -o root -m 1777 {root}`, once its "
        "owner has removed it); compiling in this user's own folder, so the package's bytes differ from a build in "
        "the shared one"
    ]
    assert list(root.iterdir()) == []


def test_a_shared_folder_another_user_left_is_theirs_or_roots_to_remove(tmp_path, monkeypatch, other_user):
    root = tmp_path / "compile"
    monkeypatch.setattr(folders, "SHARED_COMPILE_ROOT", root)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    key = compile_cache_key("cpu", "float32", _unique("4"))
    assert folders.shared_compile_root() == (root, "")
    assert oct(root.stat().st_mode & 0o7777) == "0o1777"
    theirs = root / key
    theirs.mkdir(mode=0o700)
    (theirs / "their-file").write_text("theirs")
    os.chown(theirs, other_user, other_user)
    lines = []
    monkeypatch.setattr(folders.log, "info", lines.append)
    with folders.inductor_cache(key, shared=True) as cache:
        assert not cache.shared and cache.path != theirs
    assert (theirs / "their-file").read_text() == "theirs"
    assert lines[:1] == [
        f"[laya] the shared compile folder {theirs} cannot be used: {theirs} is left by uid {other_user}, and no "
        "build of theirs holds it (only that user or root may remove it); compiling in this user's own folder, so "
        "the package's bytes differ from a build in the shared one"
    ]
    # their lock file, which no process of theirs holds: their build did not finish (killed), and root,
    # holding their lock meanwhile, removes what it left and compiles in the shared folder
    lock = root / f".{key}.{other_user}.lock"
    lock.touch(mode=0o644)
    os.chown(lock, other_user, other_user)
    lines.clear()
    with folders.inductor_cache(key, shared=True) as cache:
        assert cache.shared and cache.path == theirs and not (theirs / "their-file").exists()
        assert theirs.stat().st_uid == os.getuid()
    assert lines == [
        f"[laya] removed the compile folder {theirs}: uid {other_user}'s build left it unfinished (none of theirs "
        "holds it)"
    ]
    assert lock.stat().st_uid == other_user  # their lock stays theirs, for their next build
    with folders.inductor_cache(compile_cache_key("cpu", "float32", _unique("5")), shared=True) as cache:
        assert cache.shared and cache.path.parent == root and oct(cache.path.stat().st_mode & 0o777) == "0o700"
        assert cache.tmp == cache.path / "tmp"


def test_the_compiles_temporary_folder_is_its_own_and_its_headers_the_users(tmp_path, monkeypatch):
    """The compile's ``TMPDIR`` is inside its folder, at the same path for every user; Inductor's
    precompiled headers there are a link to this user's private store, which outlives the compile."""
    root = tmp_path / "compile"
    monkeypatch.setattr(folders, "SHARED_COMPILE_ROOT", root)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this user's folders, under the test's own
    key = compile_cache_key("cpu", "float32", _unique("6"))
    with folders.inductor_cache(key, shared=True) as cache:
        assert cache.shared and cache.tmp == root / key / "tmp"
        headers = cache.tmp / "torchinductor_laya-build" / "precompiled_headers"
        assert headers.is_symlink() and headers.resolve() == folders.precompiled_headers().resolve()
        assert (
            folders.precompiled_headers() == tmp_path / f"laya-build-{os.getuid()}" / "inductor" / "precompiled-headers"
        )
        assert oct(folders.precompiled_headers().stat().st_mode & 0o777) == "0o700"
        (headers / "kept.h").write_text("// a header built in this compile\n")
    assert not (root / key).exists() and cache.removed
    assert (folders.precompiled_headers() / "kept.h").read_text() == "// a header built in this compile\n"
    assert [p.name for p in root.iterdir()] == [f".{key}.{os.getuid()}.lock"]  # and who held it went with it


def test_a_build_of_another_user_that_holds_the_folder_is_waited_for(as_other_user):
    """Another user's real build holds the shared folder of the same programs: this build says what
    it waits for, waits, then compiles in the same folder (not in a folder of its own)."""
    marker, release = as_other_user["place"] / "home" / "held", as_other_user["place"] / "home" / "release"
    key = compile_cache_key("cpu", "float32", _unique("7"))
    theirs = subprocess.Popen(
        [*as_other_user["prefix"], sys.executable, "-c", HOLD, key, str(marker), str(release), "shared"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **as_other_user["kwargs"],
    )
    mine = None
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert theirs.poll() is None and time.monotonic() < deadline, theirs.communicate()[0]
            time.sleep(0.05)
        assert marker.read_text() == str(folders.SHARED_COMPILE_ROOT / key)
        assert (folders.SHARED_COMPILE_ROOT / key).stat().st_uid == NOBODY
        mine = subprocess.Popen(
            [sys.executable, "-c", HOLD, key, "/dev/null", "0", "shared"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
        )
        lines = []
        for line in mine.stdout:  # it says whom it waits for; then their build ends
            lines.append(line)
            if "waiting for the compile folder" in line:
                break
        release.touch()
        said = "".join(lines) + mine.communicate(timeout=120)[0]
        assert theirs.wait(timeout=60) == 0
    finally:
        theirs.kill()
        if mine is not None:
            mine.kill()
    assert mine.returncode == 0, said
    lock = folders.SHARED_COMPILE_ROOT / f".{key}.{NOBODY}.lock"
    expected = f"waiting for the compile folder {folders.SHARED_COMPILE_ROOT / key} (lock {lock}, held by uid {NOBODY}"
    assert expected in said and "cannot be used" not in said, said
    assert not (folders.SHARED_COMPILE_ROOT / key).exists()


def test_a_folder_another_user_makes_in_the_same_instant_is_theirs(tmp_path, monkeypatch, other_user):
    """Between this build's look and its ``mkdir`` another user's build makes the folder: this
    build looks again and finds it theirs (and then waits for their build), not a folder it cannot make."""
    target = tmp_path / "compile-folder"
    real_mkdir = Path.mkdir

    def racing_mkdir(self, *args, **kwargs):
        if self == target and not target.exists():
            real_mkdir(self, mode=0o700)
            os.chown(self, other_user, other_user)  # their build was first
            raise FileExistsError(17, "File exists", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", racing_mkdir)
    assert folders._own_empty_folder(target) == (f"{target} is left by uid {other_user}", other_user)


PACKAGE = """
import json, sys
from tests.stage_calls import run_package
record = run_package(json.loads(sys.argv[4]), sys.argv[1], sys.argv[2], sys.argv[3], root=sys.argv[5])
print(json.dumps([record["programs"][0]["package"]["sha256"], record["compile_cache"]]))
"""


@dataclasses.dataclass(frozen=True)
class Reference:
    """An export and the package it compiles to in this user's own compile."""

    target: str
    export: Path
    package_cfg: dict  # CUDA: a first compile's launch configurations, an input (no kernel timed again)
    root: Path = REPO  # where package.tuning's paths start
    sha256: str = ""
    cache_path: str = ""


def compile_package(ref: Reference, out: Path, python=sys.executable, prefix=(), **kwargs) -> tuple[str, dict]:
    """Package ``ref``'s export into ``out`` in a fresh process (``prefix``: how to start it as
    another user): its ``decision.pt2`` digest and compile folder record."""
    kwargs.setdefault("cwd", REPO)
    kwargs.setdefault("env", {**os.environ, "HF_HUB_OFFLINE": "1"})
    command = [*prefix, python, "-c", PACKAGE, str(ref.export), str(out), ref.target]
    command += [json.dumps(ref.package_cfg), str(ref.root)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1800, **kwargs)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    sha, cache = json.loads(proc.stdout.strip().splitlines()[-1])
    return sha, cache


@pytest.fixture(scope="module", params=["cpu", "cuda"])
def reference(request, tmp_path_factory):
    """The session's CPU float32 package; on a GPU machine also the tiny model's CUDA bfloat16
    package, compiled with the launch configurations a first compile chose (the tuning file)."""
    from laya_build.records import read_record

    if request.param == "cpu":
        build = request.getfixturevalue("build")
        session = read_record(build.package_record("float32"))
        sha, cache_path = session["programs"][0]["package"]["sha256"], session["compile_cache"]["path"]
        return Reference("cpu", build.export_dir("float32"), {}, sha256=sha, cache_path=cache_path)
    import torch

    if not torch.cuda.is_available():
        pytest.skip("CUDA packages: torch.cuda.is_available() is False")
    from tests.stage_calls import run_export, run_model, run_package

    base = tmp_path_factory.mktemp("cuda-reference")
    run_model({}, base / "model")
    run_export({}, base / "model" / "checkpoint", base / "model" / "inputs.pt", base / "export", "cuda", "bfloat16")
    run_package({}, base / "export", base / "first", "cuda")
    tuned = Reference("cuda", base / "export", {"tuning": {"cuda-bfloat16": "first/tuning.json"}}, root=base)
    sha, cache = compile_package(tuned, base / "package")
    return dataclasses.replace(tuned, sha256=sha, cache_path=cache["path"])


def test_the_package_is_the_same_bytes_whatever_the_tmpdir(reference, tmp_path):
    """Two compiles in fresh processes with two other ``$TMPDIR``s: the reference's bytes, compiled
    in the same shared folder."""
    for n in (1, 2):
        (tmp_path / f"tmp-{n}").mkdir()
        env = {**os.environ, "TMPDIR": str(tmp_path / f"tmp-{n}"), "HF_HUB_OFFLINE": "1"}
        sha, cache = compile_package(reference, tmp_path / f"package-{n}", env=env)
        assert (sha, cache["path"]) == (reference.sha256, reference.cache_path)
    assert reference.cache_path.startswith(f"{folders.SHARED_COMPILE_ROOT}/package-{reference.target}-")


def test_another_user_compiles_the_same_package(reference, as_other_user):
    """A compile by another user (``nobody``, with a ``$TMPDIR`` and home of its own and no
    precompiled headers yet): the reference's bytes, in the same folder."""
    home = as_other_user["place"] / "home"
    sha, cache = compile_package(reference, home / "package", prefix=as_other_user["prefix"], **as_other_user["kwargs"])
    assert (sha, cache["path"]) == (reference.sha256, reference.cache_path)
    assert (home / f"laya-build-{NOBODY}" / "inductor" / "precompiled-headers").stat().st_uid == NOBODY


def test_a_compile_in_another_python_environment_gives_the_same_package(reference, tmp_path):
    """A compile by the Python of another environment at another path (a venv whose site-packages
    holds a link to every entry of the folder this Python imports torch from, as a release
    engineer's own ``.venv`` in another checkout holds the same pinned packages): torch's include
    folders, which each compile command and the library's strings name, must not carry that path
    into the package."""
    import sysconfig

    import torch

    other = tmp_path / "elsewhere" / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(other)], check=True, timeout=120)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(other), "platbase": str(other)}))
    for entry in Path(torch.__file__).resolve().parent.parent.iterdir():
        if not (site / entry.name).exists():
            (site / entry.name).symlink_to(entry)
    python = other / "bin" / "python"
    probe = "import torch.utils.cpp_extension as c; print(c.include_paths()[0])"
    assert subprocess.run([python, "-c", probe], capture_output=True, text=True).stdout.startswith(str(site))
    sha, cache = compile_package(reference, tmp_path / "package", python=python)
    assert (sha, cache["path"]) == (reference.sha256, reference.cache_path)
    packages = sorted((tmp_path / "package").glob("*.pt2"))
    assert packages
    for package in packages:
        with zipfile.ZipFile(package) as archive:
            assert [n for n in archive.namelist() if str(other).encode() in archive.read(n)] == [], package.name
