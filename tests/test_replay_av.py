"""The confidences and budget a replay gives vLLM 0.34's adaptive verification (sdlib.vllm.replay.av_confidences,
av_budget).

The sixth H200 session (data/gpu/h200_v034_2026-12-05b.json) lost every replay cell on a K = 10 engine with
``enable_adaptive_verification``: vLLM verified fewer slots than the plans proposed. The engine chooses the
batch's budget from the confidences published a step earlier and hands it out with the current ones. This test
runs that two-buffer pipeline, ported to numpy from vLLM 0.34.0 (``vllm/v1/worker/gpu/spec_decode/
adaptive_verification.py``: ``get_num_tokens`` for vLLM's own budget, ``_assign_draft_token_budget_kernel`` for
the hand-out, ``add_request`` for a new request's reset), over random plans. With :func:`av_confidences` and
:func:`av_budget` every step verifies at least each row's proposal; without either, some steps verify less.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sdlib.vllm.replay import AV_COUNT_ABOVE, AV_PAD, ReplayPlans, _State, av_budget, av_confidences  # noqa: E402

K = 10


def vllm_budget(stale: np.ndarray, verify_cost: np.ndarray, draft_cost: float) -> int:
    """vLLM's ``get_num_tokens``: the number of draft slots the batch verifies, from the stale confidences (every
    row scheduled K drafts and samples)."""
    rows = stale.shape[0]
    scores = np.sort(np.cumprod(stale.astype(np.float64), axis=1).ravel())[::-1]
    accepted = np.concatenate(([rows], rows + np.cumsum(scores)))
    costs = draft_cost + verify_cost[rows:rows + scores.size + 1]
    return int(np.argmax(accepted / costs))


def hand_out(fresh: np.ndarray, b: int) -> np.ndarray:
    """``_assign_draft_token_budget_kernel``: per row, the slots admitted when the ``b`` best running products
    win (ties handed out in request order)."""
    surv = np.cumprod(fresh.astype(np.float32), axis=1)
    if b >= surv.size:
        return np.full(surv.shape[0], surv.shape[1])
    lo = np.sort(surv.ravel())[::-1][b - 1] if b else np.inf
    above = (surv > lo).sum(1)
    tied = (surv == lo).sum(1)
    left = b - above.sum()
    before = np.cumsum(tied) - tied
    return above + np.minimum(tied, np.maximum(left - before, 0))


def bucketed_cost(max_tokens: int) -> np.ndarray:
    """A verify cost table shaped like vLLM's: a step function over CUDA-graph buckets (8, 16, 24, ...)."""
    n = np.arange(max_tokens + 1)
    return 6.0 + 0.02 * (np.ceil(np.maximum(n, 1) / 8.0) * 8.0)


def replay_budget(stale: np.ndarray, verify_cost: np.ndarray, draft_cost: float) -> int:
    return av_budget(stale, np.full(stale.shape[0], K), 1 << 30)


def run(plans: np.ndarray, publish, budget=replay_budget) -> list[np.ndarray]:
    """Verified slots minus proposed drafts per row at every step; ``plans`` (steps, rows) proposed lengths,
    ``publish(d_now, d_next)`` the confidences written with the drafts of ``d_now``, ``budget`` the rule that
    chooses how many slots a step verifies."""
    steps, rows = plans.shape
    cost = bucketed_cost(rows * (K + 1))
    pad = np.zeros((2, rows), dtype=plans.dtype)
    d = np.concatenate([plans, pad])
    pub = {-1: publish(d[0], d[1])}
    stale_first = np.ones((rows, K), dtype=np.float32)  # add_request: a new request's confidences are 1
    out = []
    for s in range(steps):
        stale = stale_first if s == 0 else pub[s - 2]
        admitted = hand_out(pub[s - 1], budget(stale, cost, 1.0))
        out.append(admitted - d[s])
        pub[s] = publish(d[s + 1], d[s + 2])
    return out


def ours(d_now, d_next):
    return av_confidences(torch.as_tensor(d_now), torch.as_tensor(d_next), K).numpy()


def plain(d_now, d_next):
    return (np.arange(K)[None, :] < np.asarray(d_now)[:, None]).astype(np.float32)


