"""The sha256 of a file, read and hashed in large blocks (standard library only).

``hashlib.file_digest`` reads 256 KiB at a time and takes the GIL back after every read and
every hash: a thread hashing a 745 MB package beside a thread importing torch (seconds of
Python bytecode) waits for the GIL about 2,800 times, and took 7.9–8.9 s on the H200 machine
against 0.73 s alone (docs/measurements/serving-start.md).  In blocks of :data:`BLOCK` bytes the
GIL is released for each whole read and each whole hash, and taken back only a few dozen times.
"""

from __future__ import annotations

import hashlib
import os
import stat

BLOCK = 32 << 20  # bytes per read and per hash update
SMALLEST = 1 << 16  # the buffer for a file whose size says nothing (0 in /proc, a pipe)


def sha256_of(fh) -> str:
    """The hex sha256 of what is left to read in the binary file ``fh``.  The buffer is a block,
    or the file's size where that is less (a small file costs no block-sized allocation)."""
    try:
        st = os.fstat(fh.fileno())
        left = st.st_size - fh.tell() if stat.S_ISREG(st.st_mode) and st.st_size > 0 else SMALLEST
    except (AttributeError, OSError, ValueError):  # no file descriptor: read in blocks
        left = BLOCK
    buffer = bytearray(max(SMALLEST, min(BLOCK, left + 1)))  # + 1: the read that finds the end
    view = memoryview(buffer)
    digest = hashlib.sha256()
    while True:
        n = fh.readinto(buffer)
        if n is None:  # a non-blocking stream with nothing to read now: no digest of it
            raise BlockingIOError(f"{getattr(fh, 'name', fh)!r}: no data to hash without blocking")
        if not n:
            return digest.hexdigest()
        digest.update(view[:n])


def sha256_file(path: str | os.PathLike) -> str:
    """The hex sha256 of the file at ``path``."""
    with open(path, "rb") as fh:
        return sha256_of(fh)
