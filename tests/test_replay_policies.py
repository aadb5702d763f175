"""Replay plans of every replayable policy (sdlib.sim.replay, through the registry): consistent with the engine
hooks' contract on hand-made traces, and made for every replay cell of configs/h200_online.yaml without an
engine."""

import numpy as np
import pandas as pd
import pytest

from sdlib.config import ConfigError, load_sweep, parse_sweep
from sdlib.sim.prepared import prepare_traces
import sdlib.sim.policy  # noqa: F401  (registers the policies)
from sdlib.core.registry import POLICIES, replay_names, replay_ref, resolve_policy
from sdlib.sim.prepared import truncate_traces
from sdlib.sim.replay import replay_plans, replay_steps


def policy_steps(prep, method, policy, K, batch_size=1):
    return replay_steps(prep, replay_ref(policy, method, K), K, batch_size, method)


def _prep():
    rows = []
    rng = np.random.default_rng(0)
    for rid in range(3):
        prompt = [1, 2, 3, 4, 5, 6, 7, 8] * 2
        out = [1, 2, 3, 4, 5, 6, 9, 9] + rng.integers(10, 20, 16).tolist()
        ng = [1] + rng.integers(1, 6, 23).tolist()
        eg = [1] + rng.integers(1, 8, 23).tolist()
        for m, acc in (("ngram", ng), ("eagle3", eg)):
            rows.append({"dataset": "toy", "request_id": str(rid), "prompt_token_ids": prompt,
                         "output_token_ids": out, "method": m, "acc_len": acc})
    return truncate_traces(prepare_traces(pd.DataFrame(rows), keep_tokens=True), 20)


def _spec(name):
    return POLICIES[name] if name in POLICIES else resolve_policy(name).spec


# every replayable spec and drafter-of-its-own label (the k-below-K labels: tests/test_replay.py)
@pytest.mark.parametrize("policy", [p for p in replay_names() if (p in POLICIES or resolve_policy(p).k is None)
                                    and not {"predictor", "confidences"} & _spec(p).needs])
@pytest.mark.parametrize("K", [2, 5])
def test_plans_follow_the_engine_contract(policy, K):
    prep = _prep()
    for method in _spec(policy).replays_on:
        for B in (1, 8, 128):
            for plan, L in zip(replay_plans(prep, method, policy, K, batch_size=B), prep.output_len):
                assert (plan.proposed <= K).all() and (plan.accepted <= plan.proposed).all()
                # every step starts where the previous one's tokens end; the last one reaches the output's end
                assert plan.pos[0] == 1 and (np.diff(plan.pos) == plan.accepted[:-1] + 1).all()
                assert plan.pos[-1] + plan.accepted[-1] + 1 >= L and sum(plan.gains()) == L


def test_step_policies_and_methods_in_config():
    base = {"name": "x", "models": [{"path": "/m"}], "workloads": [{"dataset": "gsm8k", "source": "reference",
                                                                      "full_traces": True}],
            "batch_sizes": [1], "engine": {"pin_target": True}}
    parse_sweep({**base, "methods": [{"name": "eagle3", "model": "/h", "replay": "online"}]})
    with pytest.raises(ConfigError, match="replay"):
        parse_sweep({**base, "methods": [{"name": "ngram", "replay": "online"}]})


def test_every_cell_of_the_online_config_gets_plans():
    """The plans of h200_online's replay cells, made as the worker makes them (no engine)."""
    from sdlib.run.replay import cell_plans
    from sdlib.workloads import load_prompts, load_trace_table

    sweep = load_sweep("configs/h200_online.yaml")
    cells = [c for c in sweep.cells() if c.method.replay and c.workload.dataset == "instructcoder"]
    assert {c.method.replay for c in cells} >= {"online", "ngram-eagle", "arctic", "sglang-adaptive"}
    wl = cells[0].workload
    prompts, table = load_prompts(wl, None), load_trace_table(wl)
    for c in cells:
        plans, by_index = cell_plans(c, prompts, table)
        K = c.method.num_spec_tokens
        for p in by_index.values():
            assert (p.proposed <= K).all() and sum(p.gains()) == p.output_len
        mixed = c.method.replay in ("online", "online-at-k", "ngram-eagle", "ngram-eagle-long", "arctic", "combine")
        assert (plans.ngram is not None) == (mixed or c.method.name == "ngram")


