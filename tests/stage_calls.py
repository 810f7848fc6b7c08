"""The stage functions called as a build calls them, for tests that run one stage alone.

A build merges each model section over its defaults once, when the configuration is loaded,
and its runner writes the record a stage returns (``<out_dir>/<stage>.json``).  These take a
partial section as a test writes it, merge it the same way, run the stage in this process
and write its record as the runner does.
"""

from __future__ import annotations

from pathlib import Path

from laya_build.config.sections import section
from laya_build.layout import record_name
from laya_build.records import write_record
from laya_build.stages import export, latency, model, package, verify


def _recorded(record: dict, out_dir) -> dict:
    write_record(Path(out_dir) / record_name(record["stage"]), record)
    return record


def run_model(model_cfg: dict, out_dir) -> dict:
    return _recorded(model.run_model(section("model", model_cfg), out_dir), out_dir)


def run_export(export_cfg: dict, checkpoint_dir, inputs_path, out_dir, target: str, dtype: str) -> dict:
    record = export.run_export(section("export", export_cfg), checkpoint_dir, inputs_path, out_dir, target, dtype)
    return _recorded(record, out_dir)


def run_package(package_cfg: dict, export_dir, out_dir, target: str, root=".") -> dict:
    record = package.run_package(section("package", package_cfg), export_dir, out_dir, target, root=root)
    return _recorded(record, out_dir)


def run_verify(
    verify_cfg: dict, package_record_path, inputs_path, eager_path, out_dir, runtime_cfg: dict | None = None
) -> dict:
    record = verify.run_verify(
        section("verify", verify_cfg),
        section("runtime", runtime_cfg),
        package_record_path,
        inputs_path,
        eager_path,
        out_dir,
    )
    return _recorded(record, out_dir)


def run_latency(
    latency_cfg: dict,
    checkpoint_dir,
    inputs_path,
    package_record_paths,
    out_dir,
    target: str,
    runtime_cfg: dict | None = None,
) -> dict:
    record = latency.run_latency(
        section("latency", latency_cfg),
        section("runtime", runtime_cfg),
        checkpoint_dir,
        inputs_path,
        package_record_paths,
        out_dir,
        target,
    )
    return _recorded(record, out_dir)
