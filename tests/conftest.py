"""Shared test helpers: a fake engine that behaves like vLLM's LLMEngine with DELTA outputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest


@dataclass
class FakePrompt:
    index: int
    prompt_token_ids: list[int]
    max_output_tokens: int | None = None


@dataclass
class FakeEngine:
    """Each request follows a script: the list of token counts each step adds.

    ``scripts[prompt_len]`` -> gains per step (first = prefill). ``detailed[prompt_len]``
    -> (drafted, accepted) attached to the final output. Time advances 1.0 per step.
    """

    scripts: dict[int, list[int]]
    detailed: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict)
    t: float = 0.0
    live: dict = field(default_factory=dict)
    added: list = field(default_factory=list)

    def clock(self) -> float:
        return self.t

    def add_request(self, rid, prompt, params):
        n = len(prompt["prompt_token_ids"])
        self.live[rid] = [n, list(self.scripts[n]), 0]
        self.added.append((self.t, rid))

    def has_unfinished_requests(self):
        return bool(self.live)

    def step(self):
        self.t += 1.0
        outs = []
        for rid, st in list(self.live.items()):
            n, script, made = st
            g = script.pop(0)
            toks = list(range(made, made + g))
            st[2] += g
            fin = not script
            c = SimpleNamespace(token_ids=toks, finish_reason="length" if fin else None,
                                spec_decode_metrics=SimpleNamespace(
                                    per_step_drafted=self.detailed[n][0], per_step_accepted=self.detailed[n][1])
                                if (fin and n in self.detailed) else None)
            outs.append(SimpleNamespace(request_id=rid, outputs=[c], finished=fin))
            if fin:
                del self.live[rid]
        return outs


@pytest.fixture
def fake_engine():
    return FakeEngine
