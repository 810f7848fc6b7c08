"""Release formats: which format a release folder is, and how ``doit verify`` reads each one.

A release's ``manifest.json`` states its format as ``"format": <n>``; a manifest without the
field is format 1 (every release made before the field was written).  Each format is read by
its own rules (``docs/reference/release-format.md``):

* **format 1**: the manifest, the package records and what verify reads of
  ``pipeline.effective.json`` are checked against the schemas format 1 was written with, kept
  frozen in ``schemas/formats/1/``.  Format-1 releases differ among themselves, and each is
  recognised by its content (:func:`variant`): the first ones record no ``preload`` in their
  package records; until 2026-11-30 10:27 ``verify.timing`` is fixed counts for every target
  (``warmup``, ``groups``, ``group_size``; timed as such) and there is no ``runtime`` section
  (the package is then checked behind a runner without buckets: plain calls); until
  2026-11-30 10:00 the saved inputs are of inputs format 1, whose probabilities are the raw
  softmax of the logits (no calibration).
* **format 2** (:data:`CURRENT`): today's schemas (``schemas/*.schema.json``) and today's
  model sections (``schemas/model_sections.schema.json``).

A format newer than :data:`CURRENT` is refused (:class:`ReleaseFormatError`: upgrade
laya-build).  Nothing here writes into a release: the records verify writes go under
``artifacts/verifications/<version>/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from laya_build.errors import RecordError, ReleaseFormatError, message_of
from laya_build.layout import AOTI_PACKAGE_DIR, MANIFEST_NAME, VersionLayout, record_name
from laya_build.records import read_json

CURRENT = 2  # the format `doit release` writes
FIRST = 1  # a manifest without "format"

# A format-1 release made before the serving runtime has no runtime section: its package is
# checked behind a runner without buckets (plain, unpadded calls; no CUDA graphs).
NO_RUNTIME = {"buckets": {}, "capture_warmup": 3}
COUNTS = ("warmup", "groups", "group_size")  # format 1's timing by counts, before 2026-11-30 10:27


@dataclass(frozen=True)
class ReleaseFormat:
    """The schemas a format's releases were written with."""

    number: int
    manifest_schema: str  # schema names (laya_build.schema.load_schema)
    package_schema: str
    config_schema: str | None  # what verify reads of the effective configuration; None: today's model sections
    written: str  # which releases have it

    def __str__(self) -> str:
        return f"release format {self.number}"


FORMATS = {
    1: ReleaseFormat(
        1,
        "formats/1/manifest",
        "formats/1/aoti_package",
        "formats/1/verify_config",
        'every release whose manifest has no "format" field (2026-11-29 to 2026-12-01)',
    ),
    2: ReleaseFormat(2, "manifest", "aoti_package", None, 'manifests with "format": 2'),
}


def format_of(manifest: dict, where) -> ReleaseFormat:
    """The format a manifest states (none: format 1); a newer one than this code knows, or a
    value that is no format number, is a :class:`ReleaseFormatError`."""
    if "format" not in manifest:
        return FORMATS[FIRST]
    value = manifest["format"]
    if isinstance(value, bool) or not isinstance(value, int) or value < FIRST:
        raise ReleaseFormatError(
            f'{where}: "format" is {value!r}, which is no release format (an integer, 1 to {CURRENT})',
            hint="the manifest was not written by laya-build: restore manifest.json from the original release",
        )
    if value > CURRENT:
        raise ReleaseFormatError(
            f"{where}: the release is of format {value}, newer than this laya-build reads (formats "
            f"{FIRST} to {CURRENT}): a later laya-build made it"
        )
    return FORMATS[value]


def check_manifest(path, raw) -> ReleaseFormat:
    """A manifest (already read) against the schema of its own format; returns the format."""
    from laya_build.records import check_record
    from laya_build.schema import validate

    if not isinstance(raw, dict) or "stage" not in raw:
        check_record(path, raw)  # raises: not a record at all
    fmt = format_of(raw, path)
    validate(fmt.manifest_schema, raw, what=f"manifest record for {path} ({fmt})")
    return fmt


