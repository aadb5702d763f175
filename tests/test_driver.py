import pytest

from sdlib.run.driver import drive
from tests.conftest import FakePrompt


def _prompts(lens):
    return [FakePrompt(index=i, prompt_token_ids=[0] * n) for i, n in enumerate(lens)]


def test_closed_loop_keeps_b_in_flight_and_window(fake_engine):
    # 4 requests (prompt lengths 1..4 pick scripts), B=2; each step takes 1.0 "s"
    eng = fake_engine(scripts={1: [1, 1, 1], 2: [1, 1], 3: [1, 1, 1, 1], 4: [1, 1]})
    res = drive(eng, _prompts([1, 2, 3, 4]), 2, lambda p: None, clock=eng.clock)
    # admissions: r0,r1 at t=0; r1 finishes at step 2 -> r2 admitted at t=2; r0 finishes step 3 -> r3 at t=3
    assert [rid for _, rid in eng.added] == ["r0", "r1", "r2", "r3"]
    assert [t for t, _ in eng.added] == [0.0, 0.0, 2.0, 3.0]
    recs = {r.request_id: r for r in res.requests}
    assert recs["r2"].arrival_s == 2.0 and recs["r2"].finish_s == 6.0
    assert recs["r2"].first_token_s == 3.0
    # window: from first step after both initial requests' first token (t=1 -> step 1)
    # to the last step that started with 2 in flight (step 4: r2,r3 live; r3 finishes at t=5)
    win = [s.engine_step for s in res.steps if s.in_window]
    assert win == [1, 2, 3, 4]
    assert res.window_s == pytest.approx(4.0)
    assert res.window_output_tokens == 2 + 2 + 2 + 2
    assert res.tok_per_s == pytest.approx(2.0)
    assert res.wall_s == pytest.approx(6.0)
    # context tokens at the start of step 0: prompts 1 + 2
    assert res.steps[0].num_context_tokens == 3


def test_too_few_requests_window_is_whole_run(fake_engine):
    eng = fake_engine(scripts={1: [1, 1]})
    res = drive(eng, _prompts([1]), 4, lambda p: None, clock=eng.clock)
    assert all(s.in_window for s in res.steps)
    assert res.window_s == pytest.approx(res.wall_s)


def test_paper_mode_mean_of_batch_rates(fake_engine):
    # prompt 0: 2 copies x 2 tokens in 2 steps -> 2 tok/s; prompt 1: 2 copies x 4 tokens in 4 steps -> 2 tok/s
    eng = fake_engine(scripts={1: [1, 1], 2: [1, 1, 1, 1]})
    res = drive(eng, _prompts([1, 2]), 2, lambda p: None, mode="paper", clock=eng.clock)
    assert len(res.requests) == 4
    assert res.tok_per_s == pytest.approx(2.0)
    assert res.window_output_tokens == 12 and res.window_s == pytest.approx(6.0)
    assert {r.batch_index for r in res.requests} == {0, 1}


def test_gains_and_detailed_recorded(fake_engine):
    eng = fake_engine(scripts={1: [1, 3, 2]}, detailed={1: ([3, 3], [2, 1])})
    res = drive(eng, _prompts([1]), 1, lambda p: None, clock=eng.clock,
                spec_metrics=lambda c: (c.spec_decode_metrics.per_step_drafted, c.spec_decode_metrics.per_step_accepted)
                if c.spec_decode_metrics else None)
    r = res.requests[0]
    assert r.gains == [1, 3, 2] and r.token_ids == list(range(6))
    assert r.detailed == ([3, 3], [2, 1])


def test_bad_args(fake_engine):
    with pytest.raises(ValueError):
        drive(fake_engine(scripts={}), [], 0, lambda p: None)
    with pytest.raises(ValueError, match="mode"):
        drive(fake_engine(scripts={}), [], 1, lambda p: None, mode="open")
