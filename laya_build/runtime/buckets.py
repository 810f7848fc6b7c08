"""Shape buckets of the runtime: which padded (rows, tokens, slots) shapes get a CUDA graph.

Pure Python (no torch), so that loading ``pipeline.yaml`` can check ``runtime.buckets``
against ``export.dims`` before any task runs, and :mod:`laya_build.runtime` can choose a
bucket per call.  A package accepts rows in ``rows.min..rows.max``, tokens
``16 * tokens16`` in ``16 * tokens16.min..16 * tokens16.max`` and slots in
``slots.min..slots.max`` (``export.dims``; the aoti_package record carries the same
``dims``).  A bucket must be a shape the package accepts; its slots default to the
largest the package accepts (padding slots costs a gather of a few positions).
"""

from __future__ import annotations

from dataclasses import dataclass

from laya_build.errors import ConfigError

TOKEN_MULTIPLE = 16


@dataclass(frozen=True)
class Range:
    lo: int
    hi: int

    def __contains__(self, value: int) -> bool:
        return self.lo <= value <= self.hi

    def __str__(self) -> str:
        return f"{self.lo}..{self.hi}"


@dataclass(frozen=True)
class ExportDims:
    """The shapes a package accepts (``export.dims``, or an aoti_package record's ``dims``)."""

    rows: Range
    tokens: Range
    slots: Range

    @classmethod
    def from_dims(cls, dims: dict) -> ExportDims:
        t16 = dims["tokens16"]
        return cls(
            rows=Range(dims["rows"]["min"], dims["rows"]["max"]),
            tokens=Range(TOKEN_MULTIPLE * t16["min"], TOKEN_MULTIPLE * t16["max"]),
            slots=Range(dims["slots"]["min"], dims["slots"]["max"]),
        )

    def accepts(self, rows: int, tokens: int, slots: int) -> bool:
        return rows in self.rows and tokens in self.tokens and slots in self.slots and tokens % TOKEN_MULTIPLE == 0

    def fitted(self, rows: int, tokens: int, slots: int) -> Bucket:
        """The smallest shape the package accepts that holds a call of this shape (tokens
        rounded up to a multiple of 16 and raised to the minima); the call must not exceed
        the maxima (see :meth:`too_large`)."""
        tokens = -(-tokens // TOKEN_MULTIPLE) * TOKEN_MULTIPLE
        return Bucket(max(rows, self.rows.lo), max(tokens, self.tokens.lo), max(slots, self.slots.lo))

    def too_large(self, rows: int, tokens: int, slots: int) -> list[str]:
        """``dim = value > max`` for every dimension beyond what the package accepts."""
        return [
            f"{name} = {value} > {limit.hi}"
            for name, value, limit in (
                ("rows", rows, self.rows),
                ("tokens", tokens, self.tokens),
                ("slots", slots, self.slots),
            )
            if value > limit.hi
        ]


@dataclass(frozen=True)
class Bucket:
    """A padded call shape.  Ordered by cost: positions (rows x tokens), then tokens, slots."""

    rows: int
    tokens: int
    slots: int

    def holds(self, rows: int, tokens: int, slots: int) -> bool:
        return rows <= self.rows and tokens <= self.tokens and slots <= self.slots

    def cost(self) -> tuple[int, int, int, int]:
        return (self.rows * self.tokens, self.tokens, self.rows, self.slots)

    def as_dict(self) -> dict:
        return {"rows": self.rows, "tokens": self.tokens, "slots": self.slots}

    def __str__(self) -> str:
        return f"{self.rows}x{self.tokens}x{self.slots}"


def parse_buckets(entries, dims: ExportDims | dict, where: str = "runtime.buckets") -> list[Bucket]:
    """``entries`` (``[{rows, tokens, slots?}, ...]``) as buckets, cheapest first.

    Raises :class:`ConfigError` naming the key (``<where>.<i>.<key>``) for a bucket the
    package cannot accept (outside the export ranges, tokens not a multiple of 16) and for
    a repeated bucket.
    """
    dims = dims if isinstance(dims, ExportDims) else ExportDims.from_dims(dims)
    found: dict[Bucket, int] = {}
    for i, entry in enumerate(entries or []):
        bucket = Bucket(int(entry["rows"]), int(entry["tokens"]), int(entry.get("slots") or dims.slots.hi))
        for key, value, limit in (
            ("rows", bucket.rows, dims.rows),
            ("tokens", bucket.tokens, dims.tokens),
            ("slots", bucket.slots, dims.slots),
        ):
            if value not in limit:
                raise ConfigError(
                    f"invalid at {where}.{i}.{key}: {value} is outside the export range {limit} (export.dims)"
                )
        if bucket.tokens % TOKEN_MULTIPLE:
            raise ConfigError(f"invalid at {where}.{i}.tokens: {bucket.tokens} is not a multiple of {TOKEN_MULTIPLE}")
        if bucket in found:
            raise ConfigError(f"invalid at {where}.{i}: bucket {bucket} repeats {where}.{found[bucket]}")
        found[bucket] = i
    return sorted(found, key=Bucket.cost)


def smallest_holding(buckets: list[Bucket], rows: int, tokens: int, slots: int) -> Bucket | None:
    """The cheapest bucket that holds a call of this shape; ``None`` when none does."""
    return min((b for b in buckets if b.holds(rows, tokens, slots)), key=Bucket.cost, default=None)


def check_config(data: dict) -> None:
    """Every ``runtime.buckets.<target>`` of an effective configuration against ``export.dims``."""
    for target, entries in data["runtime"]["buckets"].items():
        parse_buckets(entries, data["export"]["dims"], where=f"runtime.buckets.{target}")
