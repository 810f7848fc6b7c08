"""Byte reproducibility of a package build: compile one export several times, compare.

    python benchmarks/package_repro.py compile EXPORT_DIR OUT_DIR [--tuning FILE] [--configs JSON]
    python benchmarks/package_repro.py compare A_DIR B_DIR > compare.json
    python benchmarks/package_repro.py cubins A_DIR B_DIR > cubins.json

``compile`` runs the package stage's own child function
(:func:`laya_build.stages.children.package.compile_packages`) in this process, with
``TORCHINDUCTOR_CACHE_DIR`` at the stage's fixed path (emptied first), seeded with ``--tuning``
when given, and then keeps what the stage throws away: OUT_DIR gets the package(s), the
harvested ``tuning.json``, ``kernels.json`` (every Triton kernel source of the cache: its name,
heuristic, sha256), ``members.tgz`` (the packages' text members) and ``cache.tgz`` (the cache's
text files).
Set ``PYTHONHASHSEED=0`` as the stage does.

``cubins`` pairs the cubins of two such folders by the kernel that loads them and says whether
they are equal once the modification times of the ``.py`` sources in their DWARF line tables
are left out.

``compare`` reports for two such folders: sha256 of each package, the archive members that
differ (with a unified diff of text members), the kernels whose source differs, and the tuning
entries that differ.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import io
import json
import os
import re
import sys
import tarfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TEXT = (".cpp", ".h", ".json", ".txt", ".py", ".log", ".ptx", ".version", ".best_config")


def sha256(path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def kernel_index(cache: Path) -> dict:
    """Every Triton kernel source in the Inductor cache ``cache``: name -> its file, heuristic
    and sha256 (a kernel's file name is already a hash of its source)."""
    out = {}
    for path in sorted(cache.rglob("*.py")):
        text = path.read_text(errors="replace")
        names = re.findall(r"^def (triton_\w+)\(", text, re.M)
        if not names or "@triton.jit" not in text or "async_compile" in text:  # not a wrapper
            continue
        heur = re.findall(r"^@triton_heuristics\.(\w+)\(", text, re.M)
        for name in names:
            out[name] = {
                "py": path.relative_to(cache).as_posix(),
                "sha256": hashlib.sha256(text.encode()).hexdigest(),
                "heuristic": heur[0] if heur else None,
            }
    return out


def compile_cmd(args) -> int:
    from laya_build.runner.folders import inductor_cache

    out = Path(args.out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    exp_dir = Path(args.export_dir).resolve()
    exp = json.loads((exp_dir / "export.json").read_text())
    # the stage's own cache folder and lock (emptied before, removed after)
    with inductor_cache(args.cache_key or f"package-{exp['target']}-{exp['dtype']}") as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
        os.environ["TRITON_CACHE_DIR"] = str(cache.path / "triton")
        return compile_in(args, exp_dir, exp, out, cache.path)


def compile_in(args, exp_dir: Path, exp: dict, out: Path, cache: Path) -> int:
    from laya_build.runner.folders import vec_isa_root
    from laya_build.stages import package_tuning
    from laya_build.stages.children.package import compile_packages

    entries = {}
    if args.tuning:
        entries = json.loads(Path(args.tuning).read_text())["entries"]
    job = {
        "inductor_configs": json.loads(args.configs),
        "tuning": entries,
        "preload": [m for m in args.preload.split(",") if m],
        "vec_isa_root": str(vec_isa_root()),
        "programs": [
            {
                "name": p["name"],
                "exported": str(exp_dir / p["exported"]["path"]),
                "package_tmp": str(out / f"{p['name']}.pt2"),
            }
            for p in exp["programs"]
        ],
    }
    start = time.perf_counter()
    result = compile_packages(job)
    import torch

    doc = package_tuning.document(
        result["tuning"], torch_version=torch.__version__, target=exp["target"], dtype=exp["dtype"]
    )
    (out / "tuning.json").write_text(package_tuning.dumps(doc))
    (out / "kernels.json").write_text(json.dumps(kernel_index(cache), indent=1, sort_keys=True))
    with tarfile.open(out / "members.tgz", "w:gz") as tar:  # the packages' text members
        for prog in job["programs"]:
            with zipfile.ZipFile(prog["package_tmp"]) as zf:
                for info in zf.infolist():
                    if info.filename.endswith((*TEXT, ".cubin")) and info.file_size < 8_000_000:
                        data = zf.read(info)
                        ti = tarfile.TarInfo(f"{prog['name']}/{info.filename}")
                        ti.size = len(data)
                        tar.addfile(ti, io.BytesIO(data))
    with tarfile.open(out / "cache.tgz", "w:gz") as tar:
        for path in sorted(cache.rglob("*")):
            if path.is_file() and path.suffix in TEXT and path.stat().st_size < 4_000_000:
                tar.add(path, arcname=path.relative_to(cache).as_posix())
    summary = {
        "seconds": round(time.perf_counter() - start, 1),
        "seeded_from": args.tuning,
        "tuning_use": result["tuning_use"],
        "programs": [
            {**p, "sha256": sha256(out / f"{p['name']}.pt2"), "bytes": (out / f"{p['name']}.pt2").stat().st_size}
            for p in result["programs"]
        ],
        "cache": result["cache"],
        "inductor_configs": job["inductor_configs"],
        "torch": torch.__version__,
        "env": {
            k: os.environ.get(k)
            for k in ("PYTHONHASHSEED", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TRITON_PTXAS_PATH")
        },
        "determinism": result["determinism"],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: summary[k] for k in ("seconds", "tuning_use", "determinism", "programs")}), flush=True)
    return 0


def norm(name: str) -> str:
    return re.sub(r"[a-z0-9]{20,}", "#", name)


def text_diff(a: bytes, b: bytes, limit: int = 80) -> list[str] | None:
    try:
        la, lb = a.decode().splitlines(), b.decode().splitlines()
    except UnicodeDecodeError:
        return None
    return [line[:300] for line in difflib.unified_diff(la, lb, "a", "b", n=0, lineterm="")][:limit]


def pair_members(za: zipfile.ZipFile, zb: zipfile.ZipFile):
    """Members of two archives paired: same name first, then a name that differs only in a
    long hex/base32 token where that pairing is unique; the rest is left in one archive."""
    ia = {i.filename: i for i in za.infolist()}
    ib = {i.filename: i for i in zb.infolist()}
    pairs = [(ia[n], ib[n]) for n in sorted(set(ia) & set(ib))]
    ra, rb = {}, {}
    for n in sorted(set(ia) - set(ib)):
        ra.setdefault(norm(n), []).append(n)
    for n in sorted(set(ib) - set(ia)):
        rb.setdefault(norm(n), []).append(n)
    only_a, only_b = [], []
    for k in sorted(set(ra) | set(rb)):
        xa, xb = ra.get(k, []), rb.get(k, [])
        if len(xa) == len(xb) == 1:
            pairs.append((ia[xa[0]], ib[xb[0]]))
        else:
            only_a += xa
            only_b += xb
    return pairs, only_a, only_b


def compare_zip(a: Path, b: Path) -> dict:
    za, zb = zipfile.ZipFile(a), zipfile.ZipFile(b)
    pairs, only_a, only_b = pair_members(za, zb)
    res = {
        "sha256": [sha256(a), sha256(b)],
        "identical": sha256(a) == sha256(b),
        "members": [len(za.infolist()), len(zb.infolist())],
        "only_a": only_a,
        "only_b": only_b,
        "order_equal": [i.filename for i in za.infolist()] == [i.filename for i in zb.infolist()],
        "listing_a": [[i.filename, i.file_size, i.CRC] for i in za.infolist()],
        "listing_b": [[i.filename, i.file_size, i.CRC] for i in zb.infolist()],
        "differing": [],
    }
    for x, y in pairs:
        if x.filename != y.filename or x.CRC != y.CRC or x.file_size != y.file_size or x.date_time != y.date_time:
            d = {"a": x.filename, "b": y.filename, "size": [x.file_size, y.file_size], "crc_equal": x.CRC == y.CRC}
            if x.CRC != y.CRC and x.file_size == y.file_size:
                ba, bb = za.read(x), zb.read(y)
                pos = [i for i in range(len(ba)) if ba[i] != bb[i]] if len(ba) < 5_000_000 else []
                d["bytes_differing"], d["first_offsets"] = len(pos), pos[:8]
            if x.CRC != y.CRC and x.filename.endswith(TEXT) and max(x.file_size, y.file_size) < 20_000_000:
                d["diff"] = text_diff(za.read(x), zb.read(y))
            res["differing"].append(d)
    return res


def compare_cmd(args) -> int:
    a, b = Path(args.a), Path(args.b)
    res = {"a": str(a), "b": str(b), "packages": {}}
    for pt2 in sorted(a.glob("*.pt2")):
        res["packages"][pt2.name] = compare_zip(pt2, b / pt2.name)
    ka, kb = (json.loads((d / "kernels.json").read_text()) for d in (a, b))
    res["kernels"] = {"count": [len(ka), len(kb)], "only_a": sorted(set(ka) - set(kb))}
    res["kernels"]["only_b"] = sorted(set(kb) - set(ka))
    src = [n for n in sorted(set(ka) & set(kb)) if ka[n]["sha256"] != kb[n]["sha256"]]
    res["kernels"]["source_differs"] = src
    res["kernels"]["heuristics"] = {
        h: sum(1 for k in ka.values() if (k["heuristic"] or "") == h)
        for h in sorted({k["heuristic"] or "" for k in ka.values()})
    }
    if src:  # the first differing kernel sources, diffed
        with tarfile.open(a / "cache.tgz") as ta, tarfile.open(b / "cache.tgz") as tb:
            res["kernels"]["source_diffs"] = {
                n: text_diff(ta.extractfile(ka[n]["py"]).read(), tb.extractfile(kb[n]["py"]).read(), 40)
                for n in src[:5]
            }
    ta_, tb_ = (json.loads((d / "tuning.json").read_text())["entries"] for d in (a, b))
    res["tuning"] = {
        "entries": [len(ta_), len(tb_)],
        "differing": sorted(k for k in set(ta_) | set(tb_) if ta_.get(k) != tb_.get(k)),
        "identical_file": (a / "tuning.json").read_bytes() == (b / "tuning.json").read_bytes(),
    }
    print(json.dumps(res, indent=1, default=str))
    return 0


def dwarf_py_mtimes_zeroed(data: bytes) -> bytes:
    """``data`` (a cubin) with the modification time of every ``*.py`` entry of its DWARF
    line table's file list set to 0 (entry: name NUL, directory, time, size as ULEB128)."""
    out = bytearray(data)
    for m in re.finditer(rb"([A-Za-z0-9_]+\.py)\x00", data):
        i = m.end()
        while out[i] & 0x80:  # directory index
            i += 1
        i += 1
        while out[i] & 0x80:  # modification time
            out[i] = 0x80
            i += 1
        out[i] = 0
    return bytes(out)


def cubins_cmd(args) -> int:
    """The cubins of two compiles, paired by the kernel that loads them (wrapper.cpp)."""

    def members(d: Path) -> dict[str, bytes]:
        with tarfile.open(d / "members.tgz") as tar:
            return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}

    ma, mb = members(Path(args.a)), members(Path(args.b))
    res = {"a": args.a, "b": args.b, "kernels": []}
    wa, wb = (next(v.decode() for k, v in m.items() if k.endswith(".wrapper.cpp")) for m in (ma, mb))
    load = r'kernels_\.(\w+) = loadKernel\("[^"]*/(\w+\.cubin)"'
    ka, kb = dict(re.findall(load, wa)), dict(re.findall(load, wb))
    by_name = {k.rsplit("/", 1)[-1]: v for m in (ma, mb) for k, v in m.items() if k.endswith(".cubin")}
    for kernel in sorted(ka):
        x, y = by_name[ka[kernel]], by_name[kb[kernel]]
        diff = sum(p != q for p, q in zip(x, y)) if len(x) == len(y) else None
        res["kernels"].append(
            {
                "kernel": kernel,
                "bytes": [len(x), len(y)],
                "bytes_differing": diff,
                "equal": x == y,
                "equal_but_source_mtimes": dwarf_py_mtimes_zeroed(x) == dwarf_py_mtimes_zeroed(y),
            }
        )
    res["all_equal_but_source_mtimes"] = all(k["equal_but_source_mtimes"] for k in res["kernels"])
    print(json.dumps(res, indent=1))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("compile")
    p.add_argument("export_dir")
    p.add_argument("out_dir")
    p.add_argument("--tuning", help="a tuning.json to seed the cache with")
    p.add_argument("--configs", default='{"aot_inductor.check_lowerbound": false}', help="inductor_configs (JSON)")
    p.add_argument("--preload", default="tilelang", help="modules imported before the load-back (comma-separated)")
    p.add_argument("--cache-key", help="another cache folder than the stage's (its path is in the package's bytes)")
    p = sub.add_parser("compare")
    p.add_argument("a")
    p.add_argument("b")
    p = sub.add_parser("cubins")
    p.add_argument("a")
    p.add_argument("b")
    args = parser.parse_args(argv)
    return {"compile": compile_cmd, "compare": compare_cmd, "cubins": cubins_cmd}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
