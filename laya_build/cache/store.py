"""The cache's storage, through fsspec: a folder (local or a shared mount) or S3 (s3fs).

Layout under the url::

    blobs/<sha[:2]>/<sha256>        every output file, named by the sha256 of its bytes
    entries/<key[:2]>/<key>.json    a task's key -> the sha256 of each of its outputs

Writes are atomic: on a folder, a temporary name beside the target, then a rename; on S3, one
``put`` (an object appears whole or not at all).  Blobs first, the entry last, so an entry
never names a blob that is not there.  Every operation runs under a deadline
(``cache.timeout_s``; a blob gets more in proportion to its size): one past it, like any error
of the filesystem, raises :class:`CacheUnavailable`, which the caller turns into one warning
and a local build.  A dead mount's call that never returns is left behind in a daemon thread.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import uuid
from pathlib import Path

from laya_build.cache.settings import CacheSettings

CHUNK = 1 << 20
# Bytes per second a blob transfer is granted beyond the base deadline (slow links still finish).
MIN_RATE = 4 << 20


class CacheUnavailable(Exception):
    """The cache could not be reached, or an operation on it failed or ran past its deadline."""


class BlobMismatch(Exception):
    """A blob's bytes do not have the sha256 that names it."""


class MissingBlob(Exception):
    """An entry names a blob that is not in the cache."""


def _deadline(fn, timeout: float, what: str):
    """``fn()`` in a daemon thread, waited for at most ``timeout`` seconds."""
    box: dict = {}

    def work():
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=work, daemon=True, name=f"laya-cache {what}")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise CacheUnavailable(f"{what}: no answer within {timeout:g} s")
    if "error" in box:
        exc = box["error"]
        if isinstance(exc, (BlobMismatch, MissingBlob, CacheUnavailable)):
            raise exc
        raise CacheUnavailable(f"{what}: {type(exc).__name__}: {exc}".splitlines()[0][:300]) from exc
    return box.get("value")


class Store:
    """One cache url, opened lazily (and again in a forked process)."""

    def __init__(self, settings: CacheSettings):
        self.settings = settings
        self._fs = None
        self._pid = None

    # ------------------------------------------------------------------------ filesystem
    @property
    def fs(self):
        if self._fs is None or self._pid != os.getpid():
            self._fs = _deadline(self._open, self.settings.timeout_s, f"opening {self.settings.url}")
            self._pid = os.getpid()
        return self._fs

    def _open(self):
        import fsspec

        options = dict(self.settings.options)
        if self.settings.protocol == "s3":
            t = self.settings.timeout_s
            config = dict(options.pop("config_kwargs", {}) or {})
            config.setdefault("connect_timeout", t)
            config.setdefault("read_timeout", t)
            config.setdefault("retries", {"max_attempts": 2, "mode": "standard"})
            if "endpoint_url" in options:  # s3fs takes it among the client's arguments too
                client = dict(options.pop("client_kwargs", {}) or {})
                client.setdefault("endpoint_url", options.pop("endpoint_url"))
                options["client_kwargs"] = client
            return fsspec.filesystem("s3", config_kwargs=config, skip_instance_cache=True, **options)
        return fsspec.filesystem("file", auto_mkdir=True)

    @property
    def base(self) -> str:
        url = self.settings.url
        return url.removeprefix("s3://") if self.settings.protocol == "s3" else url

    @property
    def is_folder(self) -> bool:
        return self.settings.protocol == "file"

    def blob_path(self, sha: str) -> str:
        return f"{self.base}/blobs/{sha[:2]}/{sha}"

    def entry_path(self, key: str) -> str:
        return f"{self.base}/entries/{key[:2]}/{key}.json"

    def _timeout(self, size: int = 0) -> float:
        return self.settings.timeout_s + size / MIN_RATE

    # ------------------------------------------------------------------------ operations
    def probe(self) -> None:
        """Raise :class:`CacheUnavailable` unless the cache answers (and, to be written, exists)."""

        def check():
            fs = self.fs
            if self.is_folder:
                if self.settings.write:
                    fs.makedirs(self.base, exist_ok=True)
                elif not fs.isdir(self.base):
                    raise FileNotFoundError(f"{self.base} is not a folder")
                if not os.access(self.base, os.R_OK | os.X_OK | (os.W_OK if self.settings.write else 0)):
                    raise PermissionError(f"{self.base} cannot be {'written' if self.settings.write else 'read'}")
            else:
                bucket = self.base.split("/", 1)[0]
                fs.ls(bucket, refresh=True)

        _deadline(check, self._timeout(), f"reaching {self.settings.url}")

    def get_entry(self, key: str) -> dict | None:
        path = self.entry_path(key)

        def read():
            try:
                with self.fs.open(path, "rb") as fh:
                    return fh.read(1 << 22)
            except FileNotFoundError:
                return None

        raw = _deadline(read, self._timeout(), f"reading entry {key[:16]}")
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return {"malformed": True}

    def fetch_blob(self, sha: str, dest: Path, size: int = 0) -> None:
        """Copy blob ``sha`` to ``dest``, checking its sha256 as it comes (:class:`BlobMismatch`)."""

        def copy():
            h = hashlib.sha256()
            try:
                src = self.fs.open(self.blob_path(sha), "rb")
            except FileNotFoundError:
                raise MissingBlob(f"blob {sha} is not in the cache") from None
            with src, open(dest, "wb") as out:
                while chunk := src.read(CHUNK):
                    h.update(chunk)
                    out.write(chunk)
            if h.hexdigest() != sha:
                raise BlobMismatch(f"blob {sha} holds bytes whose sha256 is {h.hexdigest()}")

        _deadline(copy, self._timeout(size), f"fetching blob {sha[:16]}")

    def has_blob(self, sha: str) -> bool:
        return bool(_deadline(lambda: self.fs.exists(self.blob_path(sha)), self._timeout(), f"looking up {sha[:16]}"))

    def put_blob(self, sha: str, src: Path) -> None:
        size = src.stat().st_size
        self._put(lambda target: self.fs.put_file(str(src), target), self.blob_path(sha), size, f"storing {sha[:16]}")

    def put_entry(self, key: str, doc: dict) -> None:
        data = json.dumps(doc, indent=1, sort_keys=True).encode()

        def write(target):
            with self.fs.open(target, "wb") as fh:
                fh.write(data)

        self._put(write, self.entry_path(key), len(data), f"storing entry {key[:16]}")

    def remove_blob(self, sha: str) -> None:
        _deadline(lambda: self.fs.rm_file(self.blob_path(sha)), self._timeout(), f"removing {sha[:16]}")

    def _put(self, write, target: str, size: int, what: str) -> None:
        def put():
            if self.is_folder:
                parent = target.rsplit("/", 1)[0]
                self.fs.makedirs(parent, exist_ok=True)
                tmp = f"{parent}/.{target.rsplit('/', 1)[1]}.{uuid.uuid4().hex}.tmp"
                try:
                    write(tmp)
                    os.replace(tmp, target)  # the rename of a folder cache: atomic on one filesystem
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
            else:
                write(target)  # one PUT: the object appears whole or not at all

        _deadline(put, self._timeout(size), what)
