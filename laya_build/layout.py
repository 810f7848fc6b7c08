"""Where every artifact lives: the one place that names folders and files under ``artifacts/``.

Naming convention (as in PyTorch's ``pt2_archive/constants.py``): ``*_DIR`` a folder name,
``*_NAME`` a file name; :class:`VersionLayout` turns them into the paths of one version.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ARTIFACTS_DIR = "artifacts"
CACHE_DIR = ".cache"  # compiler caches and extracted baselines: never part of a version
DOIT_DB_DIR = ".doit"  # doit's task state, one sqlite3 database per version
DIGESTS_NAME = "digests.sqlite3"  # the files' sha256 while unchanged (laya_build.filedigests), in DOIT_DB_DIR
VERIFICATIONS_DIR = "verifications"  # results of `doit verify` on a released version
RELEASE_DIFF_DIR = "release_diff"

TIR_DIR, PROBE_C_DIR, LOWER_C_DIR, CUDA_DIR, CUDA_DIFF_DIR = "tir", "probe_c", "lower_c", "cuda", "cuda_diff"
MODEL_DIR, CHECKPOINT_DIR, INPUTS_NAME, MODEL_RECORD_NAME = "model", "checkpoint", "inputs.pt", "model.json"
MANIFEST_NAME, REPORT_NAME, EFFECTIVE_CONFIG_NAME = "manifest.json", "REPORT.md", "pipeline.effective.json"
# Files a release adds to a version folder besides the manifest (a folder with them but no
# manifest is a damaged release, not a build in progress).
RELEASE_FILES = (REPORT_NAME, EFFECTIVE_CONFIG_NAME)
# What a release (format 2) publishes around its manifest: the in-toto provenance statement
# (listed in the manifest), ``SHA256SUMS`` (every file but itself and the signature, the
# manifest included: ``sha256sum -c`` without laya-build) and the signature (a Sigstore bundle
# over every other file of the folder).
PROVENANCE_NAME, SUMS_NAME, SIGNATURE_NAME = "provenance.json", "SHA256SUMS", "release.sig"
SBOM_NAME = "sbom.cdx.json"  # the CycloneDX bill of materials of the build's toolchain (listed)
# Written by a publication, removed again when one is interrupted (the manifest too).
PUBLISHED_FILES = (*RELEASE_FILES, PROVENANCE_NAME, SBOM_NAME, SUMS_NAME, SIGNATURE_NAME)
# Stages of the model builds: one folder per (target, dtype), record ``<stage>.json``.
BUILD_STAGES = ("export", "aoti_package", "verify")
AOTI_PACKAGE_DIR = "aoti_package"
# Model stages over every build of a target at once: one folder per target (``latency``
# measures the dtype-independent variants once and then each package of the target).
TARGET_STAGES = ("latency",)
# Files of the export and package stages (one program of the decision model: ``decision``, or
# ``decision_single_slot``, whose names end in ``_single_slot``).
EXPORTED_NAME, EAGER_NAME = "exported{suffix}.pt2", "eager{suffix}.pt"
LATENCY_TABLE_NAME = "latency.md"
# The project's native op library (laya_build/native): built into an export's folder, copied
# beside the package that calls its ops; the compiler's output of that build beside it.
NATIVE_LIBRARY_NAME, NATIVE_BUILD_LOG_NAME = "liblaya_native.so", "native_build.log"
RELEASE_DIFF_RECORD_NAME, RELEASE_DIFF_REPORT_NAME = "release_diff.json", "release_diff.md"
DIFFS_DIR, DIFF_SUFFIX = "diffs", ".diff"
DEPS_CACHE_NAME = "deps-parse.json"  # parsed imports of the project's sources, by their sha256
# An atomic write's temporary file beside its target (laya_build.atomic); a file a stage writes
# whole before renaming it (e.g. a package being compiled) has ``.partial.`` in its name.
TMP_GLOB = ".{name}.*.tmp"
PARTIAL_MARK = ".partial."


def record_name(stage: str) -> str:
    """The file name of a stage's record: ``<stage>.json``."""
    return f"{stage}.json"


