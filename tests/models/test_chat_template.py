"""Chat templates: HF-compatible rendering, and hostile templates stopped with TemplateError."""

from __future__ import annotations

import time

import pytest

from edge.errors import TemplateError
from edge.models.chat_template import ChatTemplate, TemplateLimits, template_from_metadata

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_renders_chatml_with_generation_prompt() -> None:
    t = ChatTemplate(CHATML)
    out = t.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert (
        out
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert t.render([{"role": "user", "content": "Hi"}], add_generation_prompt=False).endswith("<|im_end|>\n")


def test_lenient_undefined_like_transformers() -> None:
    # Qwen's template tests `tools` and `message.tool_calls`, which are absent in a plain chat.
    t = ChatTemplate(
        "{% if tools %}T{% endif %}{% for m in messages %}{{ m.tool_calls is defined }}{% endfor %}"
    )
    assert t.render([{"role": "user", "content": "x"}]) == "False"


def test_bos_and_raise_exception() -> None:
    t = ChatTemplate(
        "{{ bos_token }}{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    )
    assert t.render([{"role": "user", "content": "x"}]) == ""
    t2 = ChatTemplate("{{ bos_token }}x", bos_token="<s>")
    assert t2.render([]) == "<s>x"
    with pytest.raises(TemplateError, match="user first"):
        t.render([{"role": "assistant", "content": "x"}])


def test_metadata_without_template_is_completion() -> None:
    assert template_from_metadata({}) is None
    assert template_from_metadata({"tokenizer.chat_template": "  "}) is None
    with pytest.raises(TemplateError):
        template_from_metadata({"tokenizer.chat_template": 5})


@pytest.mark.parametrize(
    "source",
    [
        "{{ ().__class__.__base__.__subclasses__() }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{% for c in ().__class__.__base__.__subclasses__() %}{% if c.__name__ == 'Popen' %}"
        "{{ c(['touch', '/tmp/edge-pwned']) }}{% endif %}{% endfor %}",
        "{{ cycler.__init__.__globals__.os.popen('touch /tmp/edge-pwned').read() }}",
        "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.popen('id').read() }}",
        "{{ messages.__class__.__init__.__globals__ }}",
        "{{ raise_exception.__globals__['__builtins__']['__import__']('os').system('id') }}",
        "{% set x = messages.append({'role': 'user'}) %}",
    ],
)
def test_injection_is_stopped(source: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os

    marker = "/tmp/edge-pwned"
    if os.path.exists(marker):
        os.unlink(marker)
    with pytest.raises(TemplateError):
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])
    assert not os.path.exists(marker)


@pytest.mark.parametrize(
    "source",
    [
        "{% for i in range(10**9) %}x{% endfor %}",
        "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
        "{{ 'x' * 10**9 }}",
        "{{ 'a' * 4000000 + 'b' * 4000000 }}",
        "{% for i in range(90000) %}{{ 'y' * 1000 }}{% endfor %}",
        "{{ 7 ** 100000000 }}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    ],
)
def test_resource_exhaustion_is_bounded(source: str) -> None:
    t = ChatTemplate(source, limits=TemplateLimits(seconds=0.5))
    start = time.monotonic()
    with pytest.raises(TemplateError):
        t.render([{"role": "user", "content": "hi"}])
    assert time.monotonic() - start < 3.0


def test_syntax_error_is_clear() -> None:
    with pytest.raises(TemplateError, match="does not parse"):
        ChatTemplate("{% for %}")
