"""gpu/traces_h200.sh (traces + confidences per workload on the H200) and the prompt files it carries there.

Fast tier: the script's dry run (every command it would run parses with sdlib's own parser and names real
datasets, methods, dtypes and model folders), its failure handling with a fake ``$PYTHON``, the prompt files
(``sdlib traces --save-prompts`` / ``--prompts``, sdlib.workloads.promptfile) and ``make_traces`` on given
prompts (engine calls replaced). No real run: on the 2-core CPU build a traces run costs about 4 s per
output position plus two engine starts (2026-12-04: 4 sharegpt_summary requests x 32 tokens, 110 EAGLE-3
positions, 486 s, engine starts 177 s and 93 s on a loaded machine), over the engine tier's budget.

Usage:
    .venv/bin/python -m pytest tests/test_traces_h200.py -q -m "not engine"
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sdlib.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "gpu" / "traces_h200.sh"
WORKLOADS = ("sharegpt", "humaneval", "code_edit", "sharegpt_summary")


def run_script(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable,
            "PROMPTS_DIR": str(tmp_path / "prompts"), **env}
    if "OUT_DIR" not in env:
        full.pop("OUT_DIR", None)
    return subprocess.run(["bash", str(SCRIPT)], cwd=REPO_ROOT, env=full, capture_output=True, text=True,
                          timeout=600)


def manifest(tmp_path: Path) -> dict[str, list[str]]:
    lines = (tmp_path / "out" / "traces" / "MANIFEST.txt").read_text().splitlines()
    return {ln.split()[0]: ln.split() for ln in lines if ln.split() and ln.split()[0] in WORKLOADS}


def dry_commands(stdout: str) -> list[list[str]]:
    """The sdlib argv of each ``DRY_RUN: <python> -m sdlib ...`` line."""
    out = []
    for ln in stdout.splitlines():
        if ln.startswith("DRY_RUN: "):
            argv = shlex.split(ln[len("DRY_RUN: "):])
            assert argv[1:3] == ["-m", "sdlib"], argv
            out.append(argv[3:])
    return out


def test_dry_run_commands_parse_and_name_real_things(tmp_path):
    from sdlib.cli import build_parser
    from sdlib.config import DATASETS, DTYPES
    from sdlib.run.traces import METHODS

    r = run_script(tmp_path, DRY_RUN="1")
    assert r.returncode == 0, r.stdout + r.stderr
    cmds = dry_commands(r.stdout)
    assert [c[0] for c in cmds] == ["traces", "confidences"] * 4
    parser = build_parser()
    base = tmp_path / "out" / "traces"
    for wl, (tr, cf) in zip(WORKLOADS, zip(cmds[::2], cmds[1::2])):
        a, b = parser.parse_args(tr), parser.parse_args(cf)  # argparse exits (SystemExit) on a bad flag
        assert a.dataset == wl and a.dataset in DATASETS and a.dtype in DTYPES and a.dtype == "bfloat16"
        assert set(a.methods.split(",")) == {"ngram", "eagle3"} <= set(METHODS)
        assert (a.num_requests, a.max_output_tokens, a.k, a.max_model_len) == (64, 256, 10, 1024)
        assert (REPO_ROOT / a.models / "target" / "config.json").is_file()
        assert (REPO_ROOT / b.models / "eagle3" / "config.json").is_file()
        assert a.out == str(base / wl / "traces.jsonl.gz") and b.traces == a.out and b.k == a.k
        assert b.out == str(base / wl / "confidences.jsonl.gz") and a.prompts is None  # no prompt files here
        assert b.device == "auto"
        assert "--help" not in tr
    m = manifest(tmp_path)
    assert sorted(m) == sorted(WORKLOADS) and all(v[1] == "dry_run" for v in m.values())
    text = (base / "MANIFEST.txt").read_text()
    assert "N_REQ=64 MAX_OUT=256 K=10 METHODS=ngram,eagle3" in text and "commit: " in text


def test_dry_run_overrides_and_prompt_files(tmp_path):
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "sharegpt_summary.jsonl.gz").write_bytes(b"")
    r = run_script(tmp_path, DRY_RUN="1", N_REQ="2", MAX_OUT="8", K="3", WORKLOADS="sharegpt_summary code_edit",
                   OUT_DIR=str(tmp_path / "elsewhere"))
    assert r.returncode == 0, r.stdout + r.stderr
    cmds = dry_commands(r.stdout)
    tr = cmds[0]
    assert tr[tr.index("--num-requests") + 1] == "2" and tr[tr.index("--max-output-tokens") + 1] == "8"
    assert tr[tr.index("--prompts") + 1] == str(tmp_path / "prompts" / "sharegpt_summary.jsonl.gz")
    assert "--prompts" not in cmds[2]  # code_edit: no prompt file, the dataset's own source
    assert (tmp_path / "elsewhere" / "MANIFEST.txt").is_file()
    assert "[traces_h200 +" in r.stdout  # progress lines with elapsed seconds


def test_prepare_dry_run_lists_one_save_prompts_per_workload(tmp_path):
    r = run_script(tmp_path, DRY_RUN="1", PREPARE="1")
    assert r.returncode == 0, r.stderr
    saves = [ln for ln in r.stdout.splitlines() if "--save-prompts" in ln]
    assert len(saves) == 4 and all(f"/{wl}.jsonl.gz" in s for wl, s in zip(WORKLOADS, saves))


def test_a_failed_workload_is_recorded_and_the_next_runs(tmp_path):
    fake = tmp_path / "fakepython"
    fake.write_text('#!/bin/bash\ncase "$*" in\n  *humaneval*) echo boom >&2; exit 3;;\n'
                    '  *sharegpt_summary*traces*) sleep 30;;\nesac\nexit 0\n')
    fake.chmod(0o755)
    r = run_script(tmp_path, PYTHON=str(fake), TIMEOUT_S="1",
                   WORKLOADS="humaneval code_edit sharegpt_summary")
    assert r.returncode == 1, r.stdout + r.stderr
    m = manifest(tmp_path)
    assert m["humaneval"][1] == "failed:traces:rc=3" and m["code_edit"][1] == "ok"
    assert m["sharegpt_summary"][1] == "failed:traces:rc=124:timeout"
    assert "boom" in r.stdout  # the failed step's last log lines
    import tarfile

    base = tmp_path / "out" / "traces"  # PACK (default 1): one archive per workload, the folder removed
    assert sorted(p.name for p in base.iterdir()) == ["MANIFEST.txt", "code_edit.tgz", "humaneval.tgz",
                                                      "sharegpt_summary.tgz"]
    with tarfile.open(base / "humaneval.tgz") as t:
        assert "humaneval/traces.log" in t.getnames()
        assert b"boom" in t.extractfile("humaneval/traces.log").read()


def test_prompt_file_round_trip_and_errors(tmp_path):
    from sdlib.workloads import Prompt, WorkloadError
    from sdlib.workloads.promptfile import read_prompt_file, write_prompt_file

    ps = [Prompt(index=i, dataset="code_edit", source_id=f"s{i}", text="t", prompt_token_ids=[1, 2, i],
                 source="package:x") for i in range(3)]
    path = write_prompt_file(ps, tmp_path / "p.jsonl.gz", {"dataset": "code_edit", "seed": 1})
    back, info = read_prompt_file(path)
    assert info == {"dataset": "code_edit", "seed": 1}
    assert [(p.index, p.source_id, p.prompt_token_ids, p.dataset) for p in back] == \
        [(p.index, p.source_id, p.prompt_token_ids, p.dataset) for p in ps]
    assert path.read_bytes() == write_prompt_file(ps, tmp_path / "q.jsonl.gz", info).read_bytes()
    with pytest.raises(WorkloadError, match="token ids"):
        write_prompt_file([Prompt(0, "code_edit", "a", "t", None)], tmp_path / "r.jsonl.gz", {})
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip")
    for bad, why in ((tmp_path / "none.jsonl.gz", "no file"), (tmp_path / "bad.jsonl.gz", "not a gzip")):
        with pytest.raises(WorkloadError, match=why):
            read_prompt_file(bad)


def test_save_prompts_then_prompts_gives_the_same_requests(tmp_path, monkeypatch):
    """``--save-prompts`` here, ``--prompts`` there: make_traces sees the prompts a direct run samples (engine
    calls replaced by fakes; n-gram only)."""
    from sdlib.cli import main
    from sdlib.run import traces as stage
    from sdlib.sim.traces import read_traces

    pf = tmp_path / "p" / "code_edit.jsonl.gz"
    common = ["traces", "--models", str(REPO_ROOT / "data" / "models"), "--dataset", "code_edit", "--num-requests", "3",
              "--max-output-tokens", "6", "--k", "3", "--max-model-len", "1024"]
    assert main(common + ["--save-prompts", str(pf)]) == 0
    direct = stage.trace_prompts(REPO_ROOT / "data" / "models" / "target", "code_edit", 3, 1024 - 6 - 3 - 4)
    seen = []
    monkeypatch.setattr(stage, "make_engine", lambda *a, **k: object())
    monkeypatch.setattr(stage, "close_engine", lambda llm: None)
    monkeypatch.setattr(stage.vc, "vllm_version", lambda: "fake")

    def greedy(llm, prompts, max_tokens, ignore_eos=False):
        seen.extend(prompts)
        return [([5, 6, 7, 5, 6, 7][:max_tokens], "length") for _ in prompts]

    monkeypatch.setattr(stage, "greedy_outputs", greedy)
    out = tmp_path / "t.jsonl.gz"
    assert main(common + ["--prompts", str(pf), "--methods", "ngram", "--out", str(out)]) == 0
    assert seen == [p.prompt_token_ids for p in direct]
    back = read_traces(out, "code_edit")
    assert back.request_id.tolist() == [f"code_edit-{i}" for i in range(3)]
    prov = json.loads((tmp_path / "t.provenance.json").read_text())
    assert prov["prompts"]["used"] == 3 and prov["prompts"]["dataset"] == "code_edit" and prov["prompts"]["sha256"]
    # a prompt file of another dataset is refused in one line
    assert main([*common[:4], "sharegpt", *common[5:], "--prompts", str(pf), "--out", str(out)]) == 2


def test_confidences_device_auto_is_the_cpu_here():
    """``--device auto`` without a GPU: the CPU (the float32 chain of the default path; one short request)."""
    import torch

    from sdlib.run.confidences import chain_confidences, load_eagle3

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: test_confidences_on_cuda_match_the_cpu covers it")
    m = load_eagle3("@trained", device="auto")
    assert str(m.draft_ids.device) == "cpu" and next(m.target.parameters()).device.type == "cpu"
    conf, acc = chain_confidences(m, list(range(3, 40)), list(range(50, 70)), 4)
    assert len(conf) == len(acc) == 20 and conf[0] == [] and all(0 < p <= 1 for row in conf for p in row)


@pytest.mark.gpu
def test_confidences_on_cuda_match_the_cpu():
    """On the GPU box: the chain on cuda equals the CPU one up to float32 reduction order (same drafts)."""
    from sdlib.run.confidences import chain_confidences, load_eagle3

    prompt, out = list(range(3, 200)), list(range(50, 150))
    c_cpu, a_cpu = chain_confidences(load_eagle3("@trained"), prompt, out, 10)
    c_gpu, a_gpu = chain_confidences(load_eagle3("@trained", device="cuda"), prompt, out, 10)
    assert sum(x == y for x, y in zip(a_cpu, a_gpu)) >= 0.95 * len(a_cpu)  # a near-tie may flip a draft
    close = [abs(x - y) < 1e-3 for r, s in zip(c_cpu, c_gpu) for x, y in zip(r, s)]
    assert sum(close) >= 0.95 * len(close)
