"""The stats bar's text: pure functions of what the model and the last generation report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edge import Model, Result
    from edge.session import KVState


@dataclass(frozen=True)
class ModelInfo:
    name: str
    backend: str
    device: str
    fallback: str | None
    draft: str | None
    chat_template: bool

    @staticmethod
    def of(model: Model) -> ModelInfo:
        return ModelInfo(
            model.name, model.backend, model.device, model.fallback, model.draft, model.has_chat_template
        )


@dataclass(frozen=True)
class Live:
    """A generation in progress: pieces so far and seconds since the first one."""

    pieces: int
    ttft_ms: float
    decode_s: float

    @property
    def tok_s(self) -> float:
        return (self.pieces - 1) / self.decode_s if self.pieces > 1 and self.decode_s > 0 else 0.0


def kv_text(kv: KVState) -> str:
    kind = "KV ring" if kv.ring else "KV"
    text = f"{kind} {kv.fill}/{kv.capacity} ({100 * kv.fill_ratio:.0f}%)"
    if kv.window_note:
        text += f" [b yellow]{kv.window_note}[/]"
    return text


def stats_text(
    info: ModelInfo | None,
    *,
    result: Result | None = None,
    kv: KVState | None = None,
    live: Live | None = None,
    status: str = "",
) -> str:
    """One line of Rich markup: model and placement, then the last (or running) generation, KV fill, notes."""
    parts: list[str] = []
    if info is not None:
        parts.append(f"[b]{info.name}[/] {info.backend}:{info.device}")
    if status:
        parts.append(status)
    if live is not None:
        parts.append(
            f"TTFT {live.ttft_ms:.0f} ms · {live.tok_s:.1f} tok/s · {live.pieces} tok [dim](generating)[/]"
        )
    elif result is not None:
        s = result.stats
        parts.append(
            f"TTFT {s.ttft_ms:.0f} ms · {s.decode_tok_s:.1f} tok/s · {s.n_tokens} tok ({s.stop_reason}) · "
            f"prompt {s.n_prompt_tokens}, {s.n_cached_tokens} reused"
        )
        if s.draft is not None:
            parts.append(s.draft.summary(brief=True))
        if kv is None and s.window_note:  # else kv_text says it
            parts.append(f"[b yellow]{s.window_note}[/]")
    if kv is not None:
        parts.append(kv_text(kv))
    if info is not None:
        if info.fallback:
            parts.append(f"[b yellow]fallback {info.fallback}[/]")
        if not info.chat_template:
            parts.append("[yellow]completion mode (no chat template)[/]")
    return " │ ".join(parts)
