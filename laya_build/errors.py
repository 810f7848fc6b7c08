"""Exceptions of the model, export, packaging and verification stages.

Every failure kind has its own class so that a caller (a doit task, a test) can tell an
integrity failure from a numerical one without parsing messages; messages still name the
file, batch, row and head involved.
"""
from __future__ import annotations


class LayaBuildError(Exception):
    """Base class of every error raised by laya-build's own code."""


class ConfigError(LayaBuildError, ValueError):
    """A config section is invalid or inconsistent (names the key)."""


class CheckpointError(LayaBuildError):
    """A checkpoint directory is incomplete or does not match the model (names path/keys)."""


class UnsupportedCheckpointError(CheckpointError):
    """A valid upstream checkpoint asks for a computation this build does not implement
    (e.g. ``option_layout: parallel``, a non-ModernBERT encoder); names the key and the
    supported values."""


class RecordError(LayaBuildError, ValueError):
    """A record (or config) does not match its schema."""

class ReleasedVersionError(LayaBuildError):
    """A task would write into a released (immutable) version."""

class ManifestMismatch(LayaBuildError):
    """Release files do not match the manifest; the message names every offending file."""

    def __init__(self, version_dir, problems: list[str]):
        self.problems = problems
        super().__init__(f"{version_dir}: {len(problems)} file(s) do not match manifest.json: " + "; ".join(problems))

class OutputsTampered(LayaBuildError):
    """An output was changed after the task that owns it wrote it."""

class NumericalCheckFailed(LayaBuildError, AssertionError):
    """A CPU kernel disagrees with its reference."""

class CudaSourceMismatch(LayaBuildError):
    """Generated CUDA source differs from the baseline while ``expect: identical``."""

class GitRefError(LayaBuildError, ValueError):
    """The baseline git revision cannot be resolved or holds no kernels/."""

class StageError(LayaBuildError):
    """A stage could not do its work on a supported install (e.g. compilation failed)."""


class StageFailed(StageError):
    """A stage (or a stage's child) failed in its own process; the message is its error."""


class ChildCrashError(StageError):
    """A stage's child process died by a signal (e.g. SIGSEGV while loading a package).

    A crash is always a failure, never a pass or a skip.  ``signal`` holds the signal name.
    """

    def __init__(self, message: str, signal: str | None = None):
        super().__init__(message)
        self.signal = signal


class VerificationError(LayaBuildError):
    """The packaged model failed fresh-process verification."""


class PackageIntegrityError(VerificationError):
    """The package on disk is not the one its record describes (checked before loading)."""


class InputsMismatchError(VerificationError):
    """Saved inputs / eager outputs do not belong together (dtype, target, shapes, hashes)."""


class ParityError(VerificationError):
    """The package's outputs differ from the eager reference beyond a threshold."""


class LogitParityError(ParityError):
    """A head's logits differ by more than ``logit_atol``."""


class ProbabilityParityError(ParityError):
    """A head's softmax probabilities differ by more than ``prob_atol``."""


class ArgmaxMismatchError(ParityError):
    """A head's argmax differs from the eager reference on some row."""


class VerifyChildCrashError(ChildCrashError, VerificationError):
    """The fresh verification process died by a signal."""


class PackageIsaError(VerificationError):
    """The package was built for CPU vector instructions this CPU lacks (checked before loading)."""


class GraphReplayMismatchError(VerificationError):
    """A CUDA graph replay of the package differs from the plain call on the same padded inputs."""


class RuntimeInputError(LayaBuildError, ValueError):
    """A call's tensors do not fit the package (names the tensor, the dimension and the range)."""
