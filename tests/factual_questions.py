"""Everyday questions with checkable answers (tests/data/default_model_questions.json): how the default model
is chosen (benchmarks/default_model.py) and checked (tests/models/test_default_model.py). A check looks for
what any right answer holds (a key word, a number, a pattern, a function that works), never one model's words."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

QUESTIONS_FILE = Path(__file__).parent / "data" / "default_model_questions.json"
CODE_TIMEOUT_S = 10.0

# Runs the answer's code in a fresh interpreter (-I: no site, no cwd on the path) and calls the function
_HARNESS = """
import json, math, sys
spec = json.loads(sys.argv[1])
ns = {}
exec(sys.stdin.read(), ns)
f = ns[spec["function"]]
for args, want in spec["cases"]:
    got = f(*args)
    same = math.isclose(got, want, abs_tol=1e-6) if isinstance(want, (int, float)) and not isinstance(
        want, bool) and isinstance(got, (int, float)) else got == want
    if not same:
        sys.exit(f"{spec['function']}{tuple(args)} = {got!r}, not {want!r}")
"""


@dataclass(frozen=True)
class Question:
    kind: str  # fact, arithmetic, instruction, translation, code
    q: str
    any: tuple[str, ...] = ()
    all: tuple[tuple[str, ...], ...] = ()
    number: float | None = None
    regex: str | None = None
    code: dict[str, Any] = field(default_factory=dict)
    not_: tuple[str, ...] = ()


def load_questions(path: Path = QUESTIONS_FILE) -> tuple[Question, ...]:
    rows = json.loads(path.read_text())["questions"]
    return tuple(
        Question(
            kind=r["kind"],
            q=r["q"],
            any=tuple(r.get("any", ())),
            all=tuple(tuple(g) for g in r.get("all", ())),
            number=r.get("number"),
            regex=r.get("regex"),
            code=r.get("code", {}),
            not_=tuple(r.get("not", ())),
        )
        for r in rows
    )


QUESTIONS = load_questions()


def has_word(text: str, keys: tuple[str, ...]) -> bool:
    """One of `keys` appears in `text` as a word (case-insensitive)."""
    low = text.lower()
    return any(re.search(rf"(?<![\w]){re.escape(k.lower())}(?![\w])", low) for k in keys)


def has_number(text: str, n: float) -> bool:
    """`n` appears as a number: 1,024 and 1024.0 count as 1024; 11024 and 1024.5 do not."""
    plain = re.sub(r"(?<=\d),(?=\d{3})", "", text)
    want = f"{n:g}".replace(".", r"\.")
    return re.search(rf"(?<![\w.]){want}(?:\.0+)?(?![\w]|\.\d)", plain) is not None


def code_of(answer: str) -> str:
    """The Python in an answer: its fenced blocks joined, else the text itself."""
    blocks = re.findall(r"```(?:python|py)?[ \t]*\n(.*?)```", answer, flags=re.S)
    return "\n\n".join(blocks) if blocks else answer


def code_works(answer: str, spec: dict[str, Any], timeout: float = CODE_TIMEOUT_S) -> bool:
    """The answer's code defines spec's function and it returns each case's value (timeout: wrong)."""
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", _HARNESS, json.dumps(spec)],
            input=code_of(answer),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def is_right(answer: str, question: Question) -> bool:
    checks = []
    if question.any:
        checks.append(has_word(answer, question.any))
    checks += [has_word(answer, group) for group in question.all]
    if question.number is not None:
        checks.append(has_number(answer, question.number))
    if question.regex is not None:
        checks.append(re.search(question.regex, answer.strip(), flags=re.I) is not None)
    if question.code:
        checks.append(code_works(answer, question.code))
    if question.not_:
        checks.append(not has_word(answer, question.not_))
    if not checks:
        raise ValueError(f"question {question.q!r} has no check")
    return all(checks)


def question(text: str) -> Question:
    return next(q for q in QUESTIONS if q.q == text)


# The rule that picks the default model: the smallest download whose share of right answers, over every run
# of the benchmark (greedy and each seed at edge run's default sampling), is at least this
DEFAULT_RULE_SHARE = 0.9


def choose_default(shares: dict[str, float], sizes: dict[str, int]) -> tuple[str, bool]:
    """The default model from each model's share of right answers: the smallest download at or above
    DEFAULT_RULE_SHARE, else the best scoring one. Returns (model, whether it reached the share)."""
    passing = [m for m, s in shares.items() if s >= DEFAULT_RULE_SHARE]
    if passing:
        return min(passing, key=lambda m: sizes[m]), True
    return max(shares, key=lambda m: (shares[m], -sizes[m])), False


def tally(runs: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """Per model, (right, asked) over every run of a benchmark record (benchmarks/default_model.py's JSON)."""
    out: dict[str, tuple[int, int]] = {}
    for r in runs:
        right, asked = out.get(r["model"], (0, 0))
        out[r["model"]] = (right + sum(bool(x["right"]) for x in r["rows"]), asked + len(r["rows"]))
    return out
