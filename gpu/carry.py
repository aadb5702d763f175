#!/usr/bin/env python3
"""The `run` calls that send the vLLM 0.34 stack's parts to the H200 machine, one part per call, in order.

Reads PARTS_DIR/MANIFEST.txt (gpu/build_stack.py wrote it), measures what travels with every call (the
checkout's tracked + untracked-not-ignored files) and checks that tree + MANIFEST + one part stays under the
64 MiB a call may carry, with a margin (a warning, exit 1 with --strict; --tree-mib gives the count the device
tool uses where that differs: measure with ``git ls-files -z | xargs -0 stat -c %s``, not ``xargs du -cb | tail
-1``, which shows only the last of the batches xargs splits the list into). Prints one block per call: its ``carry`` list (JSON) and its command.

Usage:
    python3 gpu/carry.py                          # every part
    python3 gpu/carry.py --missing p03-... p07-... # only those (paste the names from `staged N/M parts, missing: ...`)
    python3 gpu/carry.py --json                   # machine-readable
    python3 gpu/carry.py --last 'python3 gpu/smoke_034.py'   # the command chained after staging in the last call
    python3 gpu/carry.py --cache h100             # also carry .gpucache/h100 (gpu/cache.sh: the compile cache the
                                                  # last session on that card brought back) and restore it before --last
    python3 gpu/carry.py --resume .gpuresume/h100.tar   # also carry the done cells the queue resumes
                                                  # (gpu/resume_cells.py) and unpack them before --last
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

LIMIT = 64 * 2**20
MARGIN = 2 * 2**20  # the tree may grow a little between measuring and calling


def travelling_bytes(root: Path) -> int:
    """Bytes of the tracked and untracked-not-ignored files of the checkout at ``root`` (what every call sends)."""
    out = 0
    for args in (["ls-files", "-z"], ["ls-files", "-z", "-o", "--exclude-standard"]):
        names = subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=True).stdout.split(b"\0")
        for n in names:
            if n:
                p = root / n.decode()
                try:  # a file another process deletes between the listing and the stat (a test's temp file) counts 0
                    if p.is_file() and not p.is_symlink():
                        out += p.stat().st_size
                except FileNotFoundError:
                    pass
    return out


def read_manifest(pd: Path) -> tuple[str, list[tuple[str, str, int]]]:
    lines = (pd / "MANIFEST.txt").read_text().splitlines()
    head = lines[0] if lines and lines[0].startswith("#") else ""
    parts = []
    for line in lines:
        if line and not line.startswith("#"):
            sha, name, size = line.split()
            parts.append((sha, name, int(size)))
    return head, parts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=".gpu34", help="the parts folder, relative to the checkout root")
    ap.add_argument("--missing", nargs="*", help="send only these parts")
    ap.add_argument("--last", default="python3 gpu/smoke_034.py",
                    help="command chained after `source gpu/stage.sh` in the call that completes the stack")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--tree-mib", type=float,
                    help="what the device tool counts for the checkout, if known (default: the tracked + "
                         "untracked-not-ignored bytes measured here)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a call would exceed 64 MiB")
    ap.add_argument("--cache", metavar="CARD",
                    help="carry .gpucache/CARD (gpu/cache.sh) with the last part, or in a call of its own when it "
                         "does not fit beside it, and restore it before --last")
    ap.add_argument("--resume", metavar="TAR",
                    help="carry this archive of done cells (gpu/resume_cells.py: .gpuresume/CARD.tar) with the last "
                         "part, or in a call of its own, and unpack it before --last, so the queue skips them")
    a = ap.parse_args(argv)
    root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                               check=True).stdout.strip())
    pd = root / a.dir
    head, parts = read_manifest(pd)
    todo = [p for p in parts if not a.missing or p[1] in set(a.missing)]
    if a.missing and len(todo) != len(set(a.missing)):
        unknown = sorted(set(a.missing) - {p[1] for p in parts})
        print(f"carry: not in the manifest: {unknown}", file=sys.stderr)
        return 2
    for _, name, size in todo:
        if not (pd / name).is_file() or (pd / name).stat().st_size != size:
            print(f"carry: {a.dir}/{name} is missing or has the wrong size here; rebuild or copy it", file=sys.stderr)
            return 2
    measured = travelling_bytes(root)
    tree = int(a.tree_mib * 2**20) if a.tree_mib is not None else measured
    manifest = (pd / "MANIFEST.txt").stat().st_size
    biggest = max(s for _, _, s in todo) if todo else 0
    worst = tree + manifest + biggest
    calls = []
    for i, (_, name, size) in enumerate(todo):
        last = i == len(todo) - 1
        cmd = "source gpu/stage.sh " + a.dir
        cmd += f" && {a.last}" if last and a.last else "; [ $? -ne 1 ]"  # 3 = parts still missing: fine
        calls.append({"call": i + 1, "carry": [f"{a.dir}/MANIFEST.txt", f"{a.dir}/{name}"], "command": cmd,
                      "bytes": tree + manifest + size})
    extras = []  # (path to carry, bytes, the step that uses it before --last)
    if a.cache:
        cdir = root / ".gpucache" / a.cache
        cfiles = sorted(p for p in cdir.glob("*") if p.is_file()) if cdir.is_dir() else []
        if (cdir / "CACHE.txt").is_file():
            # a cache that does not restore leaves the engines cold; the queue starts all the same
            extras.append((f".gpucache/{a.cache}", sum(p.stat().st_size for p in cfiles),
                           "{ bash gpu/cache.sh restore || echo 'cache: not restored; engines start cold'; }"))
        else:
            print(f"carry: no .gpucache/{a.cache}/CACHE.txt here (no session on that card brought one back): the "
                  "engines start cold", file=sys.stderr)
    if a.resume:
        rp = (root / a.resume).resolve()
        if not rp.is_relative_to(root):
            print(f"carry: --resume {a.resume} is outside the checkout; a call carries only what is inside it",
                  file=sys.stderr)
            return 2
        if rp.is_file():
            rel = shlex.quote(str(rp.relative_to(root)))
            # cells that do not unpack are run again: slower, not wrong
            extras.append((str(rp.relative_to(root)), rp.stat().st_size,
                           f"{{ tar -xf {rel} || echo 'resume: {rel} not unpacked; its cells run again'; }}"))
        else:
            print(f"carry: no {a.resume} here (gpu/resume_cells.py writes none when no done cell would run again): "
                  "nothing to resume", file=sys.stderr)
    if extras:
        steps = " && ".join([f"source gpu/stage.sh {a.dir}", *(step for _, _, step in extras),
                             *([a.last] if a.last else [])])
        # each extra rides with the last part if it fits there, else in one more call; the machine keeps what a
        # call carried for the next (as it keeps the parts), so the steps run in the call that comes last
        rest = []
        for path, size, _ in extras:
            if calls and calls[-1]["bytes"] + size <= LIMIT - MARGIN:
                calls[-1]["carry"].append(path)
                calls[-1]["bytes"] += size
            else:
                rest.append((path, size))
        if rest:
            if calls:
                calls[-1]["command"] = f"source gpu/stage.sh {a.dir}; [ $? -ne 1 ]"
            calls.append({"call": len(calls) + 1, "carry": [f"{a.dir}/MANIFEST.txt", *(p for p, _ in rest)],
                          "command": steps, "bytes": tree + manifest + sum(b for _, b in rest)})
            if calls[-1]["bytes"] > LIMIT - MARGIN:
                names = ", ".join(p for p, _ in rest)
                print(f"carry: WARNING: {names} ({sum(b for _, b in rest) / 2**20:.1f} MiB) do not fit in one call "
                      f"beside the tree ({tree / 2**20:.1f} MiB): carry less (leave out --cache, and the engines "
                      "start cold; or resume fewer blocks), or shrink the tree", file=sys.stderr)
                if a.strict:
                    return 1
        elif calls:
            calls[-1]["command"] = steps
    largest = max([worst, *(c["bytes"] for c in calls)])  # with the extras that rode along
    info = {"manifest": head, "parts": len(parts), "sent": len(todo), "tree_bytes": tree, "measured_tree_bytes": measured,
            "largest_call_bytes": largest, "limit_bytes": LIMIT, "margin_bytes": LIMIT - largest, "calls": calls}
    if a.json:
        print(json.dumps(info, indent=1))
    else:
        print(head)
        print(f"checkout measured here: {measured / 2**20:.2f} MiB (tracked + untracked-not-ignored)")
        print(f"travelling tree {tree / 2**20:.2f} MiB + MANIFEST + largest part {biggest / 2**20:.2f} MiB = "
              f"{worst / 2**20:.2f} MiB per call (limit 64 MiB, margin {(LIMIT - worst) / 2**20:.2f} MiB)")
        if largest > worst:
            print(f"largest call with what rides along (--cache, --resume): {largest / 2**20:.2f} MiB")
        for c in calls:
            print(f"call {c['call']}: carry {json.dumps(c['carry'])}\n        command {c['command']!r}")
    if worst > LIMIT - MARGIN:
        room = (LIMIT - MARGIN - tree - manifest) / 2**20
        print(f"carry: WARNING: a call would move {worst / 2**20:.1f} MiB by this count, over 64 MiB less a "
              f"{MARGIN >> 20} MiB margin. " + (f"Re-split to parts of {int(room)} MiB: python3.12 "
              f"gpu/build_stack.py --reuse --part-mib {int(room)}" if room >= 4 else
              "No part fits beside this tree: the device tool's count must be smaller (H200 calls ran from "
              "checkouts of 83-102 MiB tracked on 2026-12-01/02), or the tree must shrink"), file=sys.stderr)
        return 1 if a.strict else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