def random_plans(seed: int, steps: int = 60, rows: int = 32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # runs of similar lengths with jumps, zeros (no-SD steps) and full K, as the per-step policies propose
    base = rng.integers(0, K + 1, size=(steps, 1))
    return np.clip(base + rng.integers(-3, 4, size=(steps, rows)), 0, K)


def test_counts_rank_and_prefix():
    d_now = torch.tensor([3, 0, 10, 5])
    drafts = np.arange(K)[None, :] < d_now.numpy()[:, None]
    for d_next in (torch.tensor([1, 0, 2, 2]), torch.tensor([8, 7, 10, 9]), torch.tensor([3, 0, 10, 5])):
        c = av_confidences(d_now, d_next, K).numpy()
        surv = np.cumprod(c.astype(np.float32), axis=1)  # as the hand-out kernel multiplies them
        # every draft ranks above every padded slot
        assert surv[drafts].min() > surv[~drafts].max()
        # the slots the budget counts are what the next step needs
        assert int((surv > AV_COUNT_ABOVE).sum()) == int(d_next.sum())
        # each row's counted slots are a prefix
        big = surv > AV_COUNT_ABOVE
        assert (np.diff(big.astype(int), axis=1) <= 0).all()
    # no padding counted when the next step needs no more than is drafted now
    c = av_confidences(d_now, torch.tensor([1, 0, 2, 2]), K).numpy()
    assert (c[~drafts] == AV_PAD).all()


@pytest.mark.parametrize("seed", range(5))
def test_pipeline_verifies_every_proposal(seed):
    plans = random_plans(seed)
    short = [np.minimum(x, 0).sum() for x in run(plans, ours)]
    assert sum(short) == 0, f"slots verified short of the plan at steps {np.flatnonzero(short)}"


def shortfall(publish, budget, seeds=range(5)) -> int:
    return int(sum(np.minimum(x, 0).sum() for s in seeds for x in run(random_plans(s), publish, budget)))


def test_both_parts_are_needed():
    """Without either part some steps verify less than the plan (so the test above can fail): the plain 1 for
    a draft and 0 for padding carry the wrong step's count (the budget reads them a step late), and vLLM's own
    budget leaves out slots before a CUDA-graph bucket's edge."""
    assert shortfall(plain, replay_budget) < 0
    assert shortfall(ours, vllm_budget) < 0


def test_over_verification_is_bounded():
    """What is verified beyond the plan: a request's first step only (vLLM's reset to 1)."""
    extra = [x.clip(min=0).sum() for x in run(random_plans(7, steps=200), ours)]
    assert extra[0] > 0 and sum(extra[1:]) == 0


def closed_loop(seed: int, from_plans: bool, rows: int = 16, requests: int = 48) -> int:
    """Slots verified short of the plans over a closed loop (a finished request's slot takes the next request,
    which prefills one step, then verifies its plan's proposals one a step): vLLM's two buffers, its reset of a
    new request's confidences, :func:`av_confidences` published at every propose; the budget from the stale
    count alone, or raised to the plans' drafts (``_State.av_need``, the host's count)."""
    rng = np.random.default_rng(seed)
    props = [np.clip(rng.integers(0, K + 1) + rng.integers(-3, 4, size=rng.integers(8, 40)), 0, K)
             for _ in range(requests)]
    st = _State(None, "v1", K)
    st.set(ReplayPlans(K, plans={i: (np.arange(p.size), p, np.zeros(p.size, dtype=int)) for i, p in enumerate(props)}))
    owner, step = [None] * rows, [0] * rows  # request in each slot; the plan step its next verification is
    bufs, stale_idx, pending = [np.ones((rows, K), np.float32) for _ in range(2)], 0, []
    fresh, nxt, short = np.ones((rows, K), np.float32), 0, 0

    def d(r, i):
        p = props[owner[r]]
        return int(p[i]) if i < p.size else 0

    while True:
        new = [r for r in range(rows) if owner[r] is None][:requests - nxt]
        for r in new:  # add_request
            owner[r], step[r], nxt = nxt, 0, nxt + 1
            bufs[stale_idx][r] = 1.0
            fresh[r] = 1.0
            pending.append(r)
        active = [r for r in range(rows) if owner[r] is not None]
        if not active:
            return short
        ver = [r for r in active if r not in new]
        if ver:
            sched = np.full(len(ver), K)
            need = st.av_need([f"r{r}@{owner[r]}" for r in ver], sched) if from_plans else 0
            admitted = hand_out(fresh[ver], av_budget(bufs[stale_idx][ver], sched, 1 << 30, need))
            short += int(np.minimum(admitted - np.array([d(r, step[r]) for r in ver]), 0).sum())
            for r in ver:
                step[r] += 1
        fresh[active] = ours([d(r, step[r]) for r in active], [d(r, step[r] + 1) for r in active])
        ready = stale_idx ^ 1  # record_confidences
        bufs[ready][pending] = 1.0
        pending = []
        stale_idx, write = ready, stale_idx
        bufs[write] = fresh.copy()
        for r in active:
            if step[r] >= props[owner[r]].size:
                owner[r] = None


def test_closed_loop_verifies_every_proposal():
    """A request that leaves the batch takes with it the part of the stale count it carried for others (the
    count is spread in column order), so the stale count alone comes short in the closed loop (the seventh
    session's EAGLE-3 cells, data/gpu/h100_v034_2026-12-05.json); raised to the plans' drafts it never does."""
    assert sum(closed_loop(s, from_plans=False) for s in range(4)) < 0
    assert [closed_loop(s, from_plans=True) for s in range(4)] == [0, 0, 0, 0]


def test_av_need_counts_each_requests_steps():
    st = _State(None, "v1", K)
    st.set(ReplayPlans(K, plans={3: (np.array([0, 4, 6]), np.array([5, 2, 7]), np.array([3, 1, 0]))}))
    assert st.av_need(["a@3", "w-1"], [K, K]) == 5 + K  # plan step 0; a request without a plan: what it scheduled
    assert st.av_need(["a@3"], [0]) == 0  # no drafts scheduled (a prefill): not a step
    assert st.av_need(["a@3"], [K]) == 2 and st.av_need(["a@3"], [4]) == 4  # at most what is scheduled
    assert st.av_need(["a@3"], [K]) == K  # past the plan's end
    st.set(st.plans)
    assert st.av_need(["a@3"], [K]) == 5  # a new cell counts from the start


def test_budget_respects_what_is_scheduled():
    stale = np.ones((3, K), dtype=np.float32)
    assert av_budget(stale, np.array([2, 0, 4]), 100) == 6
    assert av_budget(stale, np.array([10, 10, 10]), 7) == 7
    stale[:, 5:] = AV_PAD
    assert av_budget(stale, np.array([10, 10, 10]), 100) == 15
    assert AV_COUNT_ABOVE < 0.999 ** K
    assert av_budget(stale, np.array([10, 10, 10]), 100, need=20) == 20  # raised to the plans' drafts
    assert av_budget(stale, np.array([10, 10, 10]), 18, need=20) == 18
    assert av_budget(stale, np.array([10, 10, 10]), 100, need=3) == 15


def test_the_wrapped_manager_stashes_the_replay_budget():
    """sdlib.vllm.replay._install_av_budget on a stand-in for vLLM 0.34's manager (the attributes it reads):
    the step's token count and the stashed budget are av_budget's, the per-request tables vLLM's."""
    from types import SimpleNamespace

    from sdlib.vllm.replay import _install_av_budget

    stale = np.zeros((4, K), dtype=np.float32)
    stale[0, :3] = 1.0  # request a: 3 counted slots
    stale[2, :5] = 1.0  # request b: 5 counted slots

    class Manager:
        _stale_confidences = [SimpleNamespace(np=stale)]
        _stale_idx = 0
        req_states = SimpleNamespace(req_id_to_index={"a": 0, "b": 2})
        _max_total_logits = 1000
        num_bonus_tokens = 1

        def get_num_tokens(self, num_tokens_per_req, draft_tokens):  # vLLM's rule, here: verify nothing
            per_req = {r: len(draft_tokens[r]) for r in num_tokens_per_req}
            non_draft = {r: num_tokens_per_req[r] - per_req[r] for r in num_tokens_per_req}
            self._batch_budget = (per_req, non_draft, 0)
            return sum(non_draft.values())

    m = Manager()
    _install_av_budget(m)
    n = m.get_num_tokens({"a": 1 + K, "b": 1 + K}, {"a": [0] * K, "b": [0] * K})
    assert m._batch_budget[2] == 8 and n == 2 + 8
    assert m._batch_budget[0] == {"a": K, "b": K}
    with pytest.raises(RuntimeError, match="not 0.34"):
        _install_av_budget(SimpleNamespace(get_num_tokens=None))
