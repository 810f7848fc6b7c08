"""The model half of REPORT.md and of release_diff: packages, parity and latency tables."""

from __future__ import annotations

from laya_build.release.markdown import table
from laya_build.runtime.gpu_state import describe, limits


def _key(record: dict) -> str:
    return f"{record.get('target')}-{record.get('dtype', '?')}"


def _by_key(records) -> dict[str, dict]:
    return {_key(r): r for _, r in records}


def variant_label(variant: dict, record_dtype: str | None = None) -> str:
    """A latency variant as tables name it: a package variant with its package's dtype
    (``package (float32)``); in a record made per (target, dtype) build, before latency was
    measured per target, every variant with that build's dtype (``record_dtype``)."""
    dtype = variant.get("dtype") or record_dtype
    return f"{variant['name']} ({dtype})" if dtype else variant["name"]


def _latency_by_target(records) -> dict[str, list[dict]]:
    """target -> its latency records: one, or one per (target, dtype) build in a release made
    before latency was measured per target (those have a top-level ``dtype``)."""
    out: dict[str, list[dict]] = {}
    for _, r in sorted(records, key=lambda item: (item[1].get("target", "?"), item[1].get("dtype", ""))):
        out.setdefault(r.get("target", "?"), []).append(r)
    return out


def gpu_sentence(record: dict) -> str | None:
    """:func:`laya_build.runtime.gpu_state.describe` of every figure of a latency record (None:
    none has the GPU's state)."""
    return describe([b["latency"].get("gpu") for v in record["variants"] for b in v["batches"]])


def _latency_sections(records) -> list[str]:
    out = []
    for target, recs in _latency_by_target(records).items():
        for r in recs:
            name = target if "dtype" not in r else f"{target}-{r['dtype']}"
            if r["status"] == "skipped":
                out += [f"## Latency {name}\n", f"skipped: {r['reason']}\n"]
                continue
            labels = [variant_label(v, r.get("dtype")) for v in r["variants"]]
            rows = []
            for i, b in enumerate(r["variants"][0]["batches"]):
                sh = b["shape"]
                rows.append(
                    [
                        b["batch"],
                        f"{sh['rows']}×{sh['tokens']}×{sh['slots']}",
                        *[v["batches"][i]["latency"]["median_ms"] for v in r["variants"]],
                    ]
                )
            out += [
                f"## Latency {name} (median ms per call; {_timing(r['timing'])})\n",
                table(["batch", "rows×tokens×slots", *labels], rows),
            ]
            runs = [n for v in r["variants"] for b in v["batches"] if (n := _runs(b["latency"])) is not None]
            notes = [f"Each figure rests on {min(runs)} to {max(runs)} timed calls."] if runs else []
            notes += [f"Not measured: the {p['dtype']} package ({p['reason']})." for p in r.get("skipped_packages", [])]
            gpu = gpu_sentence(r)
            notes += [gpu] if gpu else []
            for v, label in zip(r["variants"], labels):
                if "runner" in v:
                    used = ", ".join(f"batch {b['batch']}: {_bucket(b.get('bucket'))}" for b in v["batches"])
                    n = v["runner"]
                    buckets = ", ".join(_bucket(b) for b in n["buckets"]) or "none"
                    notes.append(
                        f"{label}: {n['mode']}, buckets {buckets} ({used}); set-up {v['setup_s']:.3g} s, "
                        f"of which graph capture {n['capture_s']:.3g} s."
                    )
            out += [" ".join(notes) + "\n"]
    return out


