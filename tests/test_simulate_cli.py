"""``sdlib simulate``: one line and exit 2 on bad input, the table's columns on a user's trace file in the
authors' format, and --help listing the policies and cost models."""

import pandas as pd
import pytest

from sdlib.cli import main as sdlib_main
from sdlib.sim.traces import write_trace_file

REQUIRED = ["dataset", "policy", "batch_size", "speedup", "tokens_per_step", "drafted_per_step"]


def _trace_file(tmp_path):
    rows = []
    for rid, (prompt, out, ng, eg) in enumerate([
            ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6, 9, 8], [1, 1, 1, 4, 3, 2, 1, 1], [1, 3, 2, 1, 2, 1, 2, 1]),
            ([7, 8, 9, 7, 8], [9, 7, 8, 9, 1, 2], [1, 1, 2, 1, 1, 1], [1, 2, 1, 3, 2, 1])]):
        for m, acc in (("ngram", ng), ("eagle3", eg)):
            rows.append({"dataset": "mine", "request_id": str(rid), "prompt_token_ids": prompt,
                         "output_token_ids": out, "method": m, "acc_len": acc})
    return write_trace_file(pd.DataFrame(rows), tmp_path / "mine.jsonl")


@pytest.mark.parametrize("args, flag", [
    (["--batch-sizes", "1,x"], "--batch-sizes"), (["--batch-sizes", "0"], "--batch-sizes"),
    (["--policies", "fixed,bogus"], "--policies"), (["--cost-model", "nope"], "--cost-model"),
    (["--convention", "authors"], "--convention"), (["--traces", "no/such/*.jsonl"], "--traces"),
])
def test_bad_arguments_one_line(tmp_path, capsys, args, flag):
    base = {"--traces": str(_trace_file(tmp_path)), "--out": str(tmp_path / "t.csv")}
    for a, v in zip(args[::2], args[1::2]):
        base[a] = v
    argv = ["simulate"] + [x for kv in base.items() for x in kv]
    assert sdlib_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0]


def test_user_trace_file_table(tmp_path):
    out = tmp_path / "t.csv"
    gaps = tmp_path / "g.csv"
    rc = sdlib_main(["simulate", "--traces", str(_trace_file(tmp_path)), "--policies",
                     "fixed,oracle,combine,ngram-eagle,specdecode-adaptive-eagle3,dynamic-sd",
                     "--batch-sizes", "1,8", "--cost-model", "authors_h100_llama8b,h200_replay_engine",
                     "--convention", "corrected", "--out", str(out), "--gaps", str(gaps)])
    assert rc == 0
    t = pd.read_csv(out)
    assert set(REQUIRED) <= set(t.columns)
    assert set(t.dataset) == {"mine"} and set(t.batch_size) == {1, 8}
    assert {"combine", "oracle-eagle3", "fixed-ngram-k20", "ngram-eagle", "dynamic-sd"} <= set(t.policy)
    assert (t.speedup > 0).all() and (t.speedup_lo <= t.speedup).all()
    g = pd.read_csv(gaps)
    assert (g[g.policy == "combine"].gap_share.dropna() == 1).all()


def test_help_lists_policies_and_cost_models(capsys):
    with pytest.raises(SystemExit):
        sdlib_main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in ("fixed", "oracle", "combine", "online", "sglang-adaptive", "arctic", "dynamic-sd", "ngram-eagle",
                 "specdecode-adaptive-eagle3", "authors_h100_llama8b", "h200_llama8b", "h200_replay_engine"):
        assert name in text