@dataclass(frozen=True)
class Release:
    """A release folder as verify reads it: its format, manifest and effective configuration."""

    root: Path
    format: ReleaseFormat
    manifest: dict
    config: dict

    @property
    def layout(self) -> VersionLayout:
        return VersionLayout(self.root)

    def variant(self) -> list[str]:
        """What sets this release apart from today's format, found in its content."""
        if self.format.number != FIRST:
            return []
        facts = []
        if set(self.config["verify"]["timing"]) <= set(COUNTS):
            facts.append("timing by counts (warmup/groups/group_size)")
        if "runtime" not in self.config:
            facts.append("no runtime section")
        if self.inputs_format() == 1:
            facts.append("inputs format 1 (raw-softmax probabilities)")
        records = [read_json(self.root / rel, "package record") for rel in self.package_records()]
        if any(isinstance(r, dict) and r.get("status") == "ok" and "preload" not in r for r in records):
            facts.append("package records without preload")
        return facts

    def package_records(self) -> list[str]:
        """The package records the manifest lists (relative paths)."""
        name = record_name("aoti_package")
        return [
            f["path"]
            for f in self.manifest["files"]
            if f["path"].startswith(f"{AOTI_PACKAGE_DIR}/") and f["path"].endswith(f"/{name}")
        ]

    def describe(self) -> str:
        facts = self.variant()
        return f"{self.format}" + (f" ({'; '.join(facts)})" if facts else "")

    def inputs_format(self) -> int | None:
        """The saved inputs' format of a format-1 release: 2 where its model record has the
        checkpoint's calibration, 1 before it (None: today's)."""
        if self.format.number != FIRST:
            return None
        record = read_json(self.layout.model_record, "model record")
        return 2 if isinstance(record, dict) and "calibration" in record else 1

    def package_record(self, target: str, dtype: str) -> dict:
        """A build's package record, checked against its format's schema."""
        from laya_build.schema import validate

        path = self.layout.build_record("aoti_package", target, dtype)
        record = read_json(path, "package record")
        try:
            validate(self.format.package_schema, record, what=f"{path} ({self.format})")
        except RecordError as exc:
            raise ReleaseFormatError(message_of(exc), hint=_NOT_ITS_FORMAT) from None
        return record

    def verify_config(self) -> tuple[dict, dict]:
        """The release's ``verify`` and ``runtime`` sections as today's verify takes them."""
        verify = dict(self.config["verify"])
        if set(verify["timing"]) <= set(COUNTS):  # one protocol for every target
            verify["timing"] = {target: verify["timing"] for target in ("cpu", "cuda")}
        return verify, self.config.get("runtime") or NO_RUNTIME

    def verify_spec(self, target: str, dtype: str) -> dict:
        """:func:`laya_build.stages.verify.run_verify`'s arguments for one build."""
        from laya_build.stages.common import verify_spec

        verify, runtime = self.verify_config()
        return {
            **verify_spec(self.layout, verify, runtime, target, dtype),
            "package_record": self.package_record(target, dtype),
            "inputs_format": self.inputs_format(),
        }


_NOT_ITS_FORMAT = (
    "the release does not hold what its format's writer wrote; verify:manifest checked its files "
    "against its manifest, so the release was made so: docs/reference/release-format.md says what "
    "each format holds"
)


def read_release(release_dir) -> Release:
    """A release folder read by the rules of its format (its files are checked against the
    manifest first, by ``verify:manifest``)."""
    from laya_build.schema import validate

    layout = VersionLayout(Path(release_dir))
    manifest_path = layout.root / MANIFEST_NAME
    manifest = read_json(manifest_path, "manifest")
    if not isinstance(manifest, dict):
        raise ReleaseFormatError(f"{manifest_path}: not a manifest (a JSON object)", hint=_NOT_ITS_FORMAT)
    fmt = format_of(manifest, manifest_path)
    config = read_json(layout.effective_config, "effective configuration")
    try:
        if fmt.config_schema is not None:
            validate(fmt.config_schema, config, what=f"{layout.effective_config} ({fmt})")
        else:
            if missing := [name for name in ("verify", "runtime") if not isinstance(config.get(name), dict)]:
                raise RecordError(f"{layout.effective_config} ({fmt}): no {' and no '.join(missing)} section")
            sections = {name: config[name] for name in ("verify", "runtime")}
            validate("model_sections", sections, what=f"{layout.effective_config} ({fmt})")
    except RecordError as exc:
        raise ReleaseFormatError(message_of(exc), hint=_NOT_ITS_FORMAT) from None
    return Release(layout.root, fmt, manifest, config)
