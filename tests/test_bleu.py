"""sdlib.analysis.bleu: BLEU-4 worked by hand, cross-checked with sacrebleu; bins; direction; template stripping."""

import math

import pandas as pd
import pytest
import sacrebleu

from sdlib.analysis.bleu import (binned_relative_speedup, bleu4, bleu_bins, llama3_user_content, measured_bleu_runs,
                        prompt_output_bleu)


def test_identical_is_one():
    assert bleu4("a b c d e f", "a b c d e f") == pytest.approx(1.0)
    assert bleu4([5, 6, 7, 8, 9], [5, 6, 7, 8, 9]) == pytest.approx(1.0)


def test_disjoint_is_zero():
    # no unigram matches: nltk returns 0 even with method1 smoothing (it checks unigram matches first)
    assert bleu4("a b c d", "w x y z") == 0.0
    assert bleu4([1, 2, 3, 4], [5, 6, 7, 8]) == 0.0


def test_smoothed_by_hand():
    # hyp "a b x d e" vs ref "a b c d e": p1 = 4/5, p2 = 2/4, p3 = 0/3 -> 0.1/3, p4 = 0/2 -> 0.1/2; BP = 1
    expect = math.exp(0.25 * (math.log(0.8) + math.log(0.5) + math.log(0.1 / 3) + math.log(0.1 / 2)))
    assert bleu4("a b c d e", "a b x d e") == pytest.approx(expect)
    # no smoothing: an order without matches -> 0 (nltk returns a float underflow, ~1e-154)
    assert bleu4("a b c d e", "a b x d e", smoothing=None) == pytest.approx(0.0, abs=1e-100)


@pytest.mark.parametrize("ref,hyp", [
    ("the cat sat on the mat and then the cat slept", "the cat sat on a mat and the cat slept there"),
    ("def f ( x ) : return x + 1", "def f ( x ) : return x + 2"),
    ("a b c d e", "a b x d e"),  # orders 3 and 4 smoothed: nltk method1 == sacrebleu floor 0.1
    ("one two three four five six seven eight", "one two three four"),  # brevity penalty
])
def test_matches_sacrebleu(ref, hyp):
    sb = sacrebleu.sentence_bleu(hyp, [ref], tokenize="none", smooth_method="floor", smooth_value=0.1).score / 100
    assert bleu4(ref, hyp) == pytest.approx(sb, abs=1e-6)


def test_direction_prompt_is_reference():
    # output = first 5 of 10 prompt tokens: every output n-gram is in the prompt (precisions 1),
    # brevity penalty exp(1 - 10/5) because the hypothesis (output) is the shorter one
    prompt, output = list(range(100, 110)), list(range(100, 105))
    tr = pd.DataFrame([{"dataset": "d", "request_id": "r", "prompt_token_ids": prompt, "output_token_ids": output,
                        "method": m, "acc_len": [1] * 5} for m in ("ngram", "eagle3")])
    b = prompt_output_bleu(tr, llama3_template=False)
    assert len(b) == 1 and b.bleu4.item() == pytest.approx(math.exp(-1))


def test_llama3_user_content():
    ids = [128000, 128006, 9125, 128007, 271, 11, 12, 128009, 128006, 882, 128007, 271, 21, 22, 23, 128009,
           128006, 78191, 128007, 271]
    assert llama3_user_content(ids) == [21, 22, 23]
    assert llama3_user_content([128000, 5, 6]) == [5, 6]


def test_bins():
    v = [0.0, 0.19, 0.2, 0.59, 0.6, 0.999, 1.0]
    b = bleu_bins(v)
    assert list(b) == ["0.0-0.2", "0.0-0.2", "0.2-0.4", "0.4-0.6", "0.6-0.8", "0.8-1.0", "0.8-1.0"]
    assert list(b.categories) == ["0.0-0.2", "0.2-0.4", "0.4-0.6", "0.6-0.8", "0.8-1.0"]
    assert len(bleu_bins([0.5], width=0.1).categories) == 10


def test_binned_relative_speedup():
    per = pd.DataFrame({"dataset": "d", "request_id": ["a", "b", "a", "b"], "label": ["e", "e", "n", "n"],
                        "sd_tok_per_s": [100.0, 100.0, 50.0, 300.0]})
    bl = pd.DataFrame({"dataset": "d", "request_id": ["a", "b"], "bleu4": [0.1, 0.9]})
    out = binned_relative_speedup(per, bl, reference_label="e").set_index("bin")
    assert out.loc["0.0-0.2", "relative_speedup"] == pytest.approx(-0.5)
    assert out.loc["0.8-1.0", "relative_speedup"] == pytest.approx(2.0)


def test_measured_none(tmp_path):
    rows, why = measured_bleu_runs([tmp_path])
    assert rows.empty and "no sweep" in why


def test_binned_relative_speedup_pairs_requests_and_gives_an_interval():
    # bin 0.0-0.2: n-gram is exactly 2x EAGLE-3 on every request -> the paired interval is [+100%, +100%]
    per = pd.DataFrame({"dataset": "d", "request_id": list("abcab"), "label": ["e", "e", "e", "n", "n"],
                        "sd_tok_per_s": [10.0, 20.0, 40.0, 20.0, 40.0]})
    bl = pd.DataFrame({"dataset": "d", "request_id": list("abc"), "bleu4": [0.1, 0.1, 0.1]})
    out = binned_relative_speedup(per, bl, reference_label="e").iloc[0]
    assert out.num_requests == 2  # request c has no n-gram row: not paired, left out
    assert out.relative_speedup == pytest.approx(1.0)
    assert [out.relative_speedup_lo, out.relative_speedup_hi] == pytest.approx([1.0, 1.0])


def test_measured_bleu_runs_of_the_embedded_sweep():
    from sdlib.analysis.bleu import measured_relative_speedup

    rows, why = measured_bleu_runs(["data/sweeps/embedded_default", "data/sweeps/h200_llama8b"])
    assert set(rows.sweep) == {"embedded_default"} and "1 sweep" in why  # synthetic acceptance skipped
    assert (rows.bleu4_no_bp >= rows.bleu4 - 1e-12).all()
    mb, ref, bs = measured_relative_speedup(rows, bleu_col="bleu4_no_bp", n_boot=200)
    assert ref == "eagle3-k3" and bs == 1 and set(mb.label) == {"ngram-k3"}  # EAGLE-3, not EAGLE-1
    assert set(mb.dataset) == {"code_edit", "humaneval", "sharegpt"}
    assert (mb.pale == (mb.num_requests < 5)).all()
    assert mb.groupby("dataset").num_requests.sum().tolist() == [24, 24, 24]
