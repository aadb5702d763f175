"""``sdlib simulate``: every policy family on acceptance traces, batch sizes and cost models -> one CSV.

Reads the authors' trace format (JSONL or .jsonl.gz with ``acc_ngram`` and ``acc_eagle``), ours
(``data/traces/*.jsonl.gz``: dataset and k from the provenance JSON beside each file), or any file in that
format; ``reference`` = the authors' four datasets. Every request runs to the common length of its output and
both acceptance lists (:func:`sdlib.sim.replay.truncate_traces`), under the ``corrected`` convention, so all
policies generate the same tokens. Writes the policy table (:data:`sdlib.sim.policy.table.TABLE_COLUMNS`);
``--gaps`` also the share of the gap (best fixed -> Oracle Combine) each policy closes.

Usage:
    sdlib simulate --traces reference --policies fixed,oracle,combine,online,ngram-eagle \\
        --batch-sizes 1,8,32,128 --cost-model authors_h100_llama8b --convention corrected --out table.csv
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
from pathlib import Path
from typing import Optional

from sdlib.core.registry import GROUPS, POLICIES, RegistryError, expand_policies
from sdlib.sim.policy.confidence import ConfidenceError
from sdlib.sim.policy.static import FIXED_KS

#: The committed, cross-fitted predictor for the reference traces (``--save-predictor`` writes one).
REFERENCE_PREDICTOR = "data/predictors/online_reference.json"
#: Cost models by name: built-in, or a JSON under data/costmodels/.
COST_MODEL_NAMES = ("authors_h100_llama8b", "h200_llama8b", "h200_replay_engine")


class UsageError(ValueError):
    """A bad argument; the message names the flag."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        raise UsageError(message)


def cost_model_of(name: str):
    """A cost model by built-in name, by ``data/costmodels/<name>.json``, or by path (either kind)."""
    from sdlib.paths import DATA_DIR
    from sdlib.sim.costmodel import COST_MODELS
    from sdlib.sim.engine_costs import load_any_cost_model

    if name in COST_MODELS:
        return COST_MODELS[name]
    for p in (DATA_DIR / "costmodels" / f"{name}.json", Path(name)):
        if p.is_file():
            return load_any_cost_model(p)
    raise UsageError(f"--cost-model: {name!r} is neither a known model {list(COST_MODEL_NAMES)} nor a JSON file")


def load_traces(spec: str):
    """(long-form traces, k): ``reference``, or trace files (globs; ours with provenance, else the authors')."""
    import glob

    import pandas as pd

    from sdlib.extract.ngram import TRACE_MAX_K
    from sdlib.sim.traces import REFERENCE_FILES, load_reference_traces, provenance_path, read_trace_file, read_traces

    if spec == "reference":
        return load_reference_traces(), TRACE_MAX_K
    files = sorted({f for pat in spec.split(",") for f in glob.glob(pat)})
    if not files:
        raise UsageError(f"--traces: no file matches {spec!r}")
    stems = {v: k for k, v in REFERENCE_FILES.items()}
    frames, ks = [], []
    for f in files:
        p = Path(f)
        prov = provenance_path(p)
        if prov.exists():
            import json

            info = json.loads(prov.read_text())
            frames.append(read_traces(p.resolve(), info["dataset"]))
            ks.append(int(info.get("k", TRACE_MAX_K)))
        else:
            stem = p.name.split(".")[0]
            frames.append(read_trace_file(p, stems.get(stem, stem)))
            ks.append(TRACE_MAX_K)
    df = pd.concat(frames, ignore_index=True)
    missing = {"ngram", "eagle3"} - set(df["method"])
    if missing:
        raise UsageError(f"--traces: {spec!r} has no {sorted(missing)} acceptance lists (acc_ngram, acc_eagle)")
    return df, min(ks)