def sections(recs: dict) -> list[str]:
    out = []
    packages = _by_key(recs.get("aoti_package", []))
    if packages:
        rows = []
        for key, r in sorted(packages.items()):
            if r["status"] == "skipped":
                rows.append([key, "skipped", r["reason"], None, None, None, None])
                continue
            for p in r["programs"]:
                rows.append(
                    [
                        key,
                        p["name"],
                        p["package"]["path"],
                        p["package"]["bytes"],
                        p["package"]["sha256"][:16],
                        p["export_s"],
                        p["package_s"],
                    ]
                )
        out += [
            "## AOTInductor packages\n",
            table(["target", "program", "file", "bytes", "sha256", "export (s)", "package (s)"], rows),
        ]
    verifies = _by_key(recs.get("verify", []))
    if verifies:
        rows = []
        for key, r in sorted(verifies.items()):
            if r["status"] == "skipped":
                rows.append([key, "skipped: " + r["reason"]] + [None] * 7)
                continue
            for p in r["programs"]:
                s = p["summary"]
                rows.append(
                    [
                        key,
                        p["name"],
                        p["load_s"],
                        s["decision"]["max_logit_delta"],
                        s["decision"]["max_prob_delta"],
                        f"{s['decision']['argmax_agree']}/{s['decision']['rows']}",
                        s["act"]["max_logit_delta"],
                        s["act"]["max_prob_delta"],
                        f"{s['act']['argmax_agree']}/{s['act']['rows']}",
                    ]
                )
        out += [
            "## Fresh-process verification (package vs eager.pt)\n",
            table(
                [
                    "target",
                    "program",
                    "load (s)",
                    "decision max |Δlogit|",
                    "decision max |Δp|",
                    "decision argmax",
                    "act max |Δlogit|",
                    "act max |Δp|",
                    "act argmax",
                ],
                rows,
            ),
        ]
        lat = []
        for key, r in sorted(verifies.items()):
            if r["status"] == "ok":
                for p in r["programs"]:
                    for b in p["batches"]:
                        sh = b["shape"]
                        lat.append(
                            [
                                key,
                                p["name"],
                                b["batch"],
                                f"{sh['rows']}×{sh['tokens']}×{sh['slots']}",
                                b["latency"]["median_ms"],
                                _runs(b["latency"]),
                            ]
                        )
        if lat:
            out += [
                "Package latency in the verification process (median ms per call):\n",
                table(["target", "program", "batch", "rows×tokens×slots", "median ms", "calls"], lat),
            ]
            gpu = describe(
                [
                    b["latency"].get("gpu")
                    for r in verifies.values()
                    if r["status"] == "ok"
                    for p in r["programs"]
                    for b in p["batches"]
                ]
            )
            out += [gpu + "\n"] if gpu else []
        out += _runtime_sections(verifies)
    out += _latency_sections(recs.get("latency", []))
    return out


def _runs(latency: dict):
    """Calls a latency figure rests on (records before 2026-12: fixed groups, not recorded)."""
    return latency.get("runs")


def _timing(t: dict) -> str:
    if t.get("max_run_time_s"):
        return (
            f"{t['warmup']} warm-ups, then adaptive_autorange for {t['min_run_time_s']:g} to {t['max_run_time_s']:g} s"
        )
    if "min_run_time_s" in t:
        return f"{t['warmup']} warm-ups, then blocked_autorange for {t['min_run_time_s']:g} s"
    return f"{t['warmup']} warm-ups, median of {t['groups']} groups of {t['group_size']}"


def _bucket(b: dict | None) -> str:
    return "plain call" if b is None else f"{b['rows']}×{b['tokens']}×{b['slots']}"


def _runtime_sections(verifies: dict) -> list[str]:
    """The fresh process's way to its first answer, and the runtime's runner against eager."""
    load, runner = [], []
    for key, r in sorted(verifies.items()):
        if r["status"] != "ok" or "fresh_load" not in r:
            continue
        f = r["fresh_load"]
        load.append(
            [
                key,
                f["import_s"],
                f["sha256_s"],
                f["probe_s"],
                f["load_s"],
                f["capture_s"],
                f["first_call_s"],
                f["total_s"],
                f"{f['isa']['mode']} ({f['isa']['package']})",
            ]
        )
        for p in r["programs"]:
            if "runner" not in p:
                continue
            n, s = p["runner"], p["runner"]["summary"]
            replay = [max(b["replay_vs_plain"].values()) for b in n["batches"] if b["replay_vs_plain"] is not None]
            runner.append(
                [
                    key,
                    n["mode"],
                    ", ".join(_bucket(b) for b in n["buckets"]) or "none",
                    n["capture_s"],
                    s["decision"]["max_logit_delta"],
                    f"{s['decision']['argmax_agree']}/{s['decision']['rows']}",
                    s["act"]["max_logit_delta"],
                    f"{s['act']['argmax_agree']}/{s['act']['rows']}",
                    max(replay) if replay else "n/a",
                ]
            )
    out = []
    if load:
        out += [
            "Fresh verification process, time to its first answer (s): imports (torch, preload, Inductor's "
            "loader), package sha256, CPU-ISA answer, load, graph capture, first call:\n",
            table(["target", "import", "sha256", "ISA", "load", "capture", "first call", "total", "ISA answer"], load),
        ]
    if runner:
        out += [
            "## Runtime runner vs eager.pt (laya_build/runtime.py)\n",
            table(
                [
                    "target",
                    "mode",
                    "buckets",
                    "capture (s)",
                    "decision max |Δlogit|",
                    "decision argmax",
                    "act max |Δlogit|",
                    "act argmax",
                    "max |replay − plain|",
                ],
                runner,
            ),
        ]
    return out


def _ok_programs(record, field: str | None) -> dict:
    """Program name -> ``program[field]`` (the whole program with ``field=None``) of an ok record."""
    if not record or record["status"] != "ok":
        return {}
    return {p["name"]: p if field is None else p[field] for p in record["programs"]}


def _sha256_of(program: dict | None, field: str) -> str | None:
    return program and program[field]["sha256"]