def exported_name(suffix: str = "") -> str:
    return EXPORTED_NAME.format(suffix=suffix)


def eager_name(suffix: str = "") -> str:
    return EAGER_NAME.format(suffix=suffix)


def package_name(program: str) -> str:
    """The ``.pt2`` of a program: ``decision.pt2``."""
    return f"{program}.pt2"


def child_log_name(stage: str) -> str:
    """The log of a model stage's child process: ``package_child.log``."""
    return f"{stage}_child.log"


def diff_name(name: str) -> str:
    """The unified diff of a source ``name`` (``cuda/rope/bfloat16-sm_90.cu.diff``)."""
    return name + DIFF_SUFFIX


def package_record_path(build: str) -> str:
    """A build's package record, relative to its version folder."""
    return f"{AOTI_PACKAGE_DIR}/{build}/{record_name('aoti_package')}"


def tir_flavour(dtype: str, cpu: bool) -> str:
    """How a TIR specialisation is named in task names, reports and release diffs."""
    return f"cpu-{dtype}" if cpu else dtype


def build_name(target: str, dtype: str | None = None) -> str:
    """A model-stage folder and sub-task name: ``<target>-<dtype>`` for a build stage,
    ``<target>`` for a per-target stage (``dtype`` None)."""
    return target if dtype is None else f"{target}-{dtype}"


def cuda_name(variant: str, dtype: str, arch: str) -> str:
    """The relative name of a generated CUDA source (under ``cuda/``)."""
    return f"{variant}/{dtype}-{arch}.cu"


@dataclass(frozen=True)
class ArtifactsLayout:
    root: Path  # the artifacts folder

    def version(self, version: str) -> VersionLayout:
        return VersionLayout(self.root / version)

    def cache(self, *parts: str) -> Path:
        return self.root.joinpath(CACHE_DIR, *parts)

    def baseline_kernels(self, tree: str) -> Path:
        """``kernels/`` of a git tree, extracted for ``cuda_diff``'s baseline (shared by every version)."""
        return self.cache("baseline-kernels", tree)

    def run_lock(self, version: str) -> Path:
        """Held by the ``doit`` run that builds or verifies ``version`` in this checkout."""
        return self.root / DOIT_DB_DIR / f"{version}.lock"

    def doit_db(self, version: str) -> Path:
        return self.root / DOIT_DB_DIR / f"{version}.sqlite3"

    def digests_db(self) -> Path:
        """The checkout's remembered file digests (:mod:`laya_build.filedigests`)."""
        return self.root / DOIT_DB_DIR / DIGESTS_NAME

    def outputs_records(self, version: str) -> Path:
        """The digests of ``version``'s tasks' outputs (:meth:`outputs_record`)."""
        return self.root / DOIT_DB_DIR / "outputs" / version

    def outputs_record(self, version: str, task: str) -> Path:
        """The digest of a task's outputs after its last complete run (outside the version)."""
        return self.outputs_records(version) / f"{task}.json"

    def cache_report(self, version: str) -> Path:
        """What the last ``doit`` run of ``version`` did with the cache: one JSON line per task."""
        return self.root / DOIT_DB_DIR / "cache" / f"{version}.jsonl"

    def cache_fetch_dir(self) -> Path:
        """Where fetched blobs are checked before they are moved into place (beside the versions,
        on their filesystem)."""
        return self.cache("fetch")

    def verifications(self, version: str) -> Path:
        return self.root / VERIFICATIONS_DIR / version

    def written_by_run(self, version: str) -> list[Path]:
        """The folders only a ``doit`` run of ``version`` writes into (it holds the version's lock):
        the version, its verifications and its outputs' records."""
        return [self.version(version).root, self.verifications(version), self.outputs_records(version)]

    def verification(self, version: str, build: str) -> Path:
        """Where ``doit verify`` of a released version puts a build's results."""
        return self.verifications(version) / build

    def release_diff(self, old: str, new: str) -> Path:
        return self.root / RELEASE_DIFF_DIR / f"{old}..{new}"


