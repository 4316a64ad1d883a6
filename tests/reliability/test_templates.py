"""Hostile chat templates beyond tests/models/test_chat_template.py: escapes through filters, formatting and
loaders; values built by one C call (no deadline can stop it); templates that fail to compile or raise.

Every case must end in TemplateError within seconds and without a large allocation (tracemalloc peak).
"""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest

from edge.errors import TemplateError
from edge.models.chat_template import ChatTemplate, TemplateLimits
from tests.reliability.conftest import assert_one_line_error, cli, error_lines
from tests.reliability.ggufs import rewrite_gguf

MESSAGES = [{"role": "user", "content": "hi"}]
MAX_SECONDS = 2.0
MAX_PEAK_BYTES = 64 << 20  # the limits allow 4M-character values; nothing may get near a gigabyte


def refused(source: str, limits: TemplateLimits | None = None) -> TemplateError:
    tracemalloc.start()
    start = time.monotonic()
    try:
        with pytest.raises(TemplateError) as excinfo:
            ChatTemplate(source, limits=limits).render(MESSAGES)
        elapsed = time.monotonic() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < MAX_SECONDS, f"{elapsed:.1f} s"
    assert peak < MAX_PEAK_BYTES, f"peak {peak >> 20} MiB"
    return excinfo.value


ESCAPES = {
    "format-attribute": "{{ '{0.__class__.__mro__}'.format('') }}",
    "format-map-attribute": "{{ '{x.__class__}'.format_map({'x': ''}) }}",
    "attr-filter": "{{ (''|attr('__class__')).__mro__ }}",
    "include-a-file": "{% include '/etc/passwd' %}",
    "import-a-file": "{% import '/etc/passwd' as p %}{{ p }}",
    "extends-a-file": "{% extends '/etc/hostname' %}",
    "lipsum-globals": "{{ lipsum.__globals__['os'] }}",
    "namespace-init-globals": "{{ namespace.__init__.__globals__ }}",
    "joiner-globals": "{{ joiner.__init__.__globals__ }}",
    "range-self": "{{ range.__self__.__class__ }}",
    "mutate-messages": "{{ messages.pop() }}",
    "mutate-dict": "{{ messages[0].update({'role': 'system'}) }}",
    "str-mod-attribute": "{{ '%(a)s' % {'a': ''.__class__} }}",
}


LEAKS = ("<class", "<module", "<function", "<built-in", "root:", "os.", "mro")


@pytest.mark.parametrize("case", list(ESCAPES))
def test_escape_attempts_are_stopped(case: str) -> None:
    """Refused, or rendered as the sandbox's Undefined: never an object, a module or a file's content."""
    try:
        out = ChatTemplate(ESCAPES[case]).render(MESSAGES)
    except TemplateError:
        return
    assert not any(leak in out for leak in LEAKS), out
    assert MESSAGES == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages|map(attribute='__class__')|list }}",
        "{{ messages|selectattr('__class__')|list }}",
        "{{ messages|sort(attribute='__class__')|list }}",
        "{{ messages|groupby('__class__')|list }}",
    ],
)
def test_filters_do_not_reach_dunder_attributes(source: str) -> None:
    try:
        out = ChatTemplate(source).render(MESSAGES)
    except TemplateError:
        return
    assert "class" not in out and "type" not in out, out


