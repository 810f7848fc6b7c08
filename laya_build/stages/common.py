"""What the model stages share: skip records, reading upstream records, checking a file's
digest before it is used."""

from __future__ import annotations

from laya_build.errors import ConfigError, PackageIntegrityError
from laya_build.records import read_record, sha256_file


def skip(stage: str, reason: str, **fields) -> dict:
    """An explicit skip record (never a silent pass)."""
    return {"stage": stage, "status": "skipped", "reason": reason, **fields}


def skip_if_blocked(stage: str, up: dict, target: str, *, aoti: bool = False) -> dict | None:
    """The skip record of ``stage`` when its upstream record ``up`` was skipped or ``target``
    cannot run here (:func:`laya_build.environment.unsupported_reason`); ``None`` when the
    stage can run."""
    from laya_build.environment import unsupported_reason

    if up["status"] == "skipped":
        reason = f"{up['stage']} skipped: {up['reason']}"
    elif not (reason := unsupported_reason(target, aoti=aoti)):
        return None
    return skip(stage, reason, target=target, **({"dtype": up["dtype"]} if "dtype" in up else {}))


def check_sha256(path, expected: str, record: str, consequence: str = "") -> str:
    """``path``'s sha256, which must be ``expected`` (from ``record``) before anything uses it."""
    actual = sha256_file(path)
    if actual != expected:
        raise PackageIntegrityError(f"{path}: sha256 {actual} does not match the {record}'s {expected}{consequence}")
    return actual


def upstream(path, stage: str) -> dict:
    """Read and validate an upstream record, checking it is the expected stage's."""
    record = read_record(path)
    if record["stage"] != stage:
        raise ConfigError(f"{path}: expected a {stage} record, got stage {record['stage']!r}")
    return record


def verify_spec(layout, cfg: dict, runtime_cfg: dict, target: str, dtype: str) -> dict:
    """run_verify's arguments for one build of a version folder (``layout``)."""
    return {
        "verify_cfg": cfg,
        "runtime_cfg": runtime_cfg,
        "package_record_path": str(layout.build_record("aoti_package", target, dtype)),
        "inputs_path": str(layout.inputs),
        "eager_path": str(layout.eager(target, dtype)),
    }
