"""Stop strings are never streamed, even when split across tokens."""

from __future__ import annotations

from edge.generate import _StopMatcher


def feed_all(stops: list[str], pieces: list[str]) -> tuple[str, bool]:
    m = _StopMatcher(stops)
    out = ""
    for p in pieces:
        out += m.feed(p)
        if m.hit:
            return out, True
    return out + m.flush(), False


def test_stop_split_across_pieces() -> None:
    assert feed_all(["</end>"], ["Hello </", "en", "d> tail"]) == ("Hello ", True)


def test_partial_prefix_released_when_not_a_stop() -> None:
    assert feed_all(["</end>"], ["a </", "b"]) == ("a </b", False)


def test_earliest_of_several_stops() -> None:
    assert feed_all(["B", "AB"], ["xxAB"]) == ("xx", True)


def test_no_stops_passes_through() -> None:
    m = _StopMatcher([])
    assert m.feed("abc") == "abc" and not m.hit