EXHAUSTION = {
    # one C call, no chance for a deadline: refused before the call
    "str-method-width": "{{ 'x'.ljust(300000000) }}",
    "center-filter": "{{ 'x'|center(300000000) }}",
    "printf-width": "{{ '%300000000s' % 'x' }}",
    "printf-star-width": "{{ '%*s' % (300000000, 'x') }}",
    "format-width": "{{ '{:>300000000}'.format('x') }}",
    "format-filter-width": "{{ '%300000000s'|format('x') }}",
    "indent-filter": "{{ ('a\\n' * 1000)|indent(300000) }}",
    "replace-method": "{{ ('x' * 1000).replace('x', 'y' * 1000000) }}",
    "replace-filter": "{{ ('x' * 1000)|replace('x', 'y' * 1000000) }}",
    "expandtabs": "{{ ('\\t' * 1000).expandtabs(1000000) }}",
    "join-method": "{{ ('y' * 1000).join(range(100000)|map('string')) }}",
    "join-filter": "{{ range(100000)|join('y' * 1000) }}",
    "wordwrap-wrapstring": "{{ ('x' * 100000)|wordwrap(1, wrapstring='y' * 1000) }}",
    "batch-fill": "{{ [1]|batch(300000000, 0)|list|length }}",
    "slice-count": "{{ [1]|slice(30000000)|list|length }}",
    "tojson-indent": "{{ messages|tojson(indent=300000000) }}",
    "lipsum-paragraphs": "{{ lipsum(n=3000000) }}",
    "int-power-chain": "{{ ((((9 ** 64) ** 64) ** 64) ** 64) ** 64 }}",
    "int-square-loop": "{% set ns = namespace(x=7) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
    "list-repeat": "{{ [0] * 100000000 }}",
    # values grown over statements: each step checked, so the largest value stays near the limit
    "concat-doubling": "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "set-chain-doubling": "{% set a = 'x' * 3000000 %}{% set b = a ~ a %}{% set c = b ~ b %}{% set d = c ~ c %}",
    "set-block-doubling": "{% set a = 'x' * 3000000 %}{% set b %}{{ a }}{{ a }}{% endset %}"
    "{% set c %}{{ b }}{{ b }}{% endset %}{{ c|length }}",
    "macro-doubling": "{% macro d(s, n) %}{% if n %}{{ d(s ~ s, n - 1) }}{% else %}{{ s|length }}{% endif %}"
    "{% endmacro %}{{ d('x', 40) }}",
    "macro-output-loop": "{% set a = 'x' * 3000000 %}{% macro m() %}{% for i in range(1000) %}{{ a }}"
    "{% endfor %}{% endmacro %}{{ m()|length }}",
    # printing a container: its repr is sized before str() runs
    "print-big-list": "{% set a = 'x' * 3000000 %}{{ [a] * 1000 }}",
    "string-filter-big-list": "{% set a = 'x' * 3000000 %}{{ ([a] * 1000)|string|length }}",
    "concat-big-list": "{% set a = 'x' * 3000000 %}{{ ('x' ~ ([a] * 1000))|length }}",
    "join-big-items": "{% set a = 'x' * 3000000 %}{{ ([a] * 1000)|join|length }}",
}


@pytest.mark.parametrize("case", list(EXHAUSTION))
def test_resource_exhaustion_is_stopped_before_it_allocates(case: str) -> None:
    refused(EXHAUSTION[case])


def test_a_self_referencing_namespace_prints_without_hanging() -> None:
    out = ChatTemplate("{% set ns = namespace(x=1) %}{% set ns.me = ns %}{{ ns }}").render(MESSAGES)
    assert "Namespace" in out


COMPILE_FAILURES = {
    "nested-blocks": "{% for a in messages %}" * 30 + "{% endfor %}" * 30,  # Python: too many nested blocks
    "nested-parens": "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}",  # RecursionError in the parser
    "nested-ifs": "{% if 1 %}" * 3000 + "{% endif %}" * 3000,
}


@pytest.mark.parametrize("case", list(COMPILE_FAILURES))
def test_templates_that_cannot_compile(case: str) -> None:
    with pytest.raises(TemplateError, match=r"compile|parse"):
        ChatTemplate(COMPILE_FAILURES[case])


RAISES = {
    "divide-by-zero": "{{ 1 / 0 }}",
    "floor-divide-by-zero": "{{ 10 // 0 }}",
    "modulo-by-zero": "{{ 1.0 % 0 }}",
    "truncate-assert": "{{ 'abc'|truncate(-5) }}",
    "slice-zero": "{{ [1]|slice(0)|list }}",
    "range-step-zero": "{{ range(1, 10, 0)|list }}",
    "float-overflow": "{{ 2.0 ** 10000 }}",
    "sort-mixed-types": "{{ [1, 'a']|sort }}",
    "printf-type": "{{ '%d' % 'x' }}",
    "printf-key": "{{ '%(a)s' % {} }}",
    "wordwrap-zero": "{{ 'x y'|wordwrap(0) }}",
    "tojson-object": "{{ namespace(a=1)|tojson }}",
    "unicode-lone-surrogate": "{{ messages[0].content|urlencode }}{{ '\\udcff'|urlencode }}",
    "int-to-str-limit": "{{ (7 ** 60) ** 60 * (7 ** 60) ** 60 }}",  # past Python's 4300-digit str limit
    "call-undefined": "{{ nope() }}",
    "raise-exception": "{{ raise_exception('refused') }}",
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
}


