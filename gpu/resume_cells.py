#!/usr/bin/env python3
"""Pack the done cells a GPU queue will resume, to carry them in the call that starts the queue.

The staging calls carry the checkout with most of ``data/`` left out (the 56 MiB stack parts leave about 2 MiB
beside the tree), so a sweep folder travels as its ``provenance.json`` alone. A resumed sweep then finds no done
cell and runs them all again: on 2026-12-06 the H100 re-ran the 32 cells of the headline's start 0 that the tenth
session had measured (data/gpu/h100_v034_2026-12-06b.json). This script writes ``.gpuresume/CARD.tar`` (git-ignored):
for every ``gpu/card_sweep.sh STEM [options]`` job of QUEUE, the files of the done cells of ``data/sweeps/CARD_STEM``
that the job would otherwise run again (those of its ``--blocks`` when it names some, else every done cell), in
whole parts only: a (model, dataset, batch size, engine start, repeat) all of whose cells are done. The powered
analysis pairs arms within such a part (its bootstrap clusters), so a part stays on one machine: one left half
done by a session that ran out (a cut job, an engine start whose provenance was never written) is run again whole.
``python3 gpu/carry.py --resume .gpuresume/CARD.tar`` carries it with the last part and unpacks it before the queue
starts. Needs sdlib's environment (``.venv/bin/python gpu/resume_cells.py ...``).

Usage:
    .venv/bin/python gpu/resume_cells.py gpu/queue_v034_n.txt --card h100
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def queue_jobs(queue: Path) -> list[tuple[str, list[str]]]:
    """(STEM, options) of every ``gpu/card_sweep.sh`` job of a session queue (``name<TAB>limit<TAB>command``)."""
    out = []
    for line in queue.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise SystemExit(f"resume_cells: {queue}: not name<TAB>limit<TAB>command: {line!r}")
        words = shlex.split(fields[2])
        for i, w in enumerate(words):
            if w.endswith("gpu/card_sweep.sh") and i + 1 < len(words):
                out.append((words[i + 1], words[i + 2:]))
                break
    return out


def sweep_blocks(args: list[str]) -> str | None:
    """The ``--blocks`` text of a ``card_sweep.sh`` job's ``sdlib sweep`` options, read by ``sdlib sweep``'s own
    parser (so ``--blocks=v``, a repeated option and an abbreviation mean what they mean there)."""
    import argparse

    from sdlib.commands.sweep import SweepCommand

    parser = argparse.ArgumentParser(add_help=False)
    SweepCommand.add_cli_args(parser)
    ns, _ = parser.parse_known_args(["CONFIG", *args])
    return ns.blocks


def resume_files(stem: str, args: list[str], card: str, root: Path = ROOT) -> tuple[str, int, list[Path]]:
    """(sweep name, done cells carried, their files) of one job: every file of each done cell it would run, in
    whole (model, dataset, batch size, engine start, repeat) parts."""
    from sdlib.config import in_blocks, load_sweep
    from sdlib.run.budget import parse_blocks
    from sdlib.run.plan import done_in_whole_parts
    from sdlib.store import SweepStore

    name = f"{card}_{stem}"
    folder = root / "data" / "sweeps" / name
    if not folder.is_dir():
        return name, 0, []
    store = SweepStore(folder)
    done = store.done_ids()
    cfg = load_sweep(root / "configs" / f"{name}.yaml")
    cells = cfg.cells()
    blocks_text = sweep_blocks(args)
    if blocks_text:
        blocks = {b[:3] for b in parse_blocks(blocks_text, cfg)}  # the whole block: a part's neighbours too
        cells = [c for c in cells if in_blocks(c.part_key, blocks)]
    keep = sorted(done_in_whole_parts(cells, done))
    files = [f for rid in keep for f in store.cell_files(rid)]
    return name, len(keep), files


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("queue", type=Path)
    ap.add_argument("--card", required=True, choices=("h100", "h200"), help="the card the session got (gpu/card.sh)")
    ap.add_argument("--out", type=Path, help="default: .gpuresume/CARD.tar")
    a = ap.parse_args(argv)
    out = a.out or ROOT / ".gpuresume" / f"{a.card}.tar"
    if out.exists():
        out.unlink()
    if not a.queue.is_file():
        print(f"resume_cells: no queue file {a.queue}", file=sys.stderr)
        return 2
    picked: list[Path] = []
    for stem, args in queue_jobs(a.queue):
        name, n, files = resume_files(stem, args, a.card)
        print(f"resume_cells: {name}: {n} done cell(s) to carry, {sum(f.stat().st_size for f in files) / 2**20:.1f} MiB")
        picked += [f for f in files if f not in picked]
    if not picked:
        print("resume_cells: nothing to carry (no done cell that the queue would run again)")
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w") as tar:
        for f in picked:
            tar.add(f, arcname=str(f.relative_to(ROOT)))
    print(f"resume_cells: wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out} "
          f"({out.stat().st_size / 2**20:.1f} MiB, {len(picked)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