FRESH_LOAD_KEYS = ("total_s", "load_s", "capture_s", "runner_max_logit_delta")


def _fresh_load(record) -> dict | None:
    """The fresh load's time to a first answer and the runner's worst logit delta of a verify record."""
    if not record or record["status"] != "ok" or "fresh_load" not in record:
        return None
    runner = next((p["runner"]["summary"] for p in record["programs"] if "runner" in p), None)
    deltas = [runner[h]["max_logit_delta"] for h in ("decision", "act")] if runner else []
    return {
        **{k: record["fresh_load"][k] for k in ("total_s", "load_s", "capture_s")},
        "runner_max_logit_delta": None if not deltas or None in deltas else max(deltas),
    }


def _latencies(records) -> dict:
    """(variant label, batch) -> the latency figure (``median_ms``, and on a GPU ``gpu``) of a
    target's latency records (in their order)."""
    return {
        (variant_label(v, r.get("dtype")), b["batch"]): b["latency"]
        for r in records
        if r["status"] == "ok"
        for v in r["variants"]
        for b in v["batches"]
    }


def _clock(latency: dict | None) -> dict:
    """A latency figure's GPU state as release_diff rows carry it: the median SM clock and the
    clock limits active in some sample (the GPU's idling left out); nothing where none was sampled."""
    gpu = (latency or {}).get("gpu") or {}
    if "samples" not in gpu:
        return {}
    return {"sm_clock_mhz": gpu.get("sm_clock_mhz", {}).get("median"), "clock_limits": limits(gpu)}


CLOCK_APART = 0.02  # median SM clocks further apart than this share: figures of unlike clocks


def unlike_clocks(row: dict) -> bool:
    """Whether a latency row's two figures were taken at unlike clocks: median SM clocks more than
    :data:`CLOCK_APART` apart, or other clock limits active."""
    old, new = row.get("old_sm_clock_mhz"), row.get("new_sm_clock_mhz")
    if old is None or new is None:
        return False
    return abs(old - new) > CLOCK_APART * max(old, new) or row["old_clock_limits"] != row["new_clock_limits"]


def diff(old_recs: dict, new_recs: dict) -> dict:
    """Packages, verification deltas and latencies of two releases (their
    ``report.records_by_stage``), side by side."""

    def both(stage):
        return (_by_key(recs.get(stage, [])) for recs in (old_recs, new_recs))

    result = {"packages": [], "verify": [], "latency": [], "runtime": []}
    old_p, new_p = both("aoti_package")
    for key in sorted(set(old_p) | set(new_p)):
        po, pn = _ok_programs(old_p.get(key), None), _ok_programs(new_p.get(key), None)
        for name in sorted(set(po) | set(pn)):
            o, n = po.get(name), pn.get(name)
            result["packages"].append(
                {
                    "build": key,
                    "program": name,
                    "old_bytes": o and o["package"]["bytes"],
                    "new_bytes": n and n["package"]["bytes"],
                    "old_sha256": _sha256_of(o, "package"),
                    "new_sha256": _sha256_of(n, "package"),
                    "identical": bool(o and n and _sha256_of(o, "package") == _sha256_of(n, "package")),
                    "old_exported_sha256": _sha256_of(o, "exported"),
                    "new_exported_sha256": _sha256_of(n, "exported"),
                    "exported_identical": bool(o and n and _sha256_of(o, "exported") == _sha256_of(n, "exported")),
                }
            )
    old_v, new_v = both("verify")
    for key in sorted(set(old_v) | set(new_v)):
        so, sn = _ok_programs(old_v.get(key), "summary"), _ok_programs(new_v.get(key), "summary")
        for name in sorted(set(so) | set(sn)):
            for head in ("decision", "act"):
                o, n = (so.get(name) or {}).get(head), (sn.get(name) or {}).get(head)
                result["verify"].append(
                    {
                        "build": key,
                        "program": name,
                        "head": head,
                        "old_max_logit_delta": o and o["max_logit_delta"],
                        "new_max_logit_delta": n and n["max_logit_delta"],
                        "old_max_prob_delta": o and o["max_prob_delta"],
                        "new_max_prob_delta": n and n["max_prob_delta"],
                        "old_argmax": o and f"{o['argmax_agree']}/{o['rows']}",
                        "new_argmax": n and f"{n['argmax_agree']}/{n['rows']}",
                    }
                )
    for key in sorted(set(old_v) | set(new_v)):
        fo, fn = (_fresh_load(side.get(key)) for side in (old_v, new_v))
        if fo or fn:
            result["runtime"].append(
                {
                    "build": key,
                    **{
                        f"{side}_{k}": (f or {}).get(k)
                        for side, f in (("old", fo), ("new", fn))
                        for k in FRESH_LOAD_KEYS
                    },
                }
            )
    # by target: a release made before latency was measured per target has one record per
    # (target, dtype) build, its variants labelled with the build's dtype
    old_l, new_l = (_latency_by_target(recs.get("latency", [])) for recs in (old_recs, new_recs))
    for target in sorted(set(old_l) | set(new_l)):
        lo, ln = _latencies(old_l.get(target, [])), _latencies(new_l.get(target, []))
        for variant, batch in dict.fromkeys([*ln, *lo]):  # the new release's order, then what only the old has
            o, n = lo.get((variant, batch)), ln.get((variant, batch))
            row = {
                "target": target,
                "variant": variant,
                "batch": batch,
                "old_ms": o and o["median_ms"],
                "new_ms": n and n["median_ms"],
            }
            clocks = {side: _clock(f) for side, f in (("old", o), ("new", n))}
            if any(clocks.values()):
                row.update(
                    {f"{side}_{k}": c.get(k) for side, c in clocks.items() for k in ("sm_clock_mhz", "clock_limits")}
                )
            result["latency"].append(row)
    return result


