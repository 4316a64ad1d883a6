"""Comparing two greedy answers of one target where only near-ties may differ: llama.cpp's batched forwards
(a verify, a fresh prefill) round differently from its one-token decode, by an amount that depends on the
CPU's kernels, so where two such answers part the target's own top two logits must be a near-tie."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edge.devices.base import Decoder

NEAR_TIE = 0.5  # logits: llama.cpp's batched-vs-decode differences are well below this


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where a and b differ (the shorter one's end if one is a prefix), None if equal."""
    if list(a) == list(b):
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def assert_equal_but_near_ties(
    decoder: Decoder, prompt: Sequence[int], a: Sequence[int], b: Sequence[int]
) -> None:
    """a == b, or at their first difference the tokens there are among the target's top two and those are a
    near-tie (scored by `decoder` on the prompt and the common prefix; the decoder is reset first). Where one
    answer is a prefix of the other it stopped there (an end token, not in the list): the other's token must
    be a near-tie with it."""
    at = first_difference(a, b)
    if at is None:
        return
    decoder.reset()
    row = decoder.forward([*prompt, *a[:at]], last_only=True)[-1]
    top = np.argsort(row)[-2:]
    gap = float(row[top[1]] - row[top[0]])
    parted = {seq[at] for seq in (a, b) if at < len(seq)}
    assert parted <= set(top.tolist()) and gap < NEAR_TIE, (
        f"the answers part at token {at} ({sorted(parted)}), which is not a near-tie of the target: "
        f"its top two {top.tolist()} are {gap:.3f} apart"
    )
