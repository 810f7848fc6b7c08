"""File digests remembered while a file is unchanged (laya_build.filedigests), and what uses them.

A digest is hashed once: later asks, in this process or in another that uses the same database,
are answered without reading the file.  Anything that changes the file (its bytes at the same
size, its mode, an mtime set back, a replacement) makes it hashed again.  A fetch from the cache
remembers the digests it checked, so that the outputs' record, the next stage's key and doit's
state of its file dependencies read none of the fetched bytes again.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from laya_build import PROJECT_ROOT, cache, filedigests
from laya_build.cache import keys
from laya_build.cache.settings import CacheSettings
from laya_build.stage import Stage
from laya_build.tasks.state import Sha256Checker


@pytest.fixture
def digests(tmp_path):
    db = tmp_path / "digests.sqlite3"
    filedigests.use(db)
    yield db
    filedigests.use(None)


@pytest.fixture
def hashed(monkeypatch):
    """The files this process reads to hash them."""
    read: list[str] = []
    real = filedigests.sha256_file

    def counting(path):
        read.append(str(path))
        return real(path)

    monkeypatch.setattr(filedigests, "sha256_file", counting)
    return read


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def settle():
    """Let a file just written become old enough to have its digest remembered."""
    time.sleep(filedigests.RACY_NS / 1e9 * 1.5)


def test_a_file_is_hashed_once_while_unchanged(tmp_path, digests, hashed):
    f = tmp_path / "blob.bin"
    f.write_bytes(b"a" * 100_000)
    settle()
    assert filedigests.sha256(f) == filedigests.sha256(f) == sha(b"a" * 100_000)
    assert hashed == [str(f)]


def test_a_file_hashed_within_a_tick_of_its_last_change_is_not_remembered(tmp_path, digests, hashed, monkeypatch):
    """Racily clean, as git calls it: on a file system whose times tick every few milliseconds, a
    rewrite right after the hash could keep the file's times, so such a digest is not kept."""
    f = tmp_path / "blob.bin"
    f.write_bytes(b"1" * 64)
    with monkeypatch.context() as m:  # a tick long enough that a loaded machine hashes within it
        m.setattr(filedigests, "RACY_NS", 3600 * 10**9)
        assert filedigests.sha256(f) == filedigests.sha256(f) == sha(b"1" * 64)
    assert hashed == [str(f), str(f)]  # both asks read the bytes
    settle()
    assert filedigests.sha256(f) == filedigests.sha256(f) == sha(b"1" * 64)
    assert hashed == [str(f)] * 3  # settled: the third ask's digest is kept


@pytest.mark.parametrize(
    "change",
    ["same size, other bytes", "other bytes, mtime set back", "mode", "replaced by a rename"],
)
def test_any_change_to_the_file_makes_it_hashed_again(tmp_path, digests, hashed, change):
    f = tmp_path / "blob.bin"
    f.write_bytes(b"a" * 4096)
    settle()
    first = filedigests.sha256(f)
    st = f.stat()
    if change == "same size, other bytes":
        with open(f, "r+b") as fh:
            fh.write(b"b")
        expected = sha(b"b" + b"a" * 4095)
    elif change == "other bytes, mtime set back":
        with open(f, "r+b") as fh:
            fh.write(b"c")
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert f.stat().st_mtime_ns == st.st_mtime_ns and f.stat().st_size == st.st_size
        expected = sha(b"c" + b"a" * 4095)
    elif change == "mode":
        os.chmod(f, 0o600)
        expected = first
    else:
        other = tmp_path / "other.bin"
        other.write_bytes(b"d" * 4096)
        os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.replace(other, f)
        expected = sha(b"d" * 4096)
    assert filedigests.sha256(f) == expected
    assert hashed == [str(f), str(f)]


