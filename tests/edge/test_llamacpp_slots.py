"""`Model.slots` on llama.cpp: several chats at once on one model (devices/llamacpp_batch.py), each answering
as it would alone (up to near-ties: llama.cpp's rows round with the batch they ride in), a shared system
prompt's KV taken from a sibling, and a slot's history reused across its own turns."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import edge
from edge.devices.registry import runnable_backends
from edge.devices.step_loop import StepLoop
from edge.generate import GenerationConfig
from edge.sampling import SamplingConfig
from tests.near_ties import assert_equal_but_near_ties
from tests.tiny_models import TinySpec, write_tiny_model

pytestmark = pytest.mark.skipif(
    "llamacpp" not in runnable_backends(), reason="llama-cpp-python not installed"
)

TEMPLATE = (
    "{% for m in messages %}<s>{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)
GREEDY = GenerationConfig(max_tokens=24, ignore_eos=True, sampling=SamplingConfig(temperature=0.0))
SYSTEM = {"role": "system", "content": " ".join(f"rule{i}" for i in range(40))}
CHATS = [[SYSTEM, {"role": "user", "content": "w0"}]] + [
    [{"role": "user", "content": f"w{i} " * 4 * i}] for i in (1, 2)
]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(
        tmp_path_factory.mktemp("lcslots") / "tiny.gguf", TinySpec(chat_template=TEMPLATE, seed=3)
    )


def load(path: Path, parallel: int = 1) -> edge.Model:
    return edge.load(str(path), backend="llamacpp", n_ctx=512, n_threads=1, parallel=parallel)


def test_chats_at_once_answer_as_alone(model_file: Path, edge_cache: Path) -> None:
    with load(model_file) as alone:
        expected = [alone.chat(c, GREEDY) for c in CHATS]
        slots = load(model_file, parallel=3).slots(3)
        engine = slots[0].batch_engine
        assert isinstance(engine, StepLoop)
        engine.linger = 0.2  # a loaded CI machine: the chats' steps still pack
        try:
            got: list[edge.Result | None] = [None] * 3
            threads = [
                threading.Thread(target=lambda i=i: got.__setitem__(i, slots[i].chat(CHATS[i], GREEDY)))
                for i in range(3)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert engine.mean_batch > 1.5  # the chats rode together
            for want, have in zip(expected, got, strict=True):
                assert have is not None and have.prompt_ids == want.prompt_ids
                assert_equal_but_near_ties(alone.decoder, want.prompt_ids, want.token_ids, have.token_ids)
            # a next request on slot 1 with the system prompt slot 0 holds: copied, not computed
            nxt = [SYSTEM, {"role": "user", "content": "w9"}]
            assert slots[1].adopt_prefix(slots[0], slots[1].chat_ids(nxt)) > 20
            again = slots[1].chat(nxt, GREEDY)
            want = alone.chat(nxt, GREEDY)
            assert_equal_but_near_ties(alone.decoder, want.prompt_ids, want.token_ids, again.token_ids)
        finally:
            for s in slots:
                s.close()
