"""The default model is chosen by measurement (benchmarks/default_model.py, recorded in
benchmarks/results/default-model-2026-12-03.md): the smallest catalog chat model that answers at least 90% of
the kept questions (tests/data/default_model_questions.json) right. Here: the checks are fair, the rule picks
the default from the recorded table, the default answers the README's example, and where it does not fit in
memory `edge run` runs the largest catalog chat model that does."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import edge
from edge.api import load_default
from edge.devices.registry import estimate_memory
from edge.models.catalog import CATALOG, DEFAULT_MODEL
from edge.models.checked import check_model
from tests.factual_questions import QUESTIONS, choose_default, code_works, is_right, question, tally

RECORD = Path(__file__).parents[2] / "benchmarks" / "results" / "default-model-2026-12-03.json"
SAMPLING = {"temperature": 0.7, "top_k": 40, "top_p": 0.95, "min_p": 0.05}  # edge run's defaults
README_PROMPT = "Why is the sky blue?"
SUBSET = QUESTIONS[::5]  # 11 of every kind, greedy: the full set is the benchmark


def test_the_kept_set_covers_every_kind_with_50_questions() -> None:
    kinds = Counter(q.kind for q in QUESTIONS)
    assert len(QUESTIONS) >= 50 and set(kinds) == {"fact", "arithmetic", "instruction", "translation", "code"}
    for q in QUESTIONS:  # every question has a check (is_right raises on one without), and "" passes none
        assert not is_right("", q), q.q


def test_the_checks_accept_right_answers_and_refuse_near_misses() -> None:
    leap = question("How many days are there in a leap year?")
    assert is_right("A leap year has 366 days.", leap) and not is_right("It has 365 days.", leap)
    assert not is_right("1366", leap) and not is_right("366.5", leap) and is_right("366.0 days", leap)
    power = question("What is 2 to the power of 10?")
    assert is_right("2^10 = 1,024", power)
    gold = question("What is the chemical symbol for gold?")
    assert is_right("The symbol is Au.", gold) and not is_right("Because", gold)
    yes = question("Reply with only the word yes.")
    assert is_right("Yes.", yes) and not is_right("Yes, of course I can do that.", yes)
    colors = question("List the three primary colors of paint.")
    assert is_right("Red, yellow and blue.", colors) and not is_right("Red and blue.", colors)


def test_code_answers_are_run_not_read() -> None:
    sq = question("Write a Python function square(x) that returns x squared.")
    fenced = "Here it is:\n```python\ndef square(x):\n    return x ** 2\n```\nIt squares x."
    assert is_right(fenced, sq) and is_right("def square(x):\n    return x * x\n", sq)
    assert not is_right("```python\ndef square(x):\n    return 2 * x\n```", sq)  # runs, gives wrong values
    assert not is_right("The square of x is x times x.", sq)  # no code
    assert not code_works("def square(x):\n    while True: pass\n", sq.code, timeout=1.0)


def test_the_rule_picks_the_smallest_model_at_90_percent() -> None:
    sizes = {"a": 1, "b": 2, "c": 3}
    assert choose_default({"a": 0.6, "b": 0.91, "c": 0.99}, sizes) == ("b", True)
    assert choose_default({"a": 0.6, "b": 0.8, "c": 0.85}, sizes) == ("c", False)  # none reached: the best


def test_the_rule_picks_the_default_from_the_recorded_table() -> None:
    runs = json.loads(RECORD.read_text())
    counts = tally(runs)
    assert set(counts) == {n for n, e in CATALOG.items() if e.chat}, "score every catalog chat model"
    shares = {m: right / asked for m, (right, asked) in counts.items()}
    assert choose_default(shares, {m: CATALOG[m].size for m in shares})[0] == DEFAULT_MODEL, shares


@pytest.fixture(scope="module")
def default_model():
    with edge.load(DEFAULT_MODEL, backend="llamacpp", draft="none") as m:
        yield m


@pytest.mark.slow
def test_the_default_answers_the_readme_example_in_every_seed(default_model) -> None:
    keys = question(README_PROMPT)
    greedy = default_model.generate(README_PROMPT, max_tokens=96, temperature=0.0, reuse=False).text
    texts = [greedy] + [
        default_model.generate(README_PROMPT, max_tokens=96, seed=s, reuse=False, **SAMPLING).text
        for s in range(5)
    ]
    assert all(is_right(t, keys) for t in texts), texts


@pytest.mark.slow
def test_the_default_answers_a_subset_of_the_kept_questions(default_model) -> None:
    wrong = []
    for q in SUBSET:
        text = default_model.generate(q.q, max_tokens=112, temperature=0.0, reuse=False).text
        if not is_right(text, q):
            wrong.append(f"{q.q} -> {' '.join(text.split())[:100]}")
    assert len(wrong) <= len(SUBSET) // 10, wrong  # 90%, as the rule


@pytest.mark.slow
def test_edge_run_falls_back_to_the_largest_chat_model_that_fits() -> None:
    chat = sorted(
        (e for e in CATALOG.values() if e.chat and e.size <= CATALOG[DEFAULT_MODEL].size),
        key=lambda e: -e.size,
    )
    if len(chat) < 2:
        pytest.fail("the default is the smallest chat model: nothing to fall back to; test the error instead")
    need = {e.name: estimate_memory("llamacpp", check_model(e.name), 4096).total for e in chat}
    free = need[chat[1].name] + (1 << 20)  # the next one down fits, the default does not
    assert need[DEFAULT_MODEL] > free
    heard: list[str] = []
    with load_default(on_fallback=heard.append, backend="llamacpp", draft="none", available_memory=free) as m:
        assert m.name == chat[1].name
    assert len(heard) == 1 and DEFAULT_MODEL in heard[0] and chat[1].name in heard[0] and "MiB" in heard[0]
    with pytest.raises(edge.InsufficientMemoryError):
        load_default(backend="llamacpp", draft="none", available_memory=need[chat[-1].name] - 1)