def load_confidences(spec: str, k: Optional[int] = None, traces: Optional[str] = None) -> dict:
    """{(dataset, request id): confidence rows} of the files matching ``spec`` (comma-separated globs). With
    ``k`` (the traces' k): each file must score at least k drafts; with ``traces`` (the --traces globs): each
    file must have been made from one of those files as they are now (sha256)."""
    import glob

    from sdlib.models.train.files import sha256
    from sdlib.paths import resolve
    from sdlib.sim.policy.confidence import read_confidences

    files = sorted({f for pat in spec.split(",") for f in glob.glob(pat)})
    if not files:
        raise UsageError(f"--confidences: no file matches {spec!r}")
    shas = {Path(f).resolve(): sha256(Path(f)) for pat in traces.split(",") for f in glob.glob(pat)} if traces else None
    out = {}
    for f in files:
        try:
            ds, rows, prov = read_confidences(f)
        except (OSError, ValueError, KeyError) as e:
            raise UsageError(f"--confidences: {f}: {type(e).__name__}: {e}") from None
        if k is not None and int(prov.get("k") or 0) < k:
            raise UsageError(f"--confidences: {f} scores {prov.get('k')} drafts per position, the traces {k}")
        if shas is not None:
            src = resolve(str(prov.get("traces", ""))).resolve()
            if src not in shas:
                raise UsageError(f"--confidences: {f} was made from {prov.get('traces')!r}, which is not a --traces file")
            if shas[src] != prov.get("traces_sha256"):
                raise UsageError(f"--confidences: {f} was made from {prov.get('traces')!r} as it was then, not as it "
                                 "is now (sha256 differs): rerun sdlib confidences")
        out.update({(ds, rid): conf for rid, conf in rows.items()})
    return out


def build_parser(prog: str = "sdlib simulate") -> argparse.ArgumentParser:
    needs_conf = [s.name for s in POLICIES.values() if "confidences" in s.needs]
    plain = [s.name for s in POLICIES.values() if s.simulate and s.plain_refs() and not s.groups and s.name not in needs_conf]
    ep = (f"policies: groups {', '.join(GROUPS)} (fixed = k in {list(FIXED_KS)} for eagle3 and ngram; oracle = "
          f"Oracle Proposal of each; baselines = {', '.join(r.label for r in expand_policies(['baselines']))}); "
          f"policies {', '.join(plain)}; with --confidences {', '.join(needs_conf)}; or one instance as "
          f"fixed-<eagle3|ngram>-k<k>, oracle-<eagle3|ngram>, combine-k<k>. cost models: "
          f"{', '.join(COST_MODEL_NAMES)} (data/costmodels/), or a path. "
          f"Reads traces; writes --out (CSV) and, if given, --gaps, --per-request, --save-predictor.")
    ap = _Parser(prog=prog, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                 epilog=textwrap.fill(ep, 100, break_on_hyphens=False))
    ap.add_argument("--traces", required=True, help="'reference' or trace files (comma-separated globs)")
    ap.add_argument("--policies", default="fixed,oracle,combine,online,baselines", help="comma-separated")
    ap.add_argument("--batch-sizes", default="1,8,32,128", help="comma-separated integers >= 1")
    ap.add_argument("--cost-model", default="authors_h100_llama8b", help="comma-separated names or paths")
    ap.add_argument("--convention", default="corrected", help="only 'corrected' (sdlib.sim.oracle.CONVENTIONS)")
    ap.add_argument("--out", required=True, help="policy table, CSV")
    ap.add_argument("--gaps", help="gap-closing table, CSV")
    ap.add_argument("--per-request", help="per-request rows, parquet")
    ap.add_argument("--predictor", help=f"saved predictor JSON (default: {REFERENCE_PREDICTOR} for the reference "
                                        "traces; other traces are cross-fitted)")
    ap.add_argument("--fit-predictor", action="store_true", help="cross-fit the predictor on these traces")
    ap.add_argument("--save-predictor", help="write the predictor used (JSON)")
    ap.add_argument("--confidences", help="draft confidence files of the traces' requests (comma-separated globs; "
                                          "written by sdlib confidences), for " +
                    ", ".join(s.name for s in POLICIES.values() if "confidences" in s.needs))
    ap.add_argument("--datasets", help="comma-separated subset of the traces' datasets")
    ap.add_argument("--sample", type=int, help="at most this many requests per dataset (seeded)")
    return ap


def _ints(flag: str, text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag}: {text!r} is not a comma-separated list of integers") from None
    if not vals or min(vals) < 1:
        raise UsageError(f"{flag}: want integers >= 1, got {text!r}")
    return vals


