"""Speed of the whole policy table: four reference datasets, every policy and baseline, four batch sizes, two
cost models (the authors' H100 fit and our H200 fit), with the committed predictor; then the policies that
need draft confidences (``online-with-confidence``, ``online-with-agreement``, ``vllm-adaptive-verification``) beside EAGLE-3's fixed k and
Oracle Proposal on the embedded traces, which have them (the reference traces do not). Prints the time of each
stage and the total; not a test (issue #13 asks for under 30 s on a 2-core CPU). The suffix arrays of Arctic's
rule are cached in .cache/sim/ after the first run (``--cold`` recomputes them and reports that time apart).

Usage:
    python benchmarks/policy_table.py [--cost-models authors_h100_llama8b,h200_llama8b] [--cold]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cost-models", default="authors_h100_llama8b,h200_llama8b")
    ap.add_argument("--batch-sizes", default="1,8,32,128")
    ap.add_argument("--cold", action="store_true", help="recompute the cached suffix arrays (reported apart)")
    args = ap.parse_args()

    from sdlib.paths import resolve
    from sdlib.sim.policy.arctic import _cache_path, add_suffix_features
    from sdlib.sim.policy.features import add_features
    from sdlib.sim.prepared import prepare_traces
    from sdlib.sim.policy.walk import PolicyInputs
    from sdlib.core.registry import expand_policies
    from sdlib.sim.costmodels import load_cost_model
    from sdlib.sim.policy.table import simulate_policies, summarise
    from sdlib.sim.prepared import truncate_traces
    from sdlib.sim.traces import load_reference_traces
    from sdlib.sim.policy.training import REFERENCE_PREDICTOR, load_predictor

    times = {}
    t = time.perf_counter()
    traces = load_reference_traces()
    times["read traces"] = time.perf_counter() - t
    t = time.perf_counter()
    prep = truncate_traces(prepare_traces(traces, keep_tokens=True), None)
    inp = PolicyInputs.of(prep)
    times["prepare (n-gram look-up)"] = time.perf_counter() - t
    t = time.perf_counter()
    add_features(inp)
    times["features"] = time.perf_counter() - t
    if args.cold:
        p = _cache_path(inp, 4)
        if p.exists():
            p.unlink()
    t = time.perf_counter()
    add_suffix_features(inp)
    suffix_s = time.perf_counter() - t
    predictor = load_predictor(resolve(REFERENCE_PREDICTOR), inp)
    cms = [load_cost_model(n) for n in args.cost_models.split(",")]
    bs = [int(b) for b in args.batch_sizes.split(",")]
    policies = ["fixed", "oracle", "combine", "online", "online-ablations", "baselines"]
    t = time.perf_counter()
    per_req = simulate_policies(prep, policies, bs, cms, predictor=predictor)
    times["simulate"] = time.perf_counter() - t
    t = time.perf_counter()
    table, gaps = summarise(per_req)
    times["summarise (bootstrap)"] = time.perf_counter() - t
    t = time.perf_counter()
    conf_table = _confidence_policies(bs, cms)
    times["confidences (embedded)"] = time.perf_counter() - t
    n_pol = len(expand_policies(policies)) + len(set(conf_table.policy) - set(table.policy))
    for k, v in times.items():
        print(f"{k:28s} {v:6.1f} s")
    print(f"{'suffix arrays (' + ('cold' if args.cold else 'cached') + ')':28s} {suffix_s:6.1f} s")
    print(f"{'total':28s} {sum(times.values()) + suffix_s:6.1f} s  ({len(prep)} requests, {n_pol} policies, "
          f"{len(bs)} batch sizes, {len(cms)} cost models, {len(table) + len(conf_table)} table rows)")
    return 0


#: The policies that need the requests' draft confidences, and what they are compared with.
CONFIDENCE_POLICIES = ["fixed-eagle3-k3", "fixed-eagle3-k5", "fixed-eagle3-k8", "oracle-eagle3", "online-with-confidence",
                       "online-with-agreement",
                       "vllm-adaptive-verification"]


def _confidence_policies(bs, cms):
    """The policy table of :data:`CONFIDENCE_POLICIES` on the embedded traces with their confidences (the online
    policy's predictor cross-fitted on them, as ``sdlib simulate`` does for traces other than the reference)."""
    import pandas as pd

    from sdlib.paths import resolve
    from sdlib.sim.policy.confidence import load_confidences
    from sdlib.sim.policy.table import simulate_policies, summarise
    from sdlib.sim.prepared import prepare_traces, truncate_traces
    from sdlib.sim.traces import load_traces

    tables = []
    for ds in ("sharegpt", "code_edit"):
        tr, k = load_traces(str(resolve(f"data/traces/embedded_{ds}.jsonl.gz")))
        prep = truncate_traces(prepare_traces(tr, ngram_lookup=True, keep_tokens=True), None)
        conf = load_confidences(str(resolve(f"data/traces/confidences/embedded_{ds}.jsonl.gz")), k)
        per = simulate_policies(prep, CONFIDENCE_POLICIES, bs, cms, kmax=k, confidences=conf)
        tables.append(summarise(per)[0])
    return pd.concat(tables, ignore_index=True)


if __name__ == "__main__":
    sys.exit(main())