def test_another_process_with_the_database_reads_no_bytes(tmp_path, digests):
    f = tmp_path / "blob.bin"
    f.write_bytes(os.urandom(1 << 20))
    settle()
    known = filedigests.sha256(f)
    code = textwrap.dedent(
        f"""
        import sys
        from laya_build import filedigests
        filedigests.use({str(digests)!r})
        def refuse(path):
            raise SystemExit("read " + str(path))
        filedigests.sha256_file = refuse
        print(filedigests.sha256({str(f)!r}))
        """
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == known


def test_an_unusable_database_only_costs_hashing(tmp_path, hashed):
    (tmp_path / "db").mkdir()  # a folder where the database should be
    filedigests.use(tmp_path / "db")
    try:
        f = tmp_path / "blob.bin"
        f.write_bytes(b"x" * 10)
        assert filedigests.sha256(f) == filedigests.sha256(f) == sha(b"x" * 10)
    finally:
        filedigests.use(None)


def test_a_fetch_remembers_what_it_checked_for_record_key_and_doit_state(tmp_path, digests, hashed, monkeypatch):
    """What reads a fetched output after the fetch: the outputs' record (the fetch's own), the
    key of the stage that reads it, doit's state of that stage's file dependency."""
    folder = tmp_path / "cache"
    settings = CacheSettings(url=str(folder), read=True, write=True)
    root = tmp_path / "checkout"
    out = root / "artifacts" / "0.1.0" / "export" / "exported.pt2"
    out.parent.mkdir(parents=True)
    data = os.urandom(1 << 20)
    blob = sha(data)
    # the entry and blob another builder stored
    src = tmp_path / "built.pt2"
    src.write_bytes(data)
    stage = Stage(
        "export",
        "cpu-float32",
        "",
        "m:f",
        files=(out,),
        writes_into=root / "artifacts" / "0.1.0",
        outputs_record=root / "artifacts" / ".doit" / "outputs" / "export.json",
    )
    store = cache.store_for(settings)
    store.put_blob(blob, src)
    files = {out.relative_to(root).as_posix(): blob}
    entry = {"format": cache.ENTRY_FORMAT, "key": "k" * 64, "task": stage.task, "files": files, "sizes": {}}
    store.put_entry("k" * 64, entry)
    assert cache.fetch(stage, "k" * 64, root=root, settings=settings, scratch=tmp_path / "scratch")
    assert out.read_bytes() == data
    assert stage.outputs.saved() == {str(out): blob}
    reader = Stage("aoti_package", "cpu-float32", "", "m:f", inputs=(out,))
    parts = keys.key_parts(root, reader, code=[], version="0.1.0", third_party=frozenset(), tools=())
    assert parts["inputs"] == {"artifacts/0.1.0/export/exported.pt2": blob}
    state = Sha256Checker().get_state(str(out), None)
    assert state[1:] == (len(data), blob)
    assert not Sha256Checker().check_modified(str(out), out.stat(), state)
    assert str(out) not in hashed  # none of them read the fetched bytes again
    # and a change after the fetch is seen by each of them
    with open(out, "r+b") as fh:
        fh.write(bytes([data[0] ^ 1]))
    assert Sha256Checker().check_modified(str(out), out.stat(), state)
    assert stage.outputs.altered() and stage.outputs.altered()[0][2] == blob


def test_doit_states_saved_by_its_md5_checker_are_compared_by_md5(tmp_path, digests):
    f = tmp_path / "dep.txt"
    f.write_bytes(b"dependency")
    st = f.stat()
    md5_state = (st.st_mtime, st.st_size, hashlib.md5(b"dependency").hexdigest())
    checker = Sha256Checker()
    assert not checker.check_modified(str(f), st, md5_state)
    os.utime(f, (st.st_atime + 5, st.st_mtime + 5))  # touched, the same bytes: the md5 says unchanged
    assert not checker.check_modified(str(f), f.stat(), md5_state)
    f.write_bytes(b"dependencY")
    assert checker.check_modified(str(f), f.stat(), md5_state)
    assert checker.get_state(str(f), md5_state)[2] == sha(b"dependencY")


def test_doit_is_configured_with_the_sha256_checker_and_the_checkout_database():
    from laya_build.tasks import doit_config, load_pipeline

    p = load_pipeline()
    try:
        config = doit_config(p)
        assert config["check_file_uptodate"] is Sha256Checker
        assert filedigests._STATE["db"] == Path(p.artifacts.digests_db())
    finally:
        filedigests.use(None)
