"""``laya_build.runtime.digest``: the sha256 that every check of the project compares, equal to
``hashlib``'s for files of every size, from any position, and for streams that are no plain file."""

from __future__ import annotations

import hashlib
import io

import pytest

from laya_build.runtime import digest


@pytest.mark.parametrize("size", [0, 1, 4095, digest.BLOCK - 1, digest.BLOCK, digest.BLOCK + 1, 2 * digest.BLOCK + 7])
def test_a_files_digest_is_hashlibs(tmp_path, size):
    data = (bytes(range(256)) * (size // 256 + 1))[:size]
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    assert digest.sha256_file(path) == hashlib.sha256(data).hexdigest()
    with open(path, "rb") as fh:
        fh.read(min(size, 3))
        assert digest.sha256_of(fh) == hashlib.sha256(data[min(size, 3) :]).hexdigest()


def test_a_stream_without_a_file_is_hashed_in_blocks():
    data = b"laya" * 1000
    assert digest.sha256_of(io.BytesIO(data)) == hashlib.sha256(data).hexdigest()


def test_a_file_whose_size_says_nothing_is_hashed_whole():
    path = "/proc/version"  # st_size 0, content of its own
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        pytest.skip(f"{path} cannot be read here")
    assert data and digest.sha256_file(path) == hashlib.sha256(data).hexdigest()


def test_a_non_blocking_stream_without_data_has_no_digest():
    import os

    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    try:
        with open(read_end, "rb", buffering=0) as fh, pytest.raises(BlockingIOError):
            digest.sha256_of(fh)
    finally:
        os.close(write_end)
