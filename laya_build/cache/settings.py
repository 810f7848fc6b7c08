"""The cache a build uses: ``pipeline.yaml``'s ``cache:`` with the environment's overrides.

Decided once, when the configuration is loaded, and refused there (a :class:`ConfigError`,
exit status 3) when the url cannot name a cache.  Nothing here imports fsspec.

Environment (for CI, over the file): ``LAYA_BUILD_CACHE_URL`` (a url turns the cache on),
``LAYA_BUILD_CACHE_READ`` / ``LAYA_BUILD_CACHE_WRITE`` (``yes`` or ``no``),
``LAYA_BUILD_CACHE_TIMEOUT_S``, ``LAYA_BUILD_CACHE_ENDPOINT_URL`` (an S3 endpoint, the
``endpoint_url`` storage option) and ``LAYA_BUILD_CACHE=off`` (no cache, whatever the file says).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from laya_build.errors import ConfigError

ENV_URL = "LAYA_BUILD_CACHE_URL"
ENV_READ = "LAYA_BUILD_CACHE_READ"
ENV_WRITE = "LAYA_BUILD_CACHE_WRITE"
ENV_TIMEOUT = "LAYA_BUILD_CACHE_TIMEOUT_S"
ENV_ENDPOINT = "LAYA_BUILD_CACHE_ENDPOINT_URL"
ENV_SWITCH = "LAYA_BUILD_CACHE"  # "off": no cache
ENVIRONMENT = {
    ENV_URL: "the cache's url (a folder or s3://bucket/prefix); setting it turns the cache on",
    ENV_READ: "yes or no: fetch results from the cache",
    ENV_WRITE: "yes or no: store the results this build makes",
    ENV_TIMEOUT: "seconds one cache operation may take",
    ENV_ENDPOINT: "the S3 endpoint of an s3:// cache (storage option endpoint_url)",
    ENV_SWITCH: "off: no cache, whatever pipeline.yaml says",
}
PROTOCOLS = ("file", "s3")
DEFAULT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class CacheSettings:
    url: str  # a folder's absolute path, or s3://bucket/prefix
    read: bool = True
    write: bool = True
    timeout_s: float = DEFAULT_TIMEOUT_S
    options: dict = field(default_factory=dict)

    @property
    def protocol(self) -> str:
        return "s3" if self.url.startswith("s3://") else "file"

    def describe(self) -> str:
        mode = "+".join(m for m, on in (("read", self.read), ("write", self.write)) if on) or "neither read nor write"
        return f"{self.url} ({mode})"


def default_url(env=None) -> str:
    """The per-user cache folder: ``$XDG_CACHE_HOME/laya-build/cache`` (``~/.cache/...``)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "laya-build" / "cache")


def _flag(name: str, value: str) -> bool:
    if value.lower() in ("yes", "true", "1", "on"):
        return True
    if value.lower() in ("no", "false", "0", "off"):
        return False
    raise ConfigError(f"environment {name}={value!r}: expected yes or no", hint=f"{name}=yes or {name}=no")


def normalise_url(url: str, label: str) -> str:
    """A folder (absolute, ``~`` expanded, ``file://``) or ``s3://bucket[/prefix]``; anything
    else is refused naming where it came from."""
    if "://" in url:
        scheme, _, rest = url.partition("://")
        if scheme not in PROTOCOLS:
            raise ConfigError(
                f"{label}: cache url {url!r}: protocol {scheme!r} is not supported (supported: a folder, file://, s3://)",
                hint="e.g. cache.url: /mnt/shared/laya-cache, or s3://bucket/laya-cache",
            )
        if scheme == "file":
            url = rest
        else:
            if not rest.split("/", 1)[0]:
                raise ConfigError(f"{label}: cache url {url!r} names no bucket", hint="s3://<bucket>/<prefix>")
            return url.rstrip("/")
    path = Path(url).expanduser()
    if not path.is_absolute():
        raise ConfigError(
            f"{label}: cache url {url!r} is a relative path; a cache is shared by checkouts, so it is named absolutely",
            hint="give an absolute folder (/var/cache/laya), ~/..., or s3://bucket/prefix",
        )
    return str(path)


def cache_settings(cfg: dict | None, *, label: str = "pipeline.yaml", env=None) -> CacheSettings | None:
    """What ``cache:`` (None: absent) and the environment ask for; None when there is no cache."""
    env = os.environ if env is None else env
    if env.get(ENV_SWITCH, "").lower() in ("off", "no", "0", "false"):
        return None
    url_env = env.get(ENV_URL)
    if cfg is None and not url_env:
        return None
    cfg = dict(cfg or {})
    if url_env:
        url = normalise_url(url_env, f"environment {ENV_URL}")
    else:
        url = normalise_url(cfg.get("url") or default_url(env), f"{label}: cache.url")
    read = _flag(ENV_READ, env[ENV_READ]) if env.get(ENV_READ) else cfg.get("read", True)
    write = _flag(ENV_WRITE, env[ENV_WRITE]) if env.get(ENV_WRITE) else cfg.get("write", True)
    timeout = cfg.get("timeout_s", DEFAULT_TIMEOUT_S)
    if env.get(ENV_TIMEOUT):
        try:
            timeout = float(env[ENV_TIMEOUT])
            if not 0 < timeout <= 3600:
                raise ValueError
        except ValueError:
            raise ConfigError(
                f"environment {ENV_TIMEOUT}={env[ENV_TIMEOUT]!r}: expected seconds in (0, 3600]",
                hint=f"e.g. {ENV_TIMEOUT}=10",
            ) from None
    options = dict(cfg.get("options") or {})
    if env.get(ENV_ENDPOINT):
        options["endpoint_url"] = env[ENV_ENDPOINT]
    settings = CacheSettings(url=url, read=read, write=write, timeout_s=float(timeout), options=options)
    if settings.protocol == "s3":
        try:
            import importlib.util

            found = importlib.util.find_spec("s3fs") is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ConfigError(
                f"{label}: cache url {url}: s3:// needs the s3fs package, which is not installed",
                hint="install it (`pip install s3fs`, the project's optional extra), or use a folder",
            )
    return settings
