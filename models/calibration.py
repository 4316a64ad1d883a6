"""Calibration text for weight quantization (GPTQ statistics and the per-layer sensitivity ranking).

Ordinary text of the kinds a small chat or code model meets: prose, dialogue, instructions, a list, code and a
chat exchange. It is deliberately unrelated to edge/data/eval.txt, which measures the result.
"""

from __future__ import annotations

CALIBRATION_TEXT = """\
Bread is one of the oldest prepared foods. A simple loaf needs only flour, water, salt and yeast, yet the
same four ingredients give very different results depending on time and temperature. A slow, cool rise lets
the dough develop more flavour, while a warm kitchen produces a lighter crumb in a few hours. Bakers learn to
judge the dough by touch: it should spring back slowly when pressed with a floured finger.

"Are we nearly there?" asked Tom, leaning against the window of the train.
"Two more stops," his grandmother said. "Look, you can see the river now. When I was your age we crossed it
on a ferry, and in winter the ice was so thick that carts drove straight over it."
Tom pressed his nose to the glass and tried to imagine horses walking on the frozen water.

To replace a bicycle inner tube: 1. Remove the wheel and let out any remaining air. 2. Lever one side of the
tyre off the rim with two tyre levers. 3. Pull out the old tube and check the inside of the tyre for thorns
or glass. 4. Put a little air in the new tube so that it holds its shape, push it in, and work the tyre back
onto the rim with your thumbs. 5. Inflate to the pressure printed on the side of the tyre.

Shopping list: eggs (a dozen), two lemons, brown rice, olive oil, a bag of spinach, coffee beans, and
batteries for the kitchen clock.

import json
from pathlib import Path


def load_settings(path: Path) -> dict:
    \"\"\"Read a JSON settings file, returning an empty dict when it does not exist.\"\"\"
    if not path.exists():
        return {}
    with path.open(encoding="utf-8") as fh:
        return json.load(fh)


class Counter:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, word: str) -> None:
        self.counts[word] = self.counts.get(word, 0) + 1

User: What is the difference between weather and climate?
Assistant: Weather describes the conditions at a particular place and time, such as rain this afternoon or a
cold morning. Climate is the pattern of weather over many years, for example the average temperature of a
region in July or how much rain usually falls in a year.
User: So one cold winter does not disprove a warming climate?
Assistant: Exactly. A single season is weather; climate shows up only in long-term averages and trends.

The committee met on Tuesday to review the budget for the coming year. Spending on road repairs will rise by
twelve percent, funded partly by savings in administration. Several members asked for a clearer timetable for
the new library, which has been delayed twice because of problems with the foundations.
"""
