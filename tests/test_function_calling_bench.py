"""The function-calling benchmark's cases are coherent (each expected call is one its functions allow, its required
arguments expected) and its scoring checks values the way BFCL does."""

from __future__ import annotations

import json
from types import SimpleNamespace

from benchmarks.function_calling import DATA, right_arguments, right_in_text, same_value, score, subset
from edge.tools import parse_tools

CASES = json.loads(DATA.read_text())


def test_cases_ask_for_calls_their_functions_allow() -> None:
    functions = CASES["functions"]
    parse_tools([{"type": "function", "function": {"name": n, **f}} for n, f in functions.items()])
    assert len(CASES["cases"]) >= 30
    for case in CASES["cases"]:
        want = case["expected"]
        assert want["name"] in case["functions"], case["id"]
        params = functions[want["name"]]["parameters"]
        assert set(want["arguments"]) <= set(params["properties"]), case["id"]
        for key in params.get("required", []):
            assert None not in want["arguments"].get(key, [None]), (case["id"], key)


def test_values_match_by_value_and_trimmed_case() -> None:
    assert same_value(" tokyo ", "Tokyo") and same_value(10.0, 10) and same_value(True, True)
    assert not same_value("10", 10) and not same_value(1, True) and not same_value(False, None)
    want = {"city": ["Rome"], "guests": [2, None]}
    assert right_arguments({"city": "rome"}, want) and right_arguments({"city": "ROME", "guests": 2}, want)
    assert not right_arguments({"city": "Rome", "guests": 3}, want)
    assert not right_arguments({"city": "Rome", "extra": 1}, want)
    assert not right_arguments({"guests": 2}, want)


def call(name: str, arguments: str) -> SimpleNamespace:
    return SimpleNamespace(
        tool_calls=[SimpleNamespace(function=SimpleNamespace(name=name, arguments=arguments))]
    )


def test_score_separates_valid_function_and_arguments() -> None:
    case = next(c for c in CASES["cases"] if c["id"] == "multiple_4")  # get_time_zone(city=Sydney)
    fns = CASES["functions"]
    checks = ("valid", "function", "arguments")
    row = score(call("get_time_zone", '{"city": "sydney"}'), case, fns)
    assert [row[k] for k in checks] == [True, True, True]
    row = score(call("get_weather", '{"city": "Sydney"}'), case, fns)
    assert [row[k] for k in checks] == [True, False, False]
    row = score(call("get_time_zone", '{"city": "Perth"}'), case, fns)
    assert [row[k] for k in checks] == [True, True, False]
    row = score(call("get_time_zone", '{"city": 5}'), case, fns)  # fails the schema
    assert [row[k] for k in checks] == [False, False, False]
    row = score(SimpleNamespace(tool_calls=None, content="It is noon."), case, fns)
    assert row["text"] == "It is noon." and not row["valid"]


def test_every_keeps_each_category_share() -> None:
    kept = subset(CASES["cases"], 2, None)
    for cat in ("simple", "multiple"):
        ids = [c["id"] for c in CASES["cases"] if c["category"] == cat]
        assert [c["id"] for c in kept if c["category"] == cat] == ids[::2]
    assert subset(CASES["cases"], 1, 3) == CASES["cases"][:3]


def test_a_call_left_in_text_is_scored_apart() -> None:
    case = next(c for c in CASES["cases"] if c["id"] == "multiple_4")  # get_time_zone(city=Sydney)
    fenced = '```json\n{"name": "get_time_zone", "arguments": {"city": "Sydney"}}\n```'
    assert right_in_text({"n_calls": 0, "text": fenced}, case)
    assert right_in_text(
        {"n_calls": 0, "text": '{"name": "get_time_zone", "arguments": {"city": "Sydney"}}.'}, case
    )
    assert not right_in_text(
        {"n_calls": 0, "text": '{"name": "get_weather", "arguments": {"city": "Sydney"}}'}, case
    )
    assert not right_in_text({"n_calls": 0, "text": "It is noon in Sydney."}, case)
    assert not right_in_text({"n_calls": 1, "text": None}, case)