@dataclass(frozen=True)
class VersionLayout:
    root: Path  # artifacts/<version>

    def rel(self, path: Path) -> str:
        return Path(path).relative_to(self.root).as_posix()

    # kernel stages
    def tir_script(self, variant: str, flavour: str) -> Path:
        return self.root / TIR_DIR / variant / f"{flavour}.tir.py"

    def tir_record(self, variant: str, flavour: str) -> Path:
        return self.root / TIR_DIR / variant / f"{flavour}.json"

    def probe_record(self, variant: str, flavour: str) -> Path:
        return self.root / PROBE_C_DIR / variant / f"{flavour}.json"

    def lower_c_source(self, variant: str) -> Path:
        return self.root / LOWER_C_DIR / f"{variant}.c"

    def lower_c_record(self, variant: str) -> Path:
        return self.lower_c_source(variant).with_suffix(".json")

    def cuda_source(self, name: str) -> Path:
        return self.root / CUDA_DIR / name

    def cuda_record(self, name: str) -> Path:
        return self.cuda_source(name).with_suffix(".json")

    @property
    def cuda_diff_dir(self) -> Path:
        return self.root / CUDA_DIFF_DIR

    @property
    def cuda_diff_record(self) -> Path:
        return self.cuda_diff_dir / record_name("cuda_diff")

    @property
    def cuda_diffs_dir(self) -> Path:
        """One ``<name>.diff`` per differing source."""
        return self.cuda_diff_dir / "diffs"

    def cuda_baseline(self, name: str) -> Path:
        return self.cuda_diff_dir / "baseline" / name

    def cuda_baseline_record(self, name: str) -> Path:
        return self.cuda_baseline(name).with_suffix(".json")

    # model stages
    @property
    def model_dir(self) -> Path:
        return self.root / MODEL_DIR

    @property
    def checkpoint_dir(self) -> Path:
        return self.model_dir / CHECKPOINT_DIR

    @property
    def inputs(self) -> Path:
        return self.model_dir / INPUTS_NAME

    @property
    def model_record(self) -> Path:
        return self.model_dir / MODEL_RECORD_NAME

    def build_dir(self, stage: str, target: str, dtype: str | None = None) -> Path:
        """``<stage>/<target>-<dtype>`` of a build stage, ``<stage>/<target>`` of a per-target
        stage (no ``dtype``)."""
        if stage in TARGET_STAGES:
            if dtype is not None:
                raise ValueError(f"stage {stage} has one folder per target, not per dtype (got dtype {dtype!r})")
        elif stage not in BUILD_STAGES:
            raise ValueError(f"{stage!r} is not a model stage ({', '.join(BUILD_STAGES + TARGET_STAGES)})")
        elif dtype is None:
            raise ValueError(f"stage {stage} has one folder per (target, dtype): a dtype is needed")
        return self.root / stage / build_name(target, dtype)

    def build_record(self, stage: str, target: str, dtype: str | None = None) -> Path:
        return self.build_dir(stage, target, dtype) / record_name(stage)

    def eager(self, target: str, dtype: str) -> Path:
        return self.build_dir("export", target, dtype) / eager_name()

    # releases
    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST_NAME

    @property
    def report(self) -> Path:
        return self.root / REPORT_NAME

    @property
    def effective_config(self) -> Path:
        return self.root / EFFECTIVE_CONFIG_NAME


def partial_files(folder: Path) -> list[Path]:
    """Every file under ``folder`` that a write left unfinished: an atomic write's temporary file
    (:data:`TMP_GLOB`) or a ``.partial.`` file."""
    if not Path(folder).is_dir():
        return []
    return sorted(
        path
        for path in Path(folder).rglob(".*")
        if path.is_file() and (path.name.endswith(".tmp") or PARTIAL_MARK in path.name)
    )


def tmp_leftovers(path: Path) -> list[Path]:
    """Temporary files an interrupted atomic write of ``path`` may have left beside it."""
    return sorted(path.parent.glob(TMP_GLOB.format(name=path.name))) if path.parent.is_dir() else []
