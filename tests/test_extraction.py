import pytest

from sdlib.extract.acceptance import AlignmentError, align, mean_acceptance_length, steps_from_gains


def test_every_step_drafted_detailed():
    # prefill 1 token, then steps gaining 3, 1, 4 tokens; k=3, all steps drafted
    rows = steps_from_gains([1, 3, 1, 4], detailed=([3, 3, 3], [2, 0, 3]))
    assert [(r["step"], r["position"], r["drafted"], r["accepted"]) for r in rows] == [
        (0, 1, 3, 2), (1, 4, 3, 0), (2, 5, 3, 3)]


def test_ngram_undrafted_steps_are_placed():
    # gains after prefill: 1 (no draft), 3 (drafted, 2 acc), 1 (no draft); detailed has one entry
    rows = steps_from_gains([1, 1, 3, 1], detailed=([3], [2]))
    assert [(r["position"], r["drafted"], r["accepted"]) for r in rows] == [(1, 0, 0), (2, 3, 2), (5, 0, 0)]


def test_last_step_truncated_by_max_tokens():
    # last verify accepted 3 (would add 4) but max_tokens cut it to 2 tokens
    rows = steps_from_gains([1, 2, 2], detailed=([3, 3], [1, 3]))
    assert [(r["position"], r["accepted"]) for r in rows] == [(1, 1), (3, 3)]


def test_ambiguous_zero_acceptance_takes_earliest_feasible():
    assert align([1, 1, 3], [0, 2]) == [0, None, 1]
    assert align([1, 1], [0]) == [0, None]


def test_alignment_error_when_inconsistent():
    with pytest.raises(AlignmentError):
        align([1, 4], [1])  # a 4-token step cannot be a 1-accept step nor undrafted
    with pytest.raises(AlignmentError):
        align([2], [1, 1])


def test_delta_source():
    rows = steps_from_gains([1, 3, 1], None, k=3)
    assert [(r["position"], r["drafted"], r["accepted"]) for r in rows] == [(1, 3, 2), (4, 3, 0)]
    rows = steps_from_gains([1, 3, 1], None, k=3, drafter_always_proposes=False)
    assert [r["drafted"] for r in rows] == [None, None]
    assert steps_from_gains([1, 1, 1], None, k=0)[0]["drafted"] == 0


def test_mean_acceptance_length_paper_definition():
    # drafts: 3 (the 0-drafted step does not count); accepted 2+0+3 = 5 -> 1 + 5/3
    assert mean_acceptance_length([3, 0, 3, 3], [2, 0, 0, 3]) == pytest.approx(1 + 5 / 3)


def test_known_draft_steps_pin_the_ambiguous_zero_acceptance_entry():
    # three one-token steps, one zero-acceptance draft: without help the earliest step takes it
    assert align([1, 1, 1], [0]) == [0, None, None]
    # the drafter is known to have proposed at the third step only
    assert align([1, 1, 1], [0], has_draft=[False, False, True]) == [None, None, 0]
    with pytest.raises(AlignmentError):
        align([1, 1, 1], [0], has_draft=[False, False, False])
    with pytest.raises(AlignmentError):
        align([1, 1], [0], has_draft=[True])


def test_steps_from_gains_uses_drafted_positions():
    # prefill gives position 1; steps at positions 1, 2, 3, 4 (the 3rd gains 2 tokens)
    gains = [1, 1, 1, 2, 1]
    detailed = ([3, 3], [0, 1])
    earliest = steps_from_gains(gains, detailed, k=3, drafter_always_proposes=False)
    assert [r["drafted"] for r in earliest] == [3, 0, 3, 0]  # 0-acceptance entry before the 2-gain step
    pinned = steps_from_gains(gains, detailed, k=3, drafter_always_proposes=False,
                              drafted_at=lambda p: p in (2, 3))
    assert [r["position"] for r in pinned] == [1, 2, 3, 5]
    assert [r["drafted"] for r in pinned] == [0, 3, 3, 0]
    assert [r["accepted"] for r in pinned] == [0, 0, 1, 0]
