#!/usr/bin/env python3
"""Bring a GPU session's results into ``data/sweeps``: the steps every session did by hand, in one command.

``gpu/session.sh wait`` packs the results folder into ``$OUT/res.tgz.partNN``; the ``run`` reply copies them to a
folder here. This script joins and unpacks the parts into a temporary folder, checks every sweep in them and, when
all is well, copies each sweep into ``data/sweeps/<name>/`` (its runtime files left out: ``.run``, ``.engines``,
``.sweep.lock``, ``.sweep.lease``, ``logs``). It refuses, and copies nothing, when

- a replay file says ``exact`` is not true (the replayed plan was not what the engine ran);
- a file the committed sweep has comes back with other contents (a carried-back cell returns byte for byte);
- an incoming sweep's ``provenance.json`` does not begin with every invocation of the committed one (the session
  ran from another record of the sweep, and copying would replace the committed history);
- the provenance ends in an invocation that ran no engine and finished no cell (a queue stopped before its job's
  first cell, as on 2026-12-07: that session took an earlier tarball by hand). ``--drop-empty`` drops such
  trailing invocations of the session (never a committed one) and says so. When the session brought more new cells
  than its other invocations finished, the trailing ones ran cells and were cut before writing their engines (as
  three committed invocations were): they are kept, with a note.

Prints, per sweep, the cells before and after, the new cells and the replay files checked, and a note where the
session ran under another config than the committed sweep records (the top-level keys that differ). ``--dry-run``
checks and prints without copying. Stdlib only, Python 3.11.4 or later (tarfile's ``data`` filter):
``python3 gpu/integrate.py /work/.device/7``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = {".run", ".engines", ".sweep.lock", ".sweep.lease", "logs"}
CELL_FOLDER = "runs"  # one file per done cell (the sweep store's index of done cells)


def unpack(src: Path, into: Path) -> Path:
    """The results folder of SRC: SRC itself when it holds sweeps, else its ``res.tgz.part*`` joined and unpacked."""
    parts = sorted(src.glob("res.tgz.part*"), key=lambda p: int(p.name.removeprefix("res.tgz.part") or 0))
    if not parts:
        if any((d / "provenance.json").is_file() for d in src.iterdir() if d.is_dir()):
            return src
        raise SystemExit(f"integrate: {src} has no res.tgz.part* and no sweep folder")
    joined = into / "res.tgz"
    with joined.open("wb") as out:
        for p in parts:
            out.write(p.read_bytes())
    dest = into / "res"
    dest.mkdir()
    with tarfile.open(joined) as tar:
        tar.extractall(dest, filter="data")
    return dest


def is_temp(name: str) -> bool:
    """A store's half-written file (what session.sh leaves out of res.tgz: ``.*.parquet.*``, ``.*.json.*``)."""
    return name.startswith(".") and (".parquet." in name or ".json." in name)


def cell_ids(sweep: Path) -> set[str]:
    folder = sweep / CELL_FOLDER
    return {p.name.removesuffix(".parquet") for p in folder.glob("*.parquet")} if folder.is_dir() else set()


def inexact_replays(sweep: Path) -> tuple[int, list[str]]:
    files = sorted((sweep / "replay").glob("*.json")) if (sweep / "replay").is_dir() else []
    bad = [f.name for f in files if json.loads(f.read_text()).get("exact") is not True]
    return len(files), bad


def changed_files(sweep: Path, have: Path) -> list[str]:
    """Files of the session's copy that the committed sweep also has, with other contents (provenance.json aside:
    it grows by design). A carried-back cell comes back byte for byte."""
    out = []
    for f in sorted(sweep.rglob("*")):
        rel = f.relative_to(sweep)
        if not f.is_file() or rel.parts[0] in RUNTIME or is_temp(f.name) or rel == Path("provenance.json"):
            continue
        old = have / rel
        if old.is_file() and old.read_bytes() != f.read_bytes():
            out.append(str(rel))
    return out


def empty_tail(invocations: list[dict]) -> int:
    """How many invocations at the end of a list recorded no engine and no finished cell."""
    n = 0
    for inv in reversed(invocations):
        if inv.get("engines") or inv.get("cells_done"):
            break
        n += 1
    return n


def config_changes(committed: dict, session: dict | None) -> list[str]:
    """The top-level keys of a sweep's recorded config (provenance ``config``) whose values differ between the
    committed sweep and the session's copy, sorted; [] where they agree."""
    session = session or {}
    return sorted(k for k in set(committed) | set(session) if committed.get(k) != session.get(k))


