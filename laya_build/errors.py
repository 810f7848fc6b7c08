"""Every expected failure of laya-build: what went wrong, and what to do about it.

A leaf module (it imports nothing of laya-build), like pip's ``exceptions.py``.  Each class
says in its docstring what it means and in ``hint`` what usually fixes it; an instance may
carry a sharper hint (``hint=``, naming the command or the key).  ``str(error)`` is the
message followed by a ``hint:`` line and the error's section of ``docs/reference/errors.md``
(generated from this module by ``python -m laya_build.errors``; a test keeps it current).

``exit_code`` is what ``doit`` exits with when the error ends a run: 3 for a configuration or
command-line error (:class:`UserError`: nothing was built, the command must change), 1 for a
failed task.  A caller (a doit task, a test) tells an integrity failure from a numerical one
by its class, never by parsing messages.
"""

from __future__ import annotations

import os
import re
import sys

DOCS = "docs/reference/errors.md"
USER_ERROR_EXIT = 3  # doit's own exit status for "the user asked for something wrong"
TASK_FAILED_EXIT = 1


class LayaBuildError(Exception):
    """Base class of every error raised by laya-build's own code."""

    exit_code = TASK_FAILED_EXIT
    hint: str | None = None

    def __init__(self, message: str = "", *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        if hint is not None:
            self.hint = hint

    @classmethod
    def reference(cls) -> str:
        """The anchor of this class in ``docs/reference/errors.md`` (``ConfigError`` -> ``config-error``)."""
        return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", cls.__name__).lower()

    def __str__(self) -> str:
        text = self.message
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return f"{text}\n  see: {DOCS}#{self.reference()}"


class UserError(LayaBuildError):
    """The command or the configuration asks for something that cannot be done; nothing was built."""

    exit_code = USER_ERROR_EXIT


class ConfigError(UserError, ValueError):
    """A configuration file (``pipeline.yaml`` or ``config=``) or a section of it is invalid or
    inconsistent; the message names the file and the key path."""

    hint = (
        "fix the key named above (docs/reference/configuration.md lists every key, its type and "
        "default), then run the command again"
    )


class UsageError(UserError, ValueError):
    """A ``doit`` argument is wrong: an unknown or repeated variable, a missing or malformed task
    parameter, a version that does not exist."""

    hint = (
        "`doit list` shows the tasks, `doit help <task>` a task's parameters; the variables are "
        "version=<v>, config=<file> and release=<folder>, each given once"
    )


class GitRefError(ConfigError):
    """``cuda.baseline.git_ref`` does not name a commit of the repository, or that commit has no ``kernels/``."""

    hint = "name a commit that has kernels/ (`git log --oneline -- kernels` lists them), or a built version"


class ReleasedVersionError(UserError):
    """A task would write into a released (immutable) version, or into a damaged release."""

    hint = "a released version is never modified: build a new one, e.g. `doit version=<new> release`"


class BuildBusyError(LayaBuildError):
    """Another ``doit`` run in this checkout builds (or verifies) the same version, and this run
    was asked not to wait for it (``wait=no``); the message names that run."""

    hint = "wait for that run to end (run again without wait=no, which waits), or build another version"


class DiskFullError(LayaBuildError):
    """A write failed for lack of space or quota (ENOSPC, EDQUOT); the message names the file and
    the filesystem's free space.  The partial file was removed."""

    hint = "free space on that filesystem (or give artifacts/ a larger one), then run the same command again"
    surfaces = True  # said as itself from whichever process hit it (the machine's, not the stage's)


class CheckpointError(LayaBuildError):
    """A checkpoint folder is incomplete or does not match the model (names the path and the keys)."""

    hint = (
        "model.path must name a checkpoint folder in upstream Laya 0.4.15's format "
        "(docs/guides/upstream-checkpoints.md)"
    )


class UnsupportedCheckpointError(CheckpointError):
    """A valid upstream checkpoint asks for a computation this build does not implement
    (e.g. ``option_layout: parallel``, a non-ModernBERT encoder); names the key and the
    supported values."""

    hint = "re-export the checkpoint with one of the supported values named above"


class RecordError(LayaBuildError, ValueError):
    """A record does not match its schema, is missing or is not JSON."""

    hint = (
        "a record is only ever written by its task: rebuild it with `doit clean <task>` and `doit <task>` "
        "(the message names the file)"
    )


class ReleaseFormatError(LayaBuildError):
    """A release is not of a format this laya-build reads: its ``manifest.json`` states a newer
    format (a later laya-build made it) or no format number at all, or a file of the release does
    not hold what its format's writer wrote (``docs/reference/release-format.md``)."""

    hint = (
        "a release states its format in manifest.json (none: format 1); a format newer than this "
        "laya-build's is read by a later laya-build: upgrade laya-build (`git pull`, then "
        "`.venv/bin/pip install -r requirements.txt`) and run `doit verify release=<folder>` again"
    )


class ManifestMismatch(LayaBuildError):
    """A release's files do not match its ``manifest.json``; the message names every offending file."""

    hint = (
        "the release was changed after it was made: restore the folder from the original release "
        "(a release is never rebuilt in place), or build a new version"
    )

    def __init__(self, version_dir, problems: list[str], *, hint: str | None = None):
        self.problems = problems
        super().__init__(
            f"{version_dir}: {len(problems)} file(s) do not match manifest.json: " + "; ".join(problems), hint=hint
        )


class SigningKeyError(UserError):
    """The key ``doit release`` signs with (``signing.key`` or ``LAYA_BUILD_SIGNING_KEY``), or a
    public key verify trusts (``trust.keys`` or ``LAYA_BUILD_TRUSTED_KEYS``), cannot be used."""

    hint = (
        "make a key pair with `python -m laya_build.release.keys new <name>` (an elliptic-curve P-256 "
        "key in PEM), name the private key in signing.key and its .pub in trust.keys (docs/guides/releasing.md)"
    )


class SignatureError(LayaBuildError):
    """A release's signature does not prove it: the release is refused before anything of it is
    loaded.  The message names what failed."""

    hint = (
        "use the release as its signer published it (copy it again from the original), or, if the signer "
        "is right, add their public key to trust.keys; never re-sign a release you did not build"
    )


class UnsignedReleaseError(SignatureError):
    """A release without a signature, verified where signatures are required (``trust.keys`` is set)."""


class UnknownSignerError(SignatureError):
    """A release signed by a key that is not among the trusted public keys."""


class SignatureMismatchError(SignatureError):
    """A signature that does not verify, or whose signed digests are not those of the release's
    files (a file changed after signing, even with the manifest re-hashed)."""


class OutputsTampered(LayaBuildError):
    """An output was changed after the task that owns it wrote it; nothing builds on altered outputs."""

    hint = "`doit clean <task>` removes the task's outputs; the next run rebuilds them"


class NumericalCheckFailed(LayaBuildError, AssertionError):
    """A kernel's fp32 C lowering disagrees with its torch reference beyond ``cpu_checks.atol``."""

    hint = (
        "fix the kernel; if the tolerance is what is wrong, set cpu_checks.atol_overrides.<variant> "
        "(lower_c/<variant>.json has every shape's error)"
    )


class CudaSourceMismatch(LayaBuildError):
    """Generated CUDA source differs from the baseline while ``cuda.expect: identical``."""

    hint = (
        "review the diffs under artifacts/<version>/cuda_diff/diffs/; if the change is intended, "
        "set cuda.expect: report or move cuda.baseline to the new sources"
    )


class StageError(LayaBuildError):
    """A stage could not do its work on a supported install (a compile failed, a process ran
    past its timeout)."""

    hint = "the stage's log (named above) has the compiler's or the process's own output"


class StageFailed(StageError):
    """A stage (or a stage's child process) failed in its own process; the message is its error."""


class ChildCrashError(StageError):
    """A stage's child process died by a signal (e.g. SIGSEGV while loading a package).

    A crash is always a failure, never a pass or a skip.  ``signal`` holds the signal name.
    """

    hint = (
        "a native crash: the log named above ends with its stack; on a GPU image see the preload "
        "settings (docs/guides/gpu-builds.md)"
    )

    def __init__(self, message: str, signal: str | None = None, *, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.signal = signal


class RemoteStageError(StageError):
    """A stage sent to the Ray cluster (``executor: ray``) did not come back: no worker with
    its resource answered in time, the remote run failed, or its outputs did not reach the cache."""

    hint = (
        "check that a worker offers the resource named above (`ray status`), that it reaches the cache, "
        "and its log (`ray logs`); docs/guides/cache-and-cluster.md"
    )


class RemoteMismatchError(StageError):
    """A Ray worker refused a stage: its checkout is at another commit, or its code, toolchain or
    inputs would give the stage another cache key than the build's (the message names what)."""

    hint = (
        "give every worker a checkout at the build's commit with the same requirements.txt installed, "
        "named by LAYA_BUILD_WORKER_ROOT (docs/guides/cache-and-cluster.md)"
    )


class VerificationError(LayaBuildError):
    """The packaged model failed fresh-process verification."""

    hint = "verify.json and verify_child.log of the build say what the package did"


class PackageIntegrityError(VerificationError):
    """A file is not the bytes its record or manifest names (checked before anything loads it)."""

    hint = (
        "in a build, rebuild the package (`doit clean aoti_package` then `doit aoti_package`); "
        "a release: restore it from the original"
    )


class InputsMismatchError(VerificationError):
    """Saved inputs and eager outputs do not belong to the package (dtype, target, shapes, hashes)."""

    hint = "rebuild the export and the package of this build (`doit clean export aoti_package`, then `doit verify`)"


class ParityError(VerificationError):
    """The package's outputs differ from the eager reference beyond a threshold."""

    hint = (
        "the package computes something else than eager: check package.inductor_configs and the dtype; "
        "if the tolerance is what is wrong, raise verify.thresholds.<target>.<dtype>"
    )


class LogitParityError(ParityError):
    """A head's logits differ from eager by more than ``logit_atol``."""


class ProbabilityParityError(ParityError):
    """A head's calibrated probabilities differ from eager by more than ``prob_atol``."""


class ArgmaxMismatchError(ParityError):
    """A head's argmax differs from eager on some row (and the eager logits do not tie)."""


class VerifyChildCrashError(ChildCrashError, VerificationError):
    """The fresh verification process died by a signal: a failure, never a pass."""


class NativeLibraryError(VerificationError):
    """A package calls the project's native ops (``laya_native``) and the process cannot have
    the library its record names: none was given to the load, or another build of the library
    is already loaded (a process holds one kernel per op)."""

    hint = (
        "open the package through its record (open_build, open_release, or load_package with library= its "
        "record's native_library); serve packages whose records name different native_library bytes in "
        "processes of their own"
    )


class PackageIsaError(VerificationError):
    """The package was built for CPU vector instructions this CPU lacks (checked before loading)."""

    hint = "verify and serve it on a CPU with the instructions named above, or build the package on this machine"


class GraphReplayMismatchError(VerificationError):
    """A CUDA graph replay of the package differs from the plain call on the same padded inputs."""

    hint = "serve without graphs meanwhile (runtime.buckets.<target>: []) and report verify.json"


class RuntimeInputError(LayaBuildError, ValueError):
    """A call's tensors do not fit the package (names the tensor, the dimension and the range)."""

    hint = "split or pad the call so that every dimension lies in the package's export.dims"


def message_of(exc: BaseException) -> str:
    """An error's own message, without the hint and reference lines ``str()`` adds (to wrap it
    in another message)."""
    return exc.message if isinstance(exc, LayaBuildError) else str(exc)


def all_errors() -> list[type[LayaBuildError]]:
    """Every error class of laya-build, in the order of this module."""
    module = sys.modules[__name__]
    return [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, LayaBuildError)]


def render_reference() -> str:
    """``docs/reference/errors.md``: each error, what it means, what to do, how doit exits."""
    lines = [
        "# Errors",
        "",
        "Generated from `laya_build/errors.py` by `.venv/bin/python -m laya_build.errors`; do not edit.",
        "",
        "laya-build prints an expected failure as its message, a `hint:` line with what usually fixes it "
        "and a link to its section here.  `doit` exits with 3 for a configuration or command-line error "
        "(nothing was built; change the command or the configuration) and with 1 for a failed task.",
        "",
        "| error | exit status | is a kind of |",
        "|---|---|---|",
    ]
    for cls in all_errors():
        parent = next((b.__name__ for b in cls.__bases__ if issubclass(b, LayaBuildError)), "")
        lines.append(f"| [`{cls.__name__}`](#{cls.reference()}) | {cls.exit_code} | {parent} |")
    for cls in all_errors():
        doc = " ".join((cls.__doc__ or "").split())
        lines += ["", f"## {cls.__name__}", "", doc, ""]
        if cls.hint:
            lines.append(f"What to do: {cls.hint}.")
            lines.append("")
        lines.append(f"Exit status of `doit`: {cls.exit_code}.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from pathlib import Path

    args = sys.argv[1:] if argv is None else argv
    target = Path(__file__).resolve().parent.parent / DOCS
    text = render_reference()
    if args == ["--check"]:
        if not target.is_file() or target.read_text() != text:
            print(f"{DOCS} is out of date: run `.venv/bin/python -m laya_build.errors`", file=sys.stderr)
            return 1
        return 0
    tmp = target.with_name(f".{target.name}.tmp")  # a leaf: no laya_build.atomic here
    tmp.write_text(text)
    os.replace(tmp, target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
