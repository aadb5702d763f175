#!/usr/bin/env python3
"""Keep only the device code an sm_90 GPU (H100/H200) can load in a shared library's CUDA fat binaries.

`nvprune` works on object files and static libraries only, so this rewrites the ``.nv_fatbin`` section of a
built ``.so`` in place: each fat-binary container (one per compiled ``.cu`` file) is compacted to the entries
the driver can pick on sm_90, and the bytes freed at its end are zeroed (they compress to nothing). The file
keeps its size and layout, every ELF header, section and symbol is untouched, and each container still starts
where it did: every pointer the library stores into a fat-binary section (the ``__fatBinC_Wrapper_t`` records
of ``.nvFatBinSegment`` and the prelinked lists of linked wrappers, all relocated through ``.rela.dyn``) must be
a container start, which is checked before anything is written. Both ``.nv_fatbin`` and ``__nv_relfatbin``
(NCCL's prelinked device code) are compacted.

Per container, for sm_90:
  * the SASS (ELF) entries for arch 90 (sm_90 and sm_90a) when there are any; else
  * every PTX entry of arch <= 90 (the driver JIT-compiles the highest one); else
  * the container's smallest entry unchanged (it had nothing for sm_90 before either: same behaviour).

Layout (as ``cuobjdump`` reads it; CUDA's ``fatbinary_section.h`` names the wrapper): a container is a
16-byte header ``<magic 0xBA55ED50 u32, version u16, header size u16, payload size u64>`` followed by entries
``<kind u16 (1 PTX, 2 ELF), u16, header size u32, payload size u64, ..., arch u32 at +28, ..., flags u64 at +40>``.

Usage:
    python3 gpu/fatbin_prune.py LIB.so [LIB2.so ...]           # prune in place, print bytes kept
    python3 gpu/fatbin_prune.py --dry-run LIB.so                # what would be kept
    python3 gpu/fatbin_prune.py --check ORIG.so PRUNED.so --cuobjdump PATH   # sm_90 cubins identical?
"""

from __future__ import annotations

import argparse
import hashlib
import os
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass

FATBIN_MAGIC = 0xBA55ED50
WRAPPER_MAGIC = 0x466243B1
KIND_PTX, KIND_ELF = 1, 2
R_X86_64_RELATIVE = 8


@dataclass
class Entry:
    off: int  # file offset of the entry header
    size: int  # header + payload bytes
    kind: int
    arch: int
    flags: int


@dataclass
class Container:
    off: int  # file offset of the container header
    header_size: int
    payload: int  # bytes of entries after the header
    entries: list


