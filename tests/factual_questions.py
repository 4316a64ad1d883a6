"""Plain factual questions with the key words a right answer contains: how the default model is chosen
(benchmarks/default_model.py) and checked (tests/models/test_default_model.py)."""

from __future__ import annotations

import re

# (question, alternatives: a right answer contains one of them as a word, case-insensitive)
QUESTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("What is the capital of France?", ("paris",)),
    ("Why is the sky blue?", ("scattering", "scatters", "scattered", "scatter")),
    ("How many days are there in a leap year?", ("366",)),
    ("What is the chemical symbol for gold?", ("au",)),
    ("Who wrote the play Romeo and Juliet?", ("shakespeare",)),
    ("Which planet is known as the Red Planet?", ("mars",)),
    ("At what temperature in degrees Celsius does water boil at sea level?", ("100",)),
    ("Which gas do plants take in from the air for photosynthesis?", ("carbon dioxide", "co2", "co₂")),
    ("How many continents are there on Earth?", ("seven", "7")),
    ("What is the largest ocean on Earth?", ("pacific",)),
    ("What is the square root of 81?", ("9", "nine")),
    ("In which country are the pyramids of Giza?", ("egypt",)),
    ("Who painted the Mona Lisa?", ("leonardo", "vinci")),
    ("What is the freezing point of water in degrees Fahrenheit?", ("32",)),
)


def is_right(answer: str, keys: tuple[str, ...]) -> bool:
    text = answer.lower()
    return any(re.search(rf"(?<![\w]){re.escape(k)}(?![\w])", text) for k in keys)