@pytest.mark.parametrize("case", list(RAISES))
def test_templates_that_raise_end_in_template_error(case: str) -> None:
    refused(RAISES[case])


def test_real_templates_are_unchanged_by_the_bounds() -> None:
    chatml = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
        "{{ tools|tojson(indent=2) if tools }}{{ '%-5s|%3d' % ('ab', 7) }}{{ 'x'|center(9) }}{{ [1, 2]|join(', ') }}"
    )
    long = "ü" * 1_000_000  # a long message is fine: only hostile sizes are refused
    out = ChatTemplate(chatml).render(
        [{"role": "user", "content": long}], tools=[{"name": "f", "parameters": {"x": [1, 2]}}]
    )
    assert (
        long in out and '"name": "f"' in out and "ab   |  7" in out and "    x    " in out and "1, 2" in out
    )


def test_hostile_template_in_a_model_file_is_one_clear_line(tiny_model: Path, tmp_path: Path) -> None:
    from gguf import GGUFValueType as V

    for name, source in (
        ("compile", COMPILE_FAILURES["nested-blocks"]),
        ("render", EXHAUSTION["int-power-chain"]),
        ("escape", ESCAPES["include-a-file"]),
    ):
        path = rewrite_gguf(
            tiny_model, tmp_path / f"{name}.gguf", {"tokenizer.chat_template": (source, V.STRING)}
        )
        proc = cli("run", str(path), "hi", "--max-tokens", "1", "--ctx-size", "64")
        assert_one_line_error(proc, "chat template")


# VmHWM, not ru_maxrss: subprocess starts the child with vfork, and Linux carries the parent's peak RSS into
# the child's ru_maxrss at exec, so inside a big pytest process ru_maxrss reads the parent's size.
MEASURED = (
    "import re, sys\n"
    "from edge.cli import main\n"
    "rc = main(sys.argv[1:])\n"
    "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)\n"
    "print('peak_rss_kib', hwm, file=sys.stderr)\n"
    "sys.exit(rc)\n"
)


def test_templates_never_reach_llama_cpp_pythons_own_compile(tiny_model: Path, tmp_path: Path) -> None:
    """llama-cpp-python compiles every template of a file when it loads it, in a sandbox without limits that
    folds constants at compile time: this 22-byte template took 3 GB and 8 s there. edge keeps it away."""
    import subprocess
    import sys

    from gguf import GGUFValueType as V

    from tests.reliability.conftest import ROOT

    bomb = "{{ 'x' * 800000000 }}"
    path = rewrite_gguf(tiny_model, tmp_path / "bomb.gguf", {"tokenizer.chat_template": (bomb, V.STRING)})
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", MEASURED, "run", str(path), "hi", "--max-tokens", "1", "--ctx-size", "64"],
        capture_output=True,
        timeout=120,
        cwd=ROOT,
    )
    lines = error_lines(proc.stderr.decode())
    assert proc.returncode == 1 and lines[0].startswith("edge: error: chat template builds"), lines
    assert int(lines[-1].split()[-1]) < 1 << 20, lines[-1]  # KiB: under 1 GiB
    assert time.monotonic() - start < 10


def test_each_thread_renders_under_its_own_deadline() -> None:
    """Two threads on one model render with one template: a thread's renders must not reset another's
    deadline (they did when the deadline was the template's: a hostile render never timed out while another
    thread kept rendering)."""
    import threading

    slow = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}ok"
    template = ChatTemplate(slow, limits=TemplateLimits(seconds=0.5))
    quick = ChatTemplate("hi", limits=TemplateLimits(seconds=0.5))
    stop = threading.Event()

    def keep_rendering() -> None:  # the other thread, sharing the slow template's environment
        env = template._env
        while not stop.is_set():
            env.deadline = type(env.deadline)(0.5)
            quick.render(MESSAGES)

    other = threading.Thread(target=keep_rendering, daemon=True)
    other.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(TemplateError, match="longer than"):
            template.render(MESSAGES)
    finally:
        stop.set()
        other.join()
    assert time.monotonic() - t0 < 10
