"""Auto by phase: whether `--backend auto` splits a model by phase (devices/phase_split.py), from the speeds one
`edge bench` run measured here (a leaf: devices/auto.py reads the store and asks it).

The figures are per phase and per half: a whole backend's prefill (first prompt after load, and warm) and
decode, and what a `--plan prefill=...,decode=...` measured of each of its halves, named as the plan's
`backend` label names them (`openvino:bf16` where the half's precision is not the run's). The split is
modelled on the reference request auto times every backend on (REF_PROMPT tokens of first prompt, REF_GEN
decoded): the fastest prefill half's prompt plus the fastest decode half's tokens. It is chosen only when that
beats the fastest single backend by SPLIT_MARGIN: a split holds two copies of the weights and builds two graphs,
so a gain inside the noise of a measurement does not pay for them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

__all__ = [
    "REF_GEN",
    "REF_PROMPT",
    "SPLIT_MARGIN",
    "HalfSpeed",
    "Speed",
    "SplitVerdict",
    "halves_json",
    "parse_halves",
    "phase_table",
    "split_plan",
    "weigh_split",
]

REF_PROMPT, REF_GEN = 128, 128  # the reference request "fastest" is timed on
# NOTE: 10%: two builds and twice the weights' memory, and two medians of 2 shared cores differ by a few %
SPLIT_MARGIN = 1.10
_FIGURES = ("prefill_tok_s", "prefill_warm_tok_s", "decode_tok_s")


@dataclass(frozen=True)
class Speed:
    """A whole backend's medians: the first prompt after load, decode, and (newer records) a warm prompt."""

    prefill_tok_s: float  # the first prompt after load
    decode_tok_s: float
    prefill_warm_tok_s: float | None = None  # the same prompt again (records before auto by phase: None)

    def request_s(self) -> float:
        return REF_PROMPT / self.prefill_tok_s + REF_GEN / self.decode_tok_s


@dataclass(frozen=True)
class HalfSpeed:
    """What one half measured (None: not measured in that phase): a plan's prefill half its prompts, its
    decode half its tokens; a whole backend both."""

    prefill_tok_s: float | None = None
    prefill_warm_tok_s: float | None = None
    decode_tok_s: float | None = None

    @staticmethod
    def of(s: Speed) -> HalfSpeed:
        return HalfSpeed(
            prefill_tok_s=s.prefill_tok_s,
            prefill_warm_tok_s=s.prefill_warm_tok_s,
            decode_tok_s=s.decode_tok_s,
        )

    def slowest(self, other: HalfSpeed) -> HalfSpeed:
        """Each figure the lower of the two measurements of it (a half measured twice in one run)."""

        def low(a: float | None, b: float | None) -> float | None:
            return b if a is None else a if b is None else min(a, b)

        return HalfSpeed(**{f: low(getattr(self, f), getattr(other, f)) for f in _FIGURES})


def positive(value: object) -> float | None:
    """A stored figure as a float, None where it is missing, not a number, or not above 0."""
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return x if x > 0 else None


def parse_halves(raw: object) -> dict[str, HalfSpeed]:
    """A run's `halves` as stored (absent in records before auto by phase: none); damaged entries are left out."""
    out: dict[str, HalfSpeed] = {}
    if not isinstance(raw, dict):
        return out
    for key, figures in raw.items():
        if not isinstance(key, str) or not isinstance(figures, dict):
            continue
        half = HalfSpeed(**{f: positive(figures.get(f)) for f in _FIGURES})
        if half.prefill_tok_s is not None or half.decode_tok_s is not None:
            out[key] = half
    return out


def halves_json(halves: Mapping[str, HalfSpeed]) -> dict[str, dict[str, float]]:
    """The halves as stored: only the figures measured, to 0.01 tok/s."""
    return {
        key: {f: round(v, 2) for f in _FIGURES if (v := getattr(h, f)) is not None}
        for key, h in halves.items()
    }


