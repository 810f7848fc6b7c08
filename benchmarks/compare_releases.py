"""Compare two release (or build) folders file by file: which files are byte-identical and, for
the JSON records that are not, which keys differ (timings left out with ``--ignore-timings``).

    .venv/bin/python benchmarks/compare_releases.py artifacts/0.1.0 /elsewhere/artifacts/0.1.0 --ignore-timings

Exit status 0 when every file is identical or differs only in the keys ignored.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

# keys whose values are measurements of the run, not of what was built
TIMING = re.compile(r"(^|\.)(\w+_s|\w+_ms|elapsed_s|pid|created|median_ms|iqr_ms|blocks_ms|runs|block_size)$")


def leaves(obj, prefix: str = ""):
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from leaves(value, f"{prefix}.{key}" if prefix else key)
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from leaves(value, f"{prefix}[{i}]")
    else:
        yield prefix, obj


def compare(a: Path, b: Path, ignore_timings: bool) -> tuple[dict, dict]:
    files_a = {p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file()}
    files_b = {p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file()}
    summary = {
        "only_first": sorted(files_a - files_b),
        "only_second": sorted(files_b - files_a),
        "identical": 0,
        "differing": [],
    }
    keys: dict[str, collections.Counter] = {}
    for rel in sorted(files_a & files_b):
        x, y = (a / rel).read_bytes(), (b / rel).read_bytes()
        if x == y:
            summary["identical"] += 1
            continue
        summary["differing"].append(rel)
        if rel.endswith(".json"):
            left, right = dict(leaves(json.loads(x))), dict(leaves(json.loads(y)))
            changed = collections.Counter(
                re.sub(r"\[\d+\]", "[]", k) for k in set(left) | set(right) if left.get(k) != right.get(k)
            )
            if ignore_timings:
                changed = collections.Counter({k: n for k, n in changed.items() if not TIMING.search(k)})
            keys[rel] = changed
    return summary, keys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--ignore-timings", action="store_true")
    args = parser.parse_args(argv)
    summary, keys = compare(args.first, args.second, args.ignore_timings)
    print(
        f"identical: {summary['identical']}; differing: {len(summary['differing'])}; "
        f"only in the first: {summary['only_first']}; only in the second: {summary['only_second']}"
    )
    other = []
    for rel in summary["differing"]:
        if rel in keys:
            if keys[rel]:
                print(f"  {rel}: " + ", ".join(f"{k} ({n})" for k, n in sorted(keys[rel].items())))
        else:
            other.append(rel)
    if other:
        print("  not JSON (compare by hand): " + ", ".join(other))
    return 0 if not summary["only_first"] and not summary["only_second"] and not other and not any(keys.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