def _sections(b: bytes) -> dict:
    if b[:4] != b"\x7fELF" or b[4] != 2 or b[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", b, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    raw = [struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * shentsize) for i in range(shnum)]
    stro = raw[shstrndx][4]
    out = {}
    for name, typ, _flags, addr, off, size, _link, _info, _align, entsize in raw:
        n = b[stro + name: b.index(b"\0", stro + name)].decode()
        out[n] = {"type": typ, "addr": addr, "off": off, "size": size, "entsize": entsize}
    return out


def containers(b: bytes, sec: dict) -> list[Container]:
    """Walk ``.nv_fatbin``: consecutive containers (zero padding between them is skipped)."""
    pos, end, out = sec["off"], sec["off"] + sec["size"], []
    while pos + 16 <= end:
        magic, _ver, hs, payload = struct.unpack_from("<IHHQ", b, pos)
        if magic != FATBIN_MAGIC:
            if b[pos:pos + 8] == b"\0" * 8:
                pos += 8
                continue
            raise ValueError(f"bad fat-binary magic {magic:#x} at file offset {pos}")
        e, cend, ents = pos + hs, pos + hs + payload, []
        while e < cend:
            kind, _u, ehs, size = struct.unpack_from("<HHIQ", b, e)
            arch, = struct.unpack_from("<I", b, e + 28)
            flags, = struct.unpack_from("<Q", b, e + 40)
            if kind not in (KIND_PTX, KIND_ELF) or e + ehs + size > cend:
                raise ValueError(f"bad fat-binary entry at file offset {e}")
            ents.append(Entry(e, ehs + size, kind, arch, flags))
            e += ehs + size
        out.append(Container(pos, hs, payload, ents))
        pos = cend
    return out


def wrapper_versions(b: bytes, secs: dict) -> dict[int, int]:
    """How many ``__fatBinC_Wrapper_t`` records of each version ``.nvFatBinSegment`` holds (1 plain, 2 linked)."""
    seg = secs.get(".nvFatBinSegment")
    out: dict[int, int] = {}
    if seg is None:
        return out
    for i in range(seg["size"] // 24):
        o = seg["off"] + 24 * i
        magic, version = struct.unpack_from("<ii", b, o)
        if magic != WRAPPER_MAGIC:
            raise ValueError(f"bad fat-binary wrapper magic at {o}")
        out[version] = out.get(version, 0) + 1
    return out


def pointers_into(b: bytes, secs: dict, sec: dict) -> list[int]:
    """Every address inside ``sec`` that the library stores as a pointer: the addends of its
    ``R_X86_64_RELATIVE`` relocations (a position-independent library stores every data pointer that way;
    the fat-binary wrappers' ``data`` fields and the linked wrappers' arrays of prelinked fat binaries)."""
    lo, hi = sec["addr"], sec["addr"] + sec["size"]
    out = []
    rs = secs.get(".rela.dyn")
    if rs is None:
        return out
    for j in range(rs["size"] // 24):
        _r_off, r_info, r_add = struct.unpack_from("<QQq", b, rs["off"] + 24 * j)
        if (r_info & 0xFFFFFFFF) == R_X86_64_RELATIVE and lo <= r_add < hi:
            out.append(r_add)
    return out


def select(c: Container) -> list[Entry]:
    """The entries an sm_90 device can load (module docstring)."""
    sass = [e for e in c.entries if e.kind == KIND_ELF and e.arch == 90]
    if sass:
        return sass
    ptx = [e for e in c.entries if e.kind == KIND_PTX and e.arch <= 90]
    if ptx:
        return ptx
    return [min(c.entries, key=lambda e: e.size)] if c.entries else []


#: Sections holding fat-binary containers: the registered ones and (for libraries linked with relocatable
#: device code, e.g. NCCL) the prelinked ones the linked wrappers list.
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")


def plan(path: str) -> tuple[bytes, list[Container], dict]:
    """Parse ``path``; refuse (ValueError) unless every stored pointer into a fat-binary section is the start of
    one of its containers, so that compacting containers in place moves nothing anything points to."""
    b = open(path, "rb").read()
    secs = _sections(b)
    cs_all: list[Container] = []
    info = {"fatbin": 0, "kept": 0, "containers": 0, "pointers": 0, "wrappers": wrapper_versions(b, secs)}
    for name in FATBIN_SECTIONS:
        sec = secs.get(name)
        if sec is None or sec["size"] == 0 or sec["type"] == 8:  # SHT_NOBITS
            continue
        cs = containers(b, sec)
        starts = {sec["addr"] + (c.off - sec["off"]) for c in cs}
        ptrs = pointers_into(b, secs, sec)
        stray = [t for t in ptrs if t not in starts]
        if stray:
            raise ValueError(f"{len(stray)} pointers into {name} are not container starts (e.g. {stray[0]:#x})")
        info["fatbin"] += sec["size"]
        info["kept"] += sum(sum(e.size for e in select(c)) + c.header_size for c in cs)
        info["containers"] += len(cs)
        info["pointers"] += len(ptrs)
        cs_all += cs
    return b, cs_all, info


def prune(path: str, dry_run: bool = False) -> dict:
    """Prune ``path`` in place; returns ``{"fatbin": bytes, "kept": bytes, "containers": n, ...}``."""
    b, cs, info = plan(path)
    if not cs or dry_run:
        return info
    out = bytearray(b)
    for c in cs:
        keep = select(c)
        body = b"".join(b[e.off:e.off + e.size] for e in keep)
        total = c.payload
        hdr = bytearray(b[c.off:c.off + c.header_size])
        struct.pack_into("<Q", hdr, 8, len(body))
        start = c.off
        out[start:start + c.header_size] = hdr
        out[start + c.header_size:start + c.header_size + total] = body + b"\0" * (total - len(body))
    # re-read what was written: every container parses and holds exactly the kept entries
    secs = _sections(bytes(out))
    cs2 = [c for name in FATBIN_SECTIONS if name in secs and secs[name]["size"] and secs[name]["type"] != 8
           for c in containers(bytes(out), secs[name])]
    want = [[(e.kind, e.arch, e.flags) for e in select(c)] for c in cs]
    got = [[(e.kind, e.arch, e.flags) for e in c.entries] for c in cs2]
    if want != got:
        raise RuntimeError(f"{path}: re-parse after pruning disagrees; file left unchanged")
    tmp = path + ".prune-tmp"
    with open(tmp, "wb") as f:
        f.write(out)
    os.chmod(tmp, os.stat(path).st_mode)
    os.replace(tmp, path)
    return info


def check(orig: str, pruned: str, cuobjdump: str) -> dict:
    """Extract every sm_90 cubin from both files with ``cuobjdump -xelf all`` and compare them byte for byte."""
    res = {}
    for tag, path in (("orig", orig), ("pruned", pruned)):
        d = tempfile.mkdtemp(prefix=f"fbcheck-{tag}-")
        subprocess.run([cuobjdump, "-xelf", "all", os.path.abspath(path)], cwd=d, check=True,
                       stdout=subprocess.DEVNULL)
        res[tag] = {}
        for n in sorted(os.listdir(d)):
            if ".sm_90" in n:
                res[tag][n] = hashlib.sha256(open(os.path.join(d, n), "rb").read()).hexdigest()
        for n in os.listdir(d):
            os.remove(os.path.join(d, n))
        os.rmdir(d)
    # cuobjdump numbers the files it writes by entry index, so compare the cubins' contents, not their names
    same = sorted(res["orig"].values()) == sorted(res["pruned"].values())
    listed = subprocess.run([cuobjdump, "--list-elf", pruned], capture_output=True, text=True).stdout.split("\n")
    return {"sm90_cubins": len(res["orig"]), "identical": same,
            "listed_after": sum(1 for x in listed if x.strip())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("libs", nargs="*")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--check", nargs=2, metavar=("ORIG", "PRUNED"))
    ap.add_argument("--cuobjdump", default="cuobjdump")
    a = ap.parse_args(argv)
    if a.check:
        print(check(*a.check, a.cuobjdump))
        return 0
    for lib in a.libs:
        info = prune(lib, a.dry_run)
        print(f"{lib}: fatbin {info['fatbin']} -> {info['kept']} bytes in {info['containers']} containers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
