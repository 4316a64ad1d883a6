"""On a real model (qwen2.5-coder-0.5b, own ORT graph at --precision exact, split into two batch slots):
each request's greedy answer in a batch equals its answer alone, and a conversation re-sent with its history
re-tokenized or edited far back reuses its KV up to the first differing token (docs/api.md's chat example)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

import edge
from edge.model import Model
from edge.session import common_prefix

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("edge_cache")]

MODEL = "qwen2.5-coder-0.5b"
PROMPTS = ["Write a Python function that reverses a string.", "Name three rivers in Europe, one line each."]


@pytest.fixture(scope="module")
def slots(edge_cache: object) -> Iterator[list[Model]]:
    m = edge.load(MODEL, backend="ort", precision="exact", n_ctx=1024, draft="none", parallel=2)
    assert m.batches
    pair = m.slots(2)
    yield pair
    for s in pair:
        s.close()


def test_each_answer_in_a_batch_equals_its_answer_alone(slots: list[Model]) -> None:
    alone = [slots[0].generate(p, max_tokens=48, reuse=False).token_ids for p in PROMPTS]
    engine = slots[0].batch_engine
    assert engine is not None and engine.base.slot_axis  # type: ignore[attr-defined]  # attention per slot
    steps, pieces = engine.steps, engine.pieces
    got: dict[int, list[int]] = {}

    def ask(i: int) -> None:
        got[i] = slots[i].generate(PROMPTS[i], max_tokens=48, reuse=False).token_ids

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert [got[0], got[1]] == alone
    shared = (engine.pieces - pieces) - (engine.steps - steps)  # steps that carried both requests
    assert shared >= 0.8 * min(len(a) for a in alone), (shared, [len(a) for a in alone])


def test_a_resent_conversation_reuses_its_kv_up_to_the_first_difference(slots: list[Model]) -> None:
    m = slots[1]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is a KV cache? Answer in about 120 words."},
    ]
    answer = m.chat(messages, max_tokens=160, reuse=False)
    held = m.session.held
    messages += [
        {"role": "assistant", "content": answer.text},
        {"role": "user", "content": "And why does it help?"},
    ]
    second = m.chat(messages, max_tokens=8)
    ids = second.prompt_ids
    # the history as re-tokenized may differ from the tokens generated: the KV is kept up to the difference
    assert second.stats.n_cached_tokens == common_prefix(held, ids) > len(answer.prompt_ids)

    # an edit ~100 tokens back in the assistant's answer: rolled back to it, not prefilled from scratch
    held = m.session.held
    words = answer.text.split(" ")
    cut = max(1, len(words) - 75)
    messages[2] = {"role": "assistant", "content": " ".join([*words[:cut], "EDITED", *words[cut + 1 :]])}
    third = m.chat(messages, max_tokens=8)
    at = common_prefix(held, third.prompt_ids)
    assert len(third.prompt_ids) - at >= 60  # the difference lies far behind the end
    assert third.stats.n_cached_tokens == at
