"""`Model.warm_up` (what `edge chat` and `edge serve` run right after load): the backend's first-run kernels
once where it has them (OpenVINO), then the template's opening prefilled so the first chat reuses it, with the
sinks that chat asks for, and the same answer as without a warm-up. Real backends on a tiny model."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import edge
from edge.devices.base import WARM_ROWS
from edge.drafters import ModelDrafter
from edge.generate import GenerationConfig
from edge.model import WARM_PIECE, Model
from edge.sampling import SamplingConfig
from edge.session import KVSession, common_prefix
from tests.edge.test_session import Recorder
from tests.near_ties import assert_equal_but_near_ties
from tests.tiny_models import TinySpec, write_tiny_model

# a template with a default system turn, as SmolLM2's and Qwen's have
TEMPLATE = (
    "{% if messages[0].role != 'system' %}<s>system: You are a tiny test model.\n{% endif %}"
    "{% for m in messages %}<s>{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)
NO_SYSTEM = (  # refuses a system message, as Gemma 2's template does
    "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for m in messages %}<s>{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)
QUESTION = [{"role": "user", "content": "hello there"}]
BACKENDS = ["ort", "openvino", "llamacpp"]
GREEDY = GenerationConfig(max_tokens=8, ignore_eos=True, sampling=SamplingConfig(temperature=0.0))


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(
        tmp_path_factory.mktemp("warm") / "tiny.gguf", TinySpec(chat_template=TEMPLATE, seed=1)
    )


def load(path: Path, backend: str) -> Model:
    return edge.load(str(path), backend=backend, n_ctx=256, n_threads=1, precision="exact")


def opening(m: Model, system: str | None = None) -> list[int]:
    """What every first turn shares, from two renders (independent of the warm-up's own probes)."""
    head = [{"role": "system", "content": system}] if system else []
    a = m.chat_ids([*head, {"role": "user", "content": "abc"}])
    b = m.chat_ids([*head, {"role": "user", "content": "XYZ 123"}])
    return a[: common_prefix(a, b)]


def answer(m: Model, messages: list[dict[str, str]]) -> edge.Result:
    return m.chat(messages, GREEDY)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("system", [None, "You are Zorblax, a pirate robot."])
def test_the_first_chat_reuses_the_warmed_opening_and_answers_the_same(
    model_file: Path, edge_cache: Path, backend: str, system: str | None
) -> None:
    head = [{"role": "system", "content": system}] if system else []
    messages = [*head, *QUESTION]
    with load(model_file, backend) as cold:
        expected = answer(cold, messages)
        assert expected.stats.n_cached_tokens == 0
    with load(model_file, backend) as m:
        held = m.warm_up(system)
        assert held > 5 and m.session.held == opening(m, system)[:held]
        assert m.kv_state().position == held
        if m.decoder.capabilities().sinks is not None:  # the ring pins what the chat will keep
            assert m.kv_state().sink >= min(m.system_span(messages), held)
        got = answer(m, messages)
        assert got.stats.n_cached_tokens == held  # the sinks matched: nothing was emptied
        assert_equal_but_near_ties(m.decoder, expected.prompt_ids, expected.token_ids, got.token_ids)


@pytest.mark.parametrize("backend", BACKENDS)
def test_only_openvino_runs_its_first_run_kernels(model_file: Path, edge_cache: Path, backend: str) -> None:
    with load(model_file, backend) as m:
        costs = m.decoder.capabilities().first_run_costs
        assert costs == (backend == "openvino")
        rec = Recorder(m.decoder)
        m.decoder, m.session = rec, KVSession(rec)  # type: ignore[assignment]
        held = m.warm_up()
        want = opening(m)
        if costs:  # a many-row and a one-row forward, forgotten, then the opening
            assert len(rec.fed) == WARM_ROWS + 1 + held and rec.fed[WARM_ROWS] == rec.fed[0]
            assert ("reset", 0) in rec.events
        else:  # nothing but the opening
            assert len(rec.fed) == held
        assert held > 5 and rec.fed[-held:] == want[:held] and m.kv_state().position == held


def test_a_model_in_use_is_left_alone(model_file: Path, edge_cache: Path) -> None:
    with load(model_file, "ort") as m:
        first = answer(m, QUESTION)
        before = m.kv_state().position
        assert m.warm_up() == 0 and m.kv_state().position == before
        follow = [
            *QUESTION,
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": "more"},
        ]
        assert answer(m, follow).stats.n_cached_tokens > 0  # the conversation's KV is still there


def test_a_template_that_refuses_the_system_prompt_warms_nothing(tmp_path: Path, edge_cache: Path) -> None:
    path = write_tiny_model(tmp_path / "nosys.gguf", TinySpec(chat_template=NO_SYSTEM, seed=1))
    with load(path, "openvino") as m:
        assert m.warm_up("be brief") == 0  # the template raised: logged, not raised
        assert m.kv_state().position == 0
        assert m.warm_up() > 0  # without a system prompt it renders
        assert answer(m, QUESTION).stats.n_cached_tokens > 0


def test_a_model_without_a_template_has_no_opening_to_prefill(tmp_path: Path, edge_cache: Path) -> None:
    path = write_tiny_model(tmp_path / "base.gguf", TinySpec(seed=1))
    with load(path, "openvino") as m:
        assert not m.has_chat_template
        held = m.warm_up()  # at most BOS and what every text starts with; never a template's
        assert held == m.kv_state().position and m.session.held == opening(m)[:held] and held <= 3
        got = answer(m, QUESTION)
        assert got.stats.n_cached_tokens <= held and len(got.token_ids) == 8


def test_a_chat_during_the_warm_up_waits_for_it(model_file: Path, edge_cache: Path) -> None:
    with load(model_file, "openvino") as m:
        held: list[int] = []
        warm = threading.Thread(target=lambda: held.append(m.warm_up()))
        warm.start()
        got = answer(m, QUESTION)  # before, during or after the warm-up: the same answer
        warm.join(30)
        assert not warm.is_alive()
        # the warm-up went first and the chat reused it, or the chat did and the warm-up left it alone
        assert got.stats.n_cached_tokens == held[0]
        with load(model_file, "openvino") as ref:
            want = answer(ref, QUESTION)
        assert_equal_but_near_ties(m.decoder, want.prompt_ids, want.token_ids, got.token_ids)


@pytest.mark.parametrize("how", ["cancel", "close"])
def test_a_warm_up_stops_between_its_forwards(model_file: Path, edge_cache: Path, how: str) -> None:
    """A system prompt long enough for several pieces; the stop comes during the first one: the warm-up ends
    after it, holding what it fed (cancel), or the model closes once that forward returns (close)."""
    system = " ".join(f"rule {i}: answer briefly." for i in range(20))
    m = edge.load(str(model_file), backend="ort", n_ctx=4096, n_threads=1, precision="exact")
    rec = Recorder(m.decoder)
    m.decoder, m.session = rec, KVSession(rec)  # type: ignore[assignment]
    stop, closer = threading.Event(), threading.Thread(target=m.close)
    inner = rec.forward

    def forward(tokens, *, last_only=False):  # type: ignore[no-untyped-def]
        out = inner(tokens, last_only=last_only)
        if how == "cancel":
            stop.set()
        elif not closer.is_alive():
            closer.start()  # close() from another thread while the warm-up holds the model
            closer.join(0.2)  # it waits for the warm-up
            assert closer.is_alive()
        return out

    rec.forward = forward  # type: ignore[method-assign]
    total = len(opening(m, system))
    assert WARM_PIECE + 2 < total < m.decoder.n_ctx // 2  # several pieces, and not too long to warm
    held = m.warm_up(system, cancel=stop)
    if how == "cancel":
        assert held == WARM_PIECE == m.kv_state().position  # one piece fed, then stopped
        assert m.session.held == opening(m, system)[:held]
        m.close()
    else:
        closer.join(30)
        assert not closer.is_alive() and held == WARM_PIECE  # the model closed after that one piece
        assert m.warm_up() == 0  # closed


def test_a_draft_model_holds_the_opening_too(model_file: Path, edge_cache: Path) -> None:
    with edge.load(str(model_file), backend="openvino", n_ctx=256, n_threads=1, draft=str(model_file)) as m:
        assert m.speculative is not None
        (drafter,) = [d for d in m.speculative.drafters if isinstance(d, ModelDrafter)]
        held = m.warm_up()
        assert held > 5 and drafter.decoder.position == held  # type: ignore[attr-defined]
        with edge.load(str(model_file), backend="openvino", n_ctx=256, n_threads=1, draft="none") as ref:
            want = answer(ref, QUESTION)
        got = answer(m, QUESTION)  # greedy speculative decoding on the warmed pair: the target's tokens
        assert got.stats.n_cached_tokens == held
        assert_equal_but_near_ties(ref.decoder, want.prompt_ids, want.token_ids, got.token_ids)
