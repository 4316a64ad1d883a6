"""Reasoning (edge/reasoning.py): the think block declared by the template, split from the answer as it
streams, and gated so that a grammar holds only after it and a budget is kept. A tiny Qwen3-shaped GGUF
(byte-level BPE with Qwen3's special tokens, Qwen3's real chat template) runs the gate on llama.cpp."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import edge
from edge.errors import ThinkingError
from edge.generate import Generation, GenerationConfig
from edge.grammar import Grammar, compile_grammar
from edge.models.chat_template import ChatTemplate
from edge.reasoning import (
    MAX_GAP,
    ReasoningSplitter,
    Thinking,
    ThinkingConfig,
    ThinkingGate,
    plan_thinking,
    split_reasoning,
)
from tests.tiny_models import TinySpec, write_tiny_model

QWEN3_TEMPLATE = (Path(__file__).parents[1] / "data" / "qwen3_chat_template.jinja").read_text()
USER = [{"role": "user", "content": "hi"}]


def qwen3_spec(**kw: object) -> TinySpec:
    return TinySpec(arch="qwen3", vocab="qwen", chat_template=QWEN3_TEMPLATE, seed=1, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> edge.Model:
    path = write_tiny_model(tmp_path_factory.mktemp("qwen3") / "qwen3-tiny.gguf", qwen3_spec())
    model = edge.load(str(path), backend="llamacpp", n_ctx=1024, n_threads=1, draft="none")
    yield model
    model.close()


# -- the template declares it ----------------------------------------------------------------------
def test_qwen3_template_declares_thinking_and_its_switch() -> None:
    style = ChatTemplate(QWEN3_TEMPLATE).thinking
    assert style is not None and style.switch == "enable_thinking"
    assert ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}").thinking is None


def test_off_writes_qwen3s_empty_block_and_starts_at_the_answer() -> None:
    template = ChatTemplate(QWEN3_TEMPLATE)
    plan = plan_thinking(template.thinking, Thinking(on=False))
    assert plan is not None
    text = template.render(USER, **plan.template_kwargs())
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert plan.config(text).start == "answer"
    on = plan_thinking(template.thinking, None)
    assert on is not None and on.config(template.render(USER, **on.template_kwargs())).start == "either"


def test_a_template_that_always_opens_the_block_starts_thinking() -> None:
    r1 = "{% for m in messages %}{{ m.content }}{% endfor %}<｜Assistant｜><think>\n{# </think> #}"
    template = ChatTemplate(r1)
    plan = plan_thinking(template.thinking, Thinking(on=False))
    assert plan is not None and template.thinking is not None and template.thinking.switch is None
    config = plan.config(template.render(USER))
    assert (config.start, config.budget) == ("thinking", 0)  # off without a switch: the close is forced


@pytest.mark.parametrize("asked", [Thinking(on=True), Thinking(budget=64)])
def test_asking_a_model_that_does_not_think_is_refused(asked: Thinking) -> None:
    with pytest.raises(ThinkingError, match="does not think") as err:
        plan_thinking(None, asked)
    assert err.value.param == "reasoning" and err.value.hint
    assert plan_thinking(None, Thinking(on=False)) is None  # off is what it does anyway


# -- splitting ------------------------------------------------------------------------------------
CORPUS = [
    ("either", "<think>\nLet me see.\n</think>\n\nThe answer.", "Let me see.", "The answer."),
    ("either", "\n<think>a</think>b", "a", "b"),
    ("either", "No think block at all.", "", "No think block at all."),
    ("either", "<think>\ncut short by max_tokens", "cut short by max_tokens", ""),
    ("either", '<think>\n\n</think>\n\n{"a": 1}', "", '{"a": 1}'),
    ("either", "<thinking is not the tag", "", "<thinking is not the tag"),
    # the prompt opened the block (R1 distills) and the model writes the open tag again: not reasoning text
    ("thinking", "<think>\nStep one.</think>Done.", "Step one.", "Done."),
    ("either", "<th", "", "<th"),
    ("either", "<think>a </thi b</think>c", "a </thi b", "c"),
    ("either", "<think>x</think>y <think>z</think>", "x", "y <think>z</think>"),
    ("thinking", "opened by the prompt\n</think>\n\nok", "opened by the prompt", "ok"),
    ("thinking", "never closed  \n", "never closed", ""),
    ("answer", "<think>the prompt closed it</think>", "", "<think>the prompt closed it</think>"),
]


def _chunks(text: str, rng: random.Random) -> list[str]:
    cuts = (
        sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 6))))
        if len(text) > 1
        else []
    )
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


@pytest.mark.parametrize(("start", "text", "reasoning", "content"), CORPUS)
def test_split_whatever_the_pieces(start: str, text: str, reasoning: str, content: str) -> None:
    rng = random.Random(0)
    splits = [[text], list(text), *(_chunks(text, rng) for _ in range(20))]
    for pieces in splits:
        splitter = ReasoningSplitter("<think>", "</think>", start)
        out = [p for piece in pieces for p in splitter.feed(piece)] + splitter.finish()
        got_r = "".join(t for r, t in out if r)
        got_c = "".join(t for r, t in out if not r)
        assert (got_r, got_c) == (reasoning, content), pieces
        assert all(t for _, t in out), "no empty pieces"
        if start != "answer" and "<think>" not in content:
            assert not any("think>" in t for r, t in out if not r), "no tag leaks into content"


def test_split_reasoning_of_a_model_that_does_not_think_is_all_content() -> None:
    assert split_reasoning("<think>x</think>y", None) == ("", "<think>x</think>y")


# -- the gate -------------------------------------------------------------------------------------
def _config(start: str = "either", budget: int | None = None) -> ThinkingConfig:
    return ThinkingConfig("<think>", "</think>", start, budget)


def _ids(model: edge.Model, text: str) -> list[int]:
    return model.tokenizer.encode(text, continues=True)


def test_gate_frees_thinking_then_hands_the_answer_to_the_grammar(qwen3: edge.Model) -> None:
    tok, n = qwen3.tokenizer, qwen3.decoder.vocab_size
    inner = compile_grammar(Grammar.json_schema({"type": "integer"}), tok, n)
    gate = ThinkingGate(_config("thinking"), tok, n, inner)
    brace = _ids(qwen3, "{")[0]
    assert gate.allowed()[brace] and not gate.allowed()[tok.eos_id]  # thinking is free, but must end
    # the close tag spelled in pieces ("</", "th", "ink>") ends the thinking just as its token does
    for t in [*_ids(qwen3, "Hmm. </"), tok.token_to_id("th"), *_ids(qwen3, "ink>")]:
        gate.advance(t)
    assert gate.state.phase == "gap"
    assert gate.allowed()[_ids(qwen3, "\n\n")[0]] and not gate.allowed()[brace]  # whitespace, then the JSON
    for t in _ids(qwen3, "\n\n42"):
        gate.advance(t)
    assert gate.state.phase == "answer" and gate.accepting
    gate.rollback(3)  # back before the gap: the answer's grammar rolled back with it
    assert gate.state.phase == "gap" and not inner.accepting


def test_gate_offers_only_what_it_then_takes_after_the_close(qwen3: edge.Model) -> None:
    """The gap's whitespace is bounded: once the answer's grammar must take the next token, the gate offers
    only what that grammar allows, so a sampled newline never reaches a grammar that refuses it."""
    tok, n = qwen3.tokenizer, qwen3.decoder.vocab_size
    inner = compile_grammar(Grammar.json_schema({"type": "integer"}), tok, n)
    gate = ThinkingGate(_config("thinking"), tok, n, inner)
    for t in _ids(qwen3, "Hmm.</think>"):
        gate.advance(t)
    newline = _ids(qwen3, "\n")[0]
    taken = 0
    while gate.allowed()[newline]:
        gate.advance(newline)  # every offered token is taken without an error
        taken += 1
        assert taken < 10, "the gap must end"
    assert taken == MAX_GAP - 1 and gate.allowed()[_ids(qwen3, "4")[0]]
    assert gate.allowed().sum() == inner.allowed().sum()


def test_gate_refuses_a_token_running_past_the_close_into_the_answer(qwen3: edge.Model) -> None:
    tok, n = qwen3.tokenizer, qwen3.decoder.vocab_size
    gate = ThinkingGate(_config("thinking"), tok, n, None)
    overrun = tok.token_to_id(">{")
    assert overrun is not None and gate.allowed()[overrun]  # harmless mid-thought
    for t in _ids(qwen3, "</think"):
        gate.advance(t)
    assert not gate.allowed()[overrun] and gate.allowed()[_ids(qwen3, ">")[0]]


def test_gate_forces_the_close_when_the_budget_is_spent(qwen3: edge.Model) -> None:
    tok, n = qwen3.tokenizer, qwen3.decoder.vocab_size
    gate = ThinkingGate(_config("either", budget=2), tok, n, None)
    assert gate.forced() == _ids(qwen3, "<think>\n")
    for t in gate.forced() + _ids(qwen3, "ab"):
        gate.advance(t)
    assert gate.forced() == _ids(qwen3, "\n</think>\n\n")
    assert gate.valid_prefix(gate.forced() + _ids(qwen3, "x")) == len(gate.forced()) + 1
    assert gate.state.phase == "force"  # valid_prefix leaves the state as it was


@pytest.mark.parametrize("budget", [0, 3, 12])
def test_generation_keeps_the_budget_and_the_schema_after_it(qwen3: edge.Model, budget: int) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    plan = qwen3.thinking_plan(Thinking(budget=budget))
    assert plan is not None
    text = qwen3.render_chat(USER, thinking=plan)
    thinking = plan.config(text)
    config = GenerationConfig(max_tokens=64, grammar=Grammar.json_schema(schema), thinking=thinking)
    gen = Generation(qwen3.decoder, qwen3.tokenizer, qwen3.encode_prompt(text), config)
    out = gen.run()
    if budget == 0:  # Qwen3's own empty block, as its template writes it for enable_thinking=False
        head = _ids(qwen3, "<think>\n\n</think>\n\n")
    else:  # the open tag, `budget` free tokens (this random model never closes by itself), the close forced
        head = [*_ids(qwen3, "<think>\n"), *gen.token_ids[2 : 2 + budget], *_ids(qwen3, "\n</think>\n\n")]
    assert gen.token_ids[: len(head)] == head
    _, content = split_reasoning(out, thinking)
    assert "think>" not in content and json.loads(content)["ok"] in (True, False)
    assert gen.stats.stop_reason == "grammar"


def test_the_python_api_gives_the_thoughts_apart(qwen3: edge.Model) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "ok", "schema": {"type": "boolean"}}}
    result = qwen3.chat(USER, thinking=Thinking(budget=3), response_format=fmt, max_tokens=32)
    assert result.reasoning and "think>" not in result.reasoning + result.text
    assert json.loads(result.text) in (True, False)
    with qwen3.chat_stream(USER, thinking=Thinking(budget=3), response_format=fmt, max_tokens=32) as stream:
        assert "".join(stream) == result.text
    assert stream.result is not None and stream.result.reasoning == result.reasoning
    off = qwen3.chat(USER, thinking=False, response_format=fmt, max_tokens=8)
    assert off.reasoning == "" and json.loads(off.text) in (True, False)


def test_earlier_thoughts_reach_the_template_from_each_protocol() -> None:
    from edge.server.anthropic import MessagesRequest
    from edge.server.protocol import ChatCompletionRequest
    from edge.server.responses import ResponsesRequest

    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    openai_req = ChatCompletionRequest.model_validate({"model": "m", "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": "plan"},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ]})  # fmt: skip
    anthropic_req = MessagesRequest.model_validate({"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "plan", "signature": ""},
                                          {"type": "tool_use", "id": "c1", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "42"}]},
    ]})  # fmt: skip
    responses_req = ResponsesRequest.model_validate({"model": "m", "input": [
        {"role": "user", "content": "q"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "plan"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
    ]})  # fmt: skip
    template = ChatTemplate(QWEN3_TEMPLATE)
    for messages in (
        openai_req.chat_messages(),
        anthropic_req.to_core().messages,
        responses_req.to_core().messages,
    ):
        assert messages is not None
        # Qwen3 keeps the thoughts of the turns after the last user query (a tool loop in progress)
        assert "<|im_start|>assistant\n<think>\nplan\n</think>\n\n<tool_call>" in template.render(messages)


def test_a_tag_quoted_in_a_message_does_not_open_the_thinking(qwen3: edge.Model) -> None:
    asked = [{"role": "user", "content": "What does <think> mean?"}]
    for on, start in ((True, "either"), (False, "answer")):
        plan = qwen3.thinking_plan(Thinking(on=on))
        assert plan is not None
        config = qwen3.thinking_config(asked, qwen3.render_chat(asked, thinking=plan), None, plan)
        assert config.start == start