def phase_table(speeds: Mapping[str, Speed], halves: Mapping[str, HalfSpeed]) -> dict[str, HalfSpeed]:
    """Every half one run measured, whole backends included; a half measured twice keeps its lower figures."""
    table = {b: HalfSpeed.of(s) for b, s in speeds.items()}
    for key, h in halves.items():
        table[key] = table[key].slowest(h) if key in table else h
    return table


def split_plan(prefill: str, decode: str) -> str:
    """The `--plan` text of a split of two halves named `backend[:precision]` (the CPU's)."""

    def spec(key: str) -> str:
        backend, _, precision = key.partition(":")
        return f"{backend}:cpu" + (f":{precision}" if precision else "")

    return f"prefill={spec(prefill)},decode={spec(decode)}"


@dataclass(frozen=True)
class SplitVerdict:
    """The fastest split one run's figures allow, against the fastest single backend, and whether it is chosen."""

    prefill: str  # the halves, `backend[:precision]`
    decode: str
    prefill_half: HalfSpeed
    decode_half: HalfSpeed
    single: str  # the fastest single backend
    single_s: float  # its reference request, seconds
    chosen: bool
    why: str

    @property
    def label(self) -> str:
        """As the split's `backend` is named (PhasePlan.backend): `openvino:bf16+ort`."""
        return f"{self.prefill}+{self.decode}"

    @property
    def plan(self) -> str:
        return split_plan(self.prefill, self.decode)

    def request_s(self) -> float:
        assert self.prefill_half.prefill_tok_s is not None and self.decode_half.decode_tok_s is not None
        return REF_PROMPT / self.prefill_half.prefill_tok_s + REF_GEN / self.decode_half.decode_tok_s

    def explain(self) -> list[str]:
        """The halves and the figures they were weighed on, one line each."""
        p, d = self.prefill_half, self.decode_half
        warm = "" if p.prefill_warm_tok_s is None else f", warm {p.prefill_warm_tok_s:.0f}"
        head = "split by phase" + (" (chosen)" if self.chosen else " (not chosen)")
        return [
            f"{head}: {self.why}",
            f"  prefill  {self.prefill:<14} first prompt {p.prefill_tok_s:7.0f} tok/s{warm}",
            f"  decode   {self.decode:<14} {d.decode_tok_s:6.1f} tok/s",
            f"  {REF_PROMPT}+{REF_GEN}-token request {self.request_s():5.2f} s split, "
            f"{self.single_s:5.2f} s on {self.single} alone",
        ]


def _fastest(table: Mapping[str, HalfSpeed], keys: Collection[str], figure: str) -> str | None:
    have = [k for k in keys if getattr(table[k], figure) is not None]
    return max(have, key=lambda k: getattr(table[k], figure), default=None)


def weigh_split(
    table: Mapping[str, HalfSpeed], halves: Collection[str], single: str, single_s: float
) -> SplitVerdict | None:
    """The fastest prefill half and the fastest decode half among `halves` (those that may run a split here),
    weighed against `single` (the fastest single backend, `single_s` its reference request); None when no
    split of two different halves was measured."""
    keys = [k for k in halves if k in table]
    prefill, decode = _fastest(table, keys, "prefill_tok_s"), _fastest(table, keys, "decode_tok_s")
    if prefill is None or decode is None or prefill == decode:
        return None  # one half measured, or one graph fastest at both: a split is that graph alone
    base = SplitVerdict(prefill, decode, table[prefill], table[decode], single, single_s, False, "")
    gain = single_s / base.request_s()
    if gain >= SPLIT_MARGIN:
        why = f"{gain:.2f}x as fast as {single} alone on the reference request (a split needs {SPLIT_MARGIN:.2f}x)"
        return replace(base, chosen=True, why=why)
    return replace(
        base, why=f"{gain:.2f}x as fast as {single} alone, under the {SPLIT_MARGIN:.2f}x a split needs"
    )
