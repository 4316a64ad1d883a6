"""Feeds for staged attention (models/transformer.py, "Staged attention"): the layout in which a token's
attention does not depend on how many tokens its forward carries, so a speculative verify of k tokens gives the
same logits, bit for bit, as k one-token decode steps.

A token at position p attends over (ring slots [0, L)) ++ (a staging window of w slots). Two layouts:

    windowed  a forward of at most WINDOW tokens, all inside one aligned window [b, b + WINDOW), b a multiple
              of WINDOW: the staging window is positions [b, b + WINDOW) (gathered from the ring, the step's
              own tokens scattered in by the graph), the ring part shows only positions < b and binds a prefix L
              that depends on b alone. Every forward inside the window sees the same columns in the same order.
    prefill   a longer forward (a prompt chunk): the staging window is the step's own tokens (w = q), the ring
              part the occupied prefix, as the unstaged graph does.

Which layout a forward takes depends only on its length, so a plain and a speculative generation run the same
prompt chunks and then the same windows. The visible set is the ring's own (sinks, the last `ring` tokens,
the sliding window): only where the columns live changes. The ring is still written at every commit; a slot
overwritten inside the window held a token that no query of the window sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .ring import NEG_INF, RingKVCache, StepView
from .spec import LayerKind

__all__ = [
    "WINDOW",
    "StagedFeeds",
    "bound_prefix",
    "piece_sizes",
    "split_windows",
    "staged_feeds",
    "window_end",
    "windowed",
]

WINDOW = 32  # staging slots; also the most tokens a windowed forward carries (speculation verifies <= 17)


def windowed(n_tokens: int) -> bool:
    """Whether a forward of n tokens takes the windowed layout (else the prefill layout)."""
    return n_tokens <= WINDOW


def window_end(position: int) -> int:
    """The first position of the next window: a windowed forward starting at `position` stops before it."""
    return (position // WINDOW + 1) * WINDOW


@dataclass(frozen=True)
class StagedFeeds:
    masks: dict[str, np.ndarray]  # mask_<kind> [1, 1, q + 1, L + w]
    past: dict[int, int]  # kind -> L, the ring prefix to bind
    stage_keys: tuple[np.ndarray, ...]  # per layer [1, w, kvh, hd]
    stage_values: tuple[np.ndarray, ...]
    index: np.ndarray  # [1, q, 2] int64: (0, staging slot) per new token


def _pad_row(mask: np.ndarray) -> np.ndarray:
    """The padding query's row (all visible: finite scores, the row is dropped)."""
    pad = np.zeros((1, 1, 1, mask.shape[-1]), np.float32)
    return np.concatenate([mask, pad], axis=2)


def _window_mask(
    kind: LayerKind, slot_pos: np.ndarray, positions: np.ndarray, base: int, past: int
) -> np.ndarray:
    """[1, 1, q + 1, past + WINDOW]: ring slots holding positions < base, then positions base..base+WINDOW-1."""
    p = positions[:, None]
    s = slot_pos[None, :past]
    ring_part = (s >= 0) & (s < base) & ((s < kind.sink) | (s >= p - kind.ring))
    t = base + np.arange(WINDOW, dtype=np.int64)[None, :]
    # NOTE: the ring bound matters in the window too when the ring is shorter than it: a position evicted
    # before p is hidden, as one-token decoding hides it (its gathered slot holds a later token by then)
    stage_part = (t <= p) & ((t < kind.sink) | (t >= p - kind.ring))
    if kind.window is not None:
        ring_part &= s > p - kind.window
        stage_part &= t > p - kind.window
    visible = np.concatenate([ring_part, stage_part], axis=1)
    return _pad_row(np.where(visible, np.float32(0), NEG_INF).astype(np.float32)[None, None])


def bound_prefix(capacity: int, filled: int, grain: int) -> int:
    """Ring slots to bind: the filled prefix rounded up to `grain` (shapes do not churn every token), at
    least one grain, at most the capacity. Unstaged steps bind it too (RingDecoder)."""
    return min(capacity, max(grain, -(-min(filled, capacity) // grain) * grain))


def staged_feeds(
    cache: RingKVCache, view: StepView, mask_layer: dict[int, int], grain: int, *, window: bool
) -> StagedFeeds:
    """The staged inputs of the step `view` began (`mask_layer`: kind -> a layer of that kind, as the graph's
    mask inputs are named); `window`: the windowed layout (the forward had at most WINDOW tokens), which must
    lie inside one window (the caller cuts it with `split_windows`)."""
    positions = view.positions
    q, p0 = int(positions.shape[0]), int(positions[0])
    if window:
        base = p0 // WINDOW * WINDOW
        if int(positions[-1]) >= base + WINDOW:
            raise ValueError(f"a windowed step of {q} tokens at {p0} crosses the window end {base + WINDOW}")
        past = {
            k: bound_prefix(cache.kinds[cache.layer_kind[i]].capacity, base, grain)
            for k, i in mask_layer.items()
        }
        masks = {
            f"mask_{k}": _window_mask(
                cache.kinds[cache.layer_kind[i]],
                view.slot_pos[cache.layer_kind[i]],
                positions,
                base,
                past[k],
            )
            for k, i in mask_layer.items()
        }
        keys, values = cache.gather(np.arange(base, base + WINDOW, dtype=np.int64))
        index = positions - base
    else:  # prefill: the step's own tokens are the staging window, the ring part as the unstaged graph binds it
        past = {
            k: bound_prefix(cache.kinds[cache.layer_kind[i]].capacity, cache.occupied(i), grain)
            for k, i in mask_layer.items()
        }
        masks = {f"mask_{k}": _pad_row(view.mask_prefix(i, past[k])) for k, i in mask_layer.items()}
        keys = values = _zeros(cache, q)
        index = np.arange(q, dtype=np.int64)
    staged_index = np.stack([np.zeros_like(index), index], axis=1)[None]
    return StagedFeeds(masks, past, keys, values, staged_index)


def _zeros(cache: RingKVCache, n: int) -> tuple[np.ndarray, ...]:
    shapes: dict[tuple[int, int], np.ndarray] = {}
    out: list[np.ndarray] = []
    for spec in cache.layers:
        key = (spec.n_kv_heads, spec.head_dim)
        if key not in shapes:
            shapes[key] = np.zeros((1, n, *key), cache.dtype)
        out.append(shapes[key])
    return tuple(out)


def split_windows(position: int, n_tokens: int) -> Sequence[tuple[int, int]]:
    """(start, stop) offsets of a windowed forward's pieces: it is cut where it crosses a window end."""
    pieces, start = [], 0
    while start < n_tokens:
        stop = min(n_tokens, window_end(position + start) - position)
        pieces.append((start, stop))
        start = stop
    return pieces


def piece_sizes(position: int, n_tokens: int) -> tuple[int, ...]:
    """Tokens in each forward a staged graph runs for a forward of n tokens at `position` (what it costs)."""
    if not windowed(n_tokens):
        return (n_tokens,)
    return tuple(stop - start for start, stop in split_windows(position, n_tokens))
