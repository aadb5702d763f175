"""Command line: ``python -m sdlib <command>`` (or ``sdlib <command>`` once installed).

Usage:
    python -m sdlib models                                   # build the embedded tiny models (seconds)
    python -m sdlib sweep configs/embedded_default.yaml      # run (or resume) a sweep
    python -m sdlib validate configs/embedded_default.yaml   # check a config, start nothing
    python -m sdlib status configs/embedded_default.yaml     # cells done / failed / to do
"""

from __future__ import annotations

import argparse
import sys

from sdlib.config import ConfigError, load_sweep


def _models(args) -> int:
    from sdlib.paths import MODELS_DIR
    from sdlib.tinymodels import build_models

    paths = build_models(MODELS_DIR, seed=args.seed, force=args.force)
    for k, v in paths.items():
        print(f"{k}: {v}")
    return 0


def _sweep(args) -> int:
    from sdlib.sweep import run_sweep

    overrides = {"results_dir": args.results_dir} if args.results_dir else None
    sweep = load_sweep(args.config, overrides)
    store = run_sweep(sweep, retry_failed=not args.skip_failed, only_methods=args.method)
    return 1 if (args.strict and len(store.failures())) else 0


def _validate(args) -> int:
    from sdlib.sweep import check_paths

    sweep = load_sweep(args.config)
    check_paths(sweep)
    print(f"{args.config}: ok, {len(sweep.cells())} cells")
    return 0


def _status(args) -> int:
    from sdlib.storage import SweepStore

    sweep = load_sweep(args.config)
    store = SweepStore(sweep.out_dir)
    done, failed = store.done_ids(), set(store.failures().get("run_id", []))
    cells = sweep.cells()
    todo = [c for c in cells if c.run_id not in done]
    print(f"{sweep.name}: {len(cells)} cells, {len(cells) - len(todo)} done, {len(failed)} failed, {len(todo)} to do")
    for c in todo:
        print(("FAILED " if c.run_id in failed else "todo   ") + c.run_id)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="sdlib", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("models", help="build the embedded tiny models into .cache/models")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--force", action="store_true", help="rebuild even if present")
    m.set_defaults(func=_models)
    s = sub.add_parser("sweep", help="run or resume a sweep")
    s.add_argument("config")
    s.add_argument("--results-dir", help="override the config's results_dir")
    s.add_argument("--method", action="append", help="only this method label or name (repeatable)")
    s.add_argument("--skip-failed", action="store_true", help="do not retry cells that failed before")
    s.add_argument("--strict", action="store_true", help="exit 1 if any cell failed")
    s.set_defaults(func=_sweep)
    v = sub.add_parser("validate", help="validate a config and its paths; start nothing")
    v.add_argument("config")
    v.set_defaults(func=_validate)
    st = sub.add_parser("status", help="show done / failed / remaining cells")
    st.add_argument("config")
    st.set_defaults(func=_status)
    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
