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
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from sdlib.commands.base import Command, UsageError
from sdlib.core.registry import GROUPS, POLICIES, RegistryError, expand_policies
from sdlib.paths import resolve

DESCRIPTION = __doc__.split("\n\n")[0]


def _ints(flag: str, text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag}: {text!r} is not a comma-separated list of integers") from None
    if not vals or min(vals) < 1:
        raise UsageError(f"{flag}: want integers >= 1, got {text!r}")
    return vals


@dataclass
class SimulateCommand(Command):
    """``sdlib simulate --traces T --out CSV``: the policy table (bad input: ``error: <flag>: ...``, exit 2)."""

    parser_name = "simulate"
    parser_help = "simulate per-step policies, baselines and oracle bounds on acceptance traces (CSV)"
    description = DESCRIPTION
    formatter_class = argparse.RawDescriptionHelpFormatter

    traces: str
    out: str
    policies: str = "fixed,oracle,combine,online,baselines"
    batch_sizes: str = "1,8,32,128"
    cost_model: str = "authors_h100_llama8b"
    convention: str = "corrected"
    gaps: Optional[str] = None
    per_request: Optional[str] = None
    predictor: Optional[str] = None
    fit_predictor: bool = False
    save_predictor: Optional[str] = None
    confidences: Optional[str] = None
    datasets: Optional[str] = None
    sample: Optional[int] = None
    #: the command line as typed (``sdlib simulate ...``), recorded as a saved predictor's producer
    command_line: list[str] = field(default_factory=list)

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        # the policy registry (sdlib.sim.policy registers the policies; pandas): imported when this parser is built
        import sdlib.sim.policy  # noqa: F401
        from sdlib.sim.costmodels import cost_model_names
        from sdlib.sim.policy.static import FIXED_KS
        from sdlib.sim.policy.training import REFERENCE_PREDICTOR

        needs_conf = [s.name for s in POLICIES.values() if "confidences" in s.needs]
        plain = [s.name for s in POLICIES.values()
                 if s.simulate and s.plain_refs() and not s.groups and s.name not in needs_conf]
        ep = (f"policies: groups {', '.join(GROUPS)} (fixed = k in {list(FIXED_KS)} for eagle3 and ngram; oracle = "
              f"Oracle Proposal of each; baselines = {', '.join(r.label for r in expand_policies(['baselines']))}); "
              f"policies {', '.join(plain)}; with --confidences {', '.join(needs_conf)}; or one instance as "
              f"fixed-<eagle3|ngram>-k<k>, oracle-<eagle3|ngram>, combine-k<k>. cost models: "
              f"{', '.join(cost_model_names())} (data/costmodels/), or a path. "
              f"Reads traces; writes --out (CSV) and, if given, --gaps, --per-request, --save-predictor.")
        parser.epilog = textwrap.fill(ep, 100, break_on_hyphens=False)
        ap = parser
        ap.add_argument("--traces", required=True, help="'reference' or trace files (comma-separated globs)")
        ap.add_argument("--policies", default="fixed,oracle,combine,online,baselines", help="comma-separated")
        ap.add_argument("--batch-sizes", default="1,8,32,128", help="comma-separated integers >= 1")
        ap.add_argument("--cost-model", default="authors_h100_llama8b", help="comma-separated names or paths")
        ap.add_argument("--convention", default="corrected", help="only 'corrected' (sdlib.sim.oracle.CONVENTIONS)")
        ap.add_argument("--out", required=True, help="policy table, CSV")
        ap.add_argument("--gaps", help="gap-closing table, CSV")
        ap.add_argument("--per-request", help="per-request rows, parquet")
        ap.add_argument("--predictor", help=f"saved predictor JSON (default: {REFERENCE_PREDICTOR} for the "
                                            "reference traces; other traces are cross-fitted)")
        ap.add_argument("--fit-predictor", action="store_true", help="cross-fit the predictor on these traces")
        ap.add_argument("--save-predictor", help="write the predictor used (JSON)")
        ap.add_argument("--confidences", help="draft confidence files of the traces' requests (comma-separated "
                                              "globs; written by sdlib confidences), for " + ", ".join(needs_conf))
        ap.add_argument("--datasets", help="comma-separated subset of the traces' datasets")
        ap.add_argument("--sample", type=int, help="at most this many requests per dataset (seeded)")

    def run(self) -> int:
        # the simulator (pandas): imported only when the command runs
        import sdlib.sim.policy  # noqa: F401  (registers the policies)
        from sdlib.sim.costmodels import CostModelError, load_cost_model
        from sdlib.sim.policy.confidence import ConfidenceError, load_confidences
        from sdlib.sim.policy.table import simulate_policies, summarise
        from sdlib.sim.prepared import prepare_traces, select_requests, truncate_traces
        from sdlib.sim.traces import TraceError, load_traces

        if self.convention != "corrected":
            raise UsageError(f"--convention: only 'corrected' is simulated for per-step policies "
                             f"(got {self.convention!r})")
        batch_sizes = _ints("--batch-sizes", self.batch_sizes)
        try:  # names, data/costmodels/<name>.json, or paths from where the user stands
            cms = [load_cost_model(n.strip(), relative_to=Path.cwd()) for n in self.cost_model.split(",") if n.strip()]
        except CostModelError as e:
            raise UsageError(f"--cost-model: {e}") from None
        if not cms:
            raise UsageError("--cost-model: give at least one")
        try:
            refs = expand_policies([p.strip() for p in self.policies.split(",") if p.strip()])
        except RegistryError as e:
            raise UsageError(f"--policies: {e}") from None
        if not all(r.spec.simulate for r in refs):
            raise UsageError(f"--policies: {[r.label for r in refs if not r.spec.simulate]} are replay-only")
        t0 = time.perf_counter()
        try:
            traces, k = load_traces(self.traces)
        except TraceError as e:
            raise UsageError(f"--traces: {e}") from None
        prep = prepare_traces(traces, ngram_lookup=True, keep_tokens=True)
        if self.datasets or self.sample:
            ds = self.datasets.split(",") if self.datasets else None
            bad = sorted(set(ds or []) - set(prep.dataset))
            if bad:
                raise UsageError(f"--datasets: {bad} not in the traces ({sorted(set(prep.dataset))})")
            prep = select_requests(prep, self.sample, ds)
        prep = truncate_traces(prep, None)
        try:
            confidences = load_confidences(self.confidences, k, None if self.traces == "reference" else self.traces) \
                if self.confidences else None
        except ConfidenceError as e:
            raise UsageError(f"--confidences: {e}") from None
        need_conf = [r.label for r in refs if "confidences" in r.spec.needs]
        if confidences is None and need_conf:
            raise UsageError(f"--confidences: {need_conf} need the requests' draft confidences (sdlib confidences "
                             "writes them)")
        t_load = time.perf_counter() - t0
        predictor = None
        if any("predictor" in r.spec.needs for r in refs):
            predictor = self._predictor(prep, k)
        t1 = time.perf_counter()
        try:
            per_req = simulate_policies(prep, refs, batch_sizes, cms, predictor=predictor, kmax=k,
                                        confidences=confidences)
        except ConfidenceError as e:
            raise UsageError(f"--confidences: {e}") from None
        table, gaps = summarise(per_req)
        out = Path(self.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(out, index=False, float_format="%.6g")
        if self.gaps:
            Path(self.gaps).parent.mkdir(parents=True, exist_ok=True)
            gaps.to_csv(self.gaps, index=False, float_format="%.6g")
        if self.per_request:
            Path(self.per_request).parent.mkdir(parents=True, exist_ok=True)
            per_req.to_parquet(self.per_request, index=False)
        print(f"{out}: {len(table)} rows ({len(refs)} policies, {len(set(prep.dataset))} datasets, "
              f"{len(prep)} requests); load {t_load:.1f} s, simulate {time.perf_counter() - t1:.1f} s")
        return 0

    def _predictor(self, prep, k):
        # deferred: sdlib.sim.policy.features loads pandas, and only this path needs it
        from sdlib.sim.policy.features import add_features
        from sdlib.sim.policy.training import REFERENCE_PREDICTOR, crossfit, load_predictor, save_predictor
        from sdlib.sim.policy.walk import PolicyInputs

        inp = PolicyInputs.of(prep, k)
        add_features(inp)
        if self.predictor:
            p = Path(self.predictor)  # from where the user stands
        elif self.traces == "reference" and not self.fit_predictor:
            p = resolve(REFERENCE_PREDICTOR)
        else:
            p = None
        if p is not None and not self.fit_predictor:
            if not p.exists():
                raise UsageError(f"--predictor: {p} not found (use --fit-predictor to cross-fit on these traces)")
            try:
                pred = load_predictor(p, inp)
            except ValueError as e:
                raise UsageError(f"--predictor: {e}") from None
        else:
            pred = crossfit(inp)
        if self.save_predictor:
            save_predictor(pred, self.save_predictor, list(zip(prep.dataset, prep.request_id)),
                           producer=" ".join(self.command_line) or None)
        return pred