def test_online_at_k_drafts_k_every_step_and_only_chooses_the_drafter():
    """Priced as vLLM 0.26's EAGLE-3 path charges (K every step), drafting less never pays: every EAGLE-3 step
    drafts K, an n-gram step as far as its continuation reaches (up to K), and no step drafts nothing."""
    from sdlib.sim.policy.walk import EAGLE, NGRAM, NONE, PolicyInputs
    from sdlib.sim.traces import load_reference_traces

    prep = truncate_traces(prepare_traces(load_reference_traces(["instructcoder"]), keep_tokens=True), 128)
    for B in (1, 128):
        st = policy_steps(prep, "eagle3", "online-at-k", K=3, batch_size=B)
        prop = st.n_i - 1
        assert not (st.drafter == NONE).any() and (prop[st.drafter == EAGLE] == 3).all()
        avail = PolicyInputs.of(prep).at("avail", st.req, st.pos)
        ng = st.drafter == NGRAM
        assert ng.any() and (prop[ng] == np.minimum(avail[ng], 3)).all()
        # the per-step-k variant drafts less at bs 128, where the engine model makes short drafts cheap
        st_k = policy_steps(prep, "eagle3", "online", K=3, batch_size=B)
        if B == 128:
            assert (st_k.n_i - 1).mean() < prop.mean()


def test_online_ngram_replays_the_ngram_alone_on_the_ngram_path():
    """The online policy's n-gram-only variant: every step drafts with the n-gram or not at all, never past its
    look-up's continuation nor K; it replays on the n-gram path only, and the ragged FULL-graph config's cells
    get plans as the worker makes them."""
    from sdlib.run.replay import cell_plans
    from sdlib.sim.policy.walk import EAGLE, PolicyInputs
    from sdlib.sim.traces import load_reference_traces
    from sdlib.workloads import load_prompts, load_trace_table

    prep = truncate_traces(prepare_traces(load_reference_traces(["instructcoder"]), keep_tokens=True), 128)
    for B in (1, 128):
        st = policy_steps(prep, "ngram", "online-ngram", K=10, batch_size=B)
        prop = st.n_i - 1
        avail = PolicyInputs.of(prep).at("avail", st.req, st.pos)
        assert not (st.drafter == EAGLE).any() and (prop <= np.minimum(avail, 10)).all() and prop.max() > 3
    with pytest.raises(ValueError, match="replays on"):
        policy_steps(prep, "eagle3", "online-ngram", K=10)
    sweep = load_sweep("configs/h200_ragged_full.yaml")
    cells = [c for c in sweep.cells() if c.method.replay in ("online-ngram", "specdecode-adaptive")
             and c.workload.dataset == "instructcoder"]
    assert len(cells) == 6 and all("replay_inputs" in c.key() for c in cells if c.method.replay == "online-ngram")
    wl = cells[0].workload
    prompts, table = load_prompts(wl, None), load_trace_table(wl)
    for c in cells:
        plans, by_index = cell_plans(c, prompts, table)
        assert plans.ngram is not None and plans.K == 10
        for p in by_index.values():
            assert (p.proposed <= 10).all() and sum(p.gains()) == p.output_len


def test_a_refitted_predictor_gives_the_online_replay_cells_new_run_ids(tmp_path, monkeypatch):
    """The online plans are decided from committed files: a refit must not leave old cells looking done."""
    from sdlib.core.registry import policies_needing
    from sdlib.sim import replay as sim_replay

    sweep = load_sweep("configs/h200_online.yaml")
    before = {c.coordinates: c.run_id for c in sweep.cells()}
    pred = tmp_path / "predictor.json"
    pred.write_text('{"refit": 1}')
    monkeypatch.setattr(sim_replay, "online_inputs",
                        lambda predictor=None: [str(pred), "data/costmodels/h200_replay_engine.json"])
    after = {c.coordinates: c.run_id for c in sweep.cells()}
    changed = {co[1] for co in before if before[co] != after[co]}
    assert changed == {c.method.label for c in sweep.cells() if c.method.replay in policies_needing("engine_files")}
    pred.write_text('{"refit": 22}')  # another size: the digest cache keys on (mtime, size)
    assert {c.coordinates: c.run_id for c in sweep.cells()} != after