def diff_sections(model: dict, old: str, new: str) -> list[str]:
    out = []
    if model["packages"]:
        out += [
            "## Packages\n",
            "A package that differs while its exported program is identical is the same graph "
            "compiled differently: AOTInductor embeds the compiler, its flags (`-march=native`) "
            "and include paths, and on CUDA its autotuning choices (docs/concepts/reproducibility.md); compare the "
            "verification deltas below.\n",
            table(
                ["build", "program", f"{old} bytes", f"{new} bytes", "exported program identical", "package identical"],
                [
                    [r["build"], r["program"], r["old_bytes"], r["new_bytes"], r["exported_identical"], r["identical"]]
                    for r in model["packages"]
                ],
            ),
        ]
    if model["verify"]:
        out += [
            "## Verification deltas (package vs eager)\n",
            table(
                [
                    "build",
                    "program",
                    "head",
                    f"{old} max |Δlogit|",
                    f"{new} max |Δlogit|",
                    f"{old} max |Δp|",
                    f"{new} max |Δp|",
                    f"{old} argmax",
                    f"{new} argmax",
                ],
                [
                    [
                        r["build"],
                        r["program"],
                        r["head"],
                        r["old_max_logit_delta"],
                        r["new_max_logit_delta"],
                        r["old_max_prob_delta"],
                        r["new_max_prob_delta"],
                        r["old_argmax"],
                        r["new_argmax"],
                    ]
                    for r in model["verify"]
                ],
            ),
        ]
    if model.get("runtime"):
        out += [
            "## Runtime: fresh load to first answer and runner vs eager\n",
            table(
                [
                    "build",
                    f"{old} to first answer (s)",
                    f"{new} to first answer (s)",
                    f"{old} load (s)",
                    f"{new} load (s)",
                    f"{old} capture (s)",
                    f"{new} capture (s)",
                    f"{old} runner max |Δlogit|",
                    f"{new} runner max |Δlogit|",
                ],
                [
                    [
                        r["build"],
                        r["old_total_s"],
                        r["new_total_s"],
                        r["old_load_s"],
                        r["new_load_s"],
                        r["old_capture_s"],
                        r["new_capture_s"],
                        r["old_runner_max_logit_delta"],
                        r["new_runner_max_logit_delta"],
                    ]
                    for r in model["runtime"]
                ],
            ),
        ]
    if model["latency"]:
        rows = model["latency"]
        clocked = any("old_sm_clock_mhz" in r for r in rows)
        head = ["target", "variant", "batch", old, new]
        if clocked:
            head += [f"{old} SM MHz", f"{new} SM MHz", "clock limits (old / new)"]

        def cells(r):
            base = [r.get("target", r.get("build")), r["variant"], r["batch"], r["old_ms"], r["new_ms"]]
            if not clocked:
                return base
            if "old_sm_clock_mhz" not in r:  # neither figure has a GPU state
                return base + ["", "", ""]
            mhz = [f"{v:.0f}" if v is not None else "" for v in (r["old_sm_clock_mhz"], r["new_sm_clock_mhz"])]
            limits = " / ".join(", ".join(r[f"{side}_clock_limits"] or []) or "-" for side in ("old", "new"))
            return base + mhz + [limits + (" (unlike clocks)" if unlike_clocks(r) else "")]

        out += ["## Latency (median ms)\n"]
        if clocked:
            out.append(
                "The GPU's median SM clock and the clock limits active while each figure was timed "
                f"(`nvidia-smi`); figures whose clocks are more than {CLOCK_APART:.0%} apart, or whose "
                "clock limits differ, are marked: a compute-bound forward slows by as much as its clock "
                "is lowered, so they compare the GPUs' states as much as the releases.\n"
            )
        out.append(table(head, [cells(r) for r in rows]))
    return out