def run(args) -> int:
    from sdlib.sim.prepared import prepare_traces, select_requests
    from sdlib.sim.policy.table import simulate_policies, summarise
    from sdlib.sim.prepared import truncate_traces

    if args.convention != "corrected":
        raise UsageError(f"--convention: only 'corrected' is simulated for per-step policies (got {args.convention!r})")
    batch_sizes = _ints("--batch-sizes", args.batch_sizes)
    cms = [cost_model_of(n.strip()) for n in args.cost_model.split(",") if n.strip()]
    if not cms:
        raise UsageError("--cost-model: give at least one")
    try:
        refs = expand_policies([p.strip() for p in args.policies.split(",") if p.strip()])
    except RegistryError as e:
        raise UsageError(f"--policies: {e}") from None
    if not all(r.spec.simulate for r in refs):
        raise UsageError(f"--policies: {[r.label for r in refs if not r.spec.simulate]} are replay-only")
    t0 = time.perf_counter()
    traces, k = load_traces(args.traces)
    prep = prepare_traces(traces, ngram_lookup=True, keep_tokens=True)
    if args.datasets or args.sample:
        ds = args.datasets.split(",") if args.datasets else None
        bad = sorted(set(ds or []) - set(prep.dataset))
        if bad:
            raise UsageError(f"--datasets: {bad} not in the traces ({sorted(set(prep.dataset))})")
        prep = select_requests(prep, args.sample, ds)
    prep = truncate_traces(prep, None)
    confidences = load_confidences(args.confidences, k, None if args.traces == "reference" else args.traces) \
        if args.confidences else None
    need_conf = [r.label for r in refs if "confidences" in r.spec.needs]
    if confidences is None and need_conf:
        raise UsageError(f"--confidences: {need_conf} need the requests' draft confidences (sdlib confidences "
                         "writes them)")
    t_load = time.perf_counter() - t0
    predictor = None
    if any("predictor" in r.spec.needs for r in refs):
        predictor = _predictor(args, prep, k)
    t1 = time.perf_counter()
    try:
        per_req = simulate_policies(prep, refs, batch_sizes, cms, predictor=predictor, kmax=k, confidences=confidences)
    except ConfidenceError as e:
        raise UsageError(f"--confidences: {e}") from None
    table, gaps = summarise(per_req)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out, index=False, float_format="%.6g")
    if args.gaps:
        Path(args.gaps).parent.mkdir(parents=True, exist_ok=True)
        gaps.to_csv(args.gaps, index=False, float_format="%.6g")
    if args.per_request:
        Path(args.per_request).parent.mkdir(parents=True, exist_ok=True)
        per_req.to_parquet(args.per_request, index=False)
    print(f"{out}: {len(table)} rows ({len(refs)} policies, {len(set(prep.dataset))} datasets, "
          f"{len(prep)} requests); load {t_load:.1f} s, simulate {time.perf_counter() - t1:.1f} s")
    return 0


def _predictor(args, prep, k):
    from sdlib.paths import resolve
    from sdlib.sim.policy.features import add_features
    from sdlib.sim.policy.walk import PolicyInputs
    from sdlib.sim.policy.training import crossfit, load_predictor, save_predictor

    inp = PolicyInputs.of(prep, k)
    add_features(inp)
    if args.predictor:
        p = Path(args.predictor)  # from where the user stands
    elif args.traces == "reference" and not args.fit_predictor:
        p = resolve(REFERENCE_PREDICTOR)
    else:
        p = None
    if p is not None and not args.fit_predictor:
        if not p.exists():
            raise UsageError(f"--predictor: {p} not found (use --fit-predictor to cross-fit on these traces)")
        try:
            pred = load_predictor(p, inp)
        except ValueError as e:
            raise UsageError(f"--predictor: {e}") from None
    else:
        pred = crossfit(inp)
    if args.save_predictor:
        save_predictor(pred, args.save_predictor, list(zip(prep.dataset, prep.request_id)),
                       producer=getattr(args, "command_line", None))
    return pred


def main(argv: Optional[list[str]] = None, prog: str = "sdlib simulate") -> int:
    try:
        args = build_parser(prog).parse_args(argv)
        args.command_line = " ".join([prog, *(sys.argv[1:] if argv is None else argv)])
        return run(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