def test_every_cell_of_the_policies_on_our_traces_gets_plans():
    """configs/h200_v034_powered_policies_ours.yaml (issue 24 item 4): every replay cell gets plans as the worker
    makes them, each policy's decided from the workload's predictor and confidences, which its run id hashes;
    every plan stays within K and covers the output, and the policies' plans differ."""
    from sdlib.run.replay import cell_plans
    from sdlib.workloads import load_prompts, load_trace_table

    sweep = load_sweep("configs/h200_v034_powered_policies_ours.yaml")
    cells = [c for c in sweep.cells() if c.method.replay and c.start == 0 and c.repeat == 0]
    wl = cells[0].workload
    assert {c.method.replay for c in cells} == {"fixed-eagle3-k4", "online-with-agreement", "online-with-confidence",
                                               "online", "vllm-adaptive-verification"}
    prompts, table = load_prompts(wl, None), load_trace_table(wl)
    assert len(prompts) == 32
    proposed = {}
    for c in cells:
        inputs = c.key().get("replay_inputs", {})
        if c.method.replay.startswith("online"):
            assert "data/predictors/online_ours64.json" in inputs
        if c.method.replay in ("online-with-agreement", "online-with-confidence", "vllm-adaptive-verification"):
            assert "data/traces/confidences/ours64_sharegpt.jsonl.gz" in inputs
        plans, by_index = cell_plans(c, prompts, table)
        K = c.method.num_spec_tokens
        for p in by_index.values():
            assert (p.proposed <= K).all() and sum(p.gains()) == p.output_len
        proposed[c.method.label] = np.concatenate([by_index[i].proposed for i in sorted(by_index)])
    assert len({v.tobytes() for v in proposed.values()}) >= len(proposed) - 1  # only the A/A twin repeats a plan


def test_a_replay_that_decides_from_confidences_needs_them_in_the_workload(tmp_path):
    base = {"name": "x", "models": [{"path": "/m"}], "batch_sizes": [1], "engine": {"pin_target": True},
            "methods": [{"name": "eagle3", "model": "/h", "num_spec_tokens": 10, "replay": "online-with-agreement"}]}
    wl = {"dataset": "sharegpt", "source": "traces", "path": "data/traces/ours64_sharegpt.jsonl.gz", "full_traces": True}
    with pytest.raises(ConfigError, match="confidences"):
        parse_sweep({**base, "workloads": [wl]})
    parse_sweep({**base, "workloads": [{**wl, "confidences": "data/traces/confidences/ours64_sharegpt.jsonl.gz"}]})
    with pytest.raises(ConfigError, match="confidences needs source 'traces'"):
        parse_sweep({**base, "methods": [{"name": "none"}],
                     "workloads": [{"dataset": "gsm8k", "source": "reference", "confidences": "c.jsonl.gz"}]})


def test_a_labelled_replay_hashes_and_needs_what_its_spec_decides_from():
    """A replay named by an instance's label (``vllm-adaptive-verification-k5``) decides from what its spec does:
    its cells' run ids hash the confidences and cost model, and a workload without confidences is a config error."""
    from sdlib.sim import replay as sim_replay

    wl = {"dataset": "sharegpt", "source": "traces", "path": "data/traces/ours64_sharegpt.jsonl.gz",
          "full_traces": True}
    base = {"name": "x", "models": [{"path": "/m"}], "batch_sizes": [1], "engine": {"pin_target": True},
            "methods": [{"name": "eagle3", "model": "/h", "num_spec_tokens": 10,
                         "replay": "vllm-adaptive-verification-k5"}]}
    assert sim_replay.needs_confidences("vllm-adaptive-verification-k5")
    assert sim_replay.needs_engine_files("vllm-adaptive-verification-k5")
    assert not sim_replay.needs_confidences("fixed-ngram-k3") and not sim_replay.needs_engine_files("no-such-policy")
    with pytest.raises(ConfigError, match="confidences"):
        parse_sweep({**base, "workloads": [wl]})
    conf = "data/traces/confidences/ours64_sharegpt.jsonl.gz"
    cell = parse_sweep({**base, "workloads": [{**wl, "confidences": conf}]}).cells()[0]
    assert conf in cell.key()["replay_inputs"]