def check(sweep: Path, have: Path, drop_empty: bool) -> tuple[list[str], list[str], dict | None]:
    """(problems, report lines, the provenance to write when its empty tail is dropped, else None)."""
    problems, lines, new_prov = [], [], None
    n_replay, bad = inexact_replays(sweep)
    if bad:
        problems.append(f"{sweep.name}: {len(bad)} of {n_replay} replay files not exact, e.g. {bad[0]}")
    incoming, before = cell_ids(sweep), cell_ids(have)
    changed = changed_files(sweep, have)
    if changed:
        problems.append(f"{sweep.name}: {len(changed)} file(s) the sweep already has come back with other contents, "
                        f"e.g. {changed[0]}")
    prov_path, had_path = sweep / "provenance.json", have / "provenance.json"
    prov = json.loads(prov_path.read_text()) if prov_path.is_file() else None
    had_prov = json.loads(had_path.read_text()) if had_path.is_file() else {}
    had = had_prov.get("invocations", [])
    if prov and "config" in had_prov and (moved := config_changes(had_prov["config"], prov.get("config"))):
        lines.append(f"  note: the session ran under another config than the committed one ({', '.join(moved)} "
                     "differ): the sweep's tables keep only the cells of the config it records now")
    invs = prov.get("invocations", []) if prov else []
    if prov is None:
        problems.append(f"{sweep.name}: no provenance.json")
    elif invs[:len(had)] != had:
        problems.append(f"{sweep.name}: the session's provenance does not begin with the {len(had)} committed "
                        "invocation(s); copying it would rewrite the sweep's history")
    elif (tail := empty_tail(invs[len(had):])):  # the session's own invocations only
        finished = sum(inv.get("cells_done") or 0 for inv in invs[len(had):len(invs) - tail])
        if len(incoming - before) > finished:  # they ran cells, but were cut before writing their engines
            lines.append(f"  note: the last {tail} invocation(s) recorded no engine, yet the session brought "
                         f"{len(incoming - before) - finished} cell(s) more than the others finished: a job cut "
                         "before it wrote its provenance; kept")
        elif drop_empty:
            invs = invs[:len(invs) - tail]
            new_prov = dict(prov, invocations=invs)
            lines.append(f"  dropped {tail} trailing invocation(s) that ran no engine and finished no cell")
        else:
            problems.append(f"{sweep.name}: provenance ends in {tail} invocation(s) that ran no engine and finished "
                            "no cell (a stopped queue); take an earlier call's results or pass --drop-empty")
    if len(invs) > len(had) and "finished_at" not in invs[-1]:
        lines.append("  note: the last invocation has no finished_at (its job was still running or was cut): "
                     "its engine start may be half done")
    lines.insert(0, f"{sweep.name}: {len(before)} -> {len(before | incoming)} cells ({len(incoming - before)} new, "
                    f"{len(incoming & before)} carried back); {n_replay} replay files in the session's copy, "
                    f"{n_replay - len(bad)} exact")
    return problems, lines, new_prov


def copy_sweep(sweep: Path, dest: Path, new_prov: dict | None) -> None:
    def ignore(folder, names):
        top = Path(folder) == sweep
        return [n for n in names if (top and n in RUNTIME) or is_temp(n)]
    shutil.copytree(sweep, dest, ignore=ignore, dirs_exist_ok=True)
    if new_prov is not None:
        (dest / "provenance.json").write_text(json.dumps(new_prov, indent=1, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path,
                    help="a folder with res.tgz.part* (a run call's files), or an unpacked results folder")
    ap.add_argument("--into", type=Path, default=ROOT / "data" / "sweeps", help="default: data/sweeps")
    ap.add_argument("--only", action="append", default=[], help="integrate this sweep only (repeatable)")
    ap.add_argument("--drop-empty", action="store_true", help="drop trailing invocations that ran nothing")
    ap.add_argument("--dry-run", action="store_true", help="check and report; copy nothing")
    a = ap.parse_args(argv)
    if not a.src.is_dir():
        raise SystemExit(f"integrate: {a.src} is not a folder")
    with tempfile.TemporaryDirectory() as tmp:
        res = unpack(a.src, Path(tmp))
        sweeps = sorted(d for d in res.iterdir() if d.is_dir() and (not a.only or d.name in a.only))
        if a.only and {s.name for s in sweeps} != set(a.only):
            raise SystemExit(f"integrate: not in the results: {sorted(set(a.only) - {s.name for s in sweeps})}")
        if not sweeps:
            raise SystemExit(f"integrate: no sweep in {a.src}")
        problems, plans = [], []
        for s in sweeps:
            p, lines, new_prov = check(s, a.into / s.name, a.drop_empty)
            problems += p
            plans.append((s, new_prov))
            print("\n".join(lines))
        if problems:
            print("integrate: nothing copied:\n  " + "\n  ".join(problems), file=sys.stderr)
            return 1
        if a.dry_run:
            print("integrate: dry run, nothing copied")
            return 0
        for s, new_prov in plans:
            copy_sweep(s, a.into / s.name, new_prov)
            print(f"integrate: {s.name} -> {a.into / s.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
