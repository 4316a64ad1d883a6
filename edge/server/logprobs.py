"""OpenAI's logprobs shapes: what a request asks for, and the entries as chat and legacy completions give them.

Chat: `logprobs: true` + `top_logprobs: 0..20` -> `choices[0].logprobs = {"content": [entry, ...]}`.
Completions (legacy): `logprobs: N` (0..20; OpenAI allows 0..5) -> `{"tokens", "token_logprobs",
"top_logprobs" (one dict per token), "text_offset"}`, offsets counted in the completion's text (a token that is part of a UTF-8 sequence counts as
its U+FFFD).
What the numbers are is said in edge/logprobs.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from edge.logprobs import MAX_TOP_LOGPROBS, TokenLogprob
from edge.server.unsupported import UnsupportedValue


class LoggedPiece(str):
    """A streamed text piece carrying the entries of the tokens generated with it (a str, so the job's
    queue and the text it adds up to stay as they are)."""

    logprobs: tuple[TokenLogprob, ...] = ()


def piece(text: str, entries: Sequence[TokenLogprob]) -> LoggedPiece:
    out = LoggedPiece(text)
    out.logprobs = tuple(entries)
    return out


def _bad(param: str, message: str) -> Exception:
    return UnsupportedValue(param, message)


def chat_top(logprobs: bool | int | None, top_logprobs: int | None) -> int | None:
    """The alternatives a chat request asks for, None for no logprobs; out-of-range values are a 400."""
    if logprobs is not None and not isinstance(logprobs, bool):
        raise _bad("logprobs", "logprobs must be true or false on /v1/chat/completions")
    if top_logprobs is not None and not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
        raise _bad("top_logprobs", f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}")
    if not logprobs:
        if top_logprobs:
            raise _bad("top_logprobs", "top_logprobs needs logprobs: true")
        return None
    return top_logprobs or 0


def completion_top(logprobs: bool | int | None) -> int | None:
    """The alternatives a legacy completion asks for (`logprobs: N`), None for none."""
    if logprobs is None or logprobs is False:
        return None
    if isinstance(logprobs, bool) or not 0 <= logprobs <= MAX_TOP_LOGPROBS:
        raise _bad("logprobs", f"logprobs must be an integer between 0 and {MAX_TOP_LOGPROBS}")
    return logprobs


def _entry(e: TokenLogprob) -> dict[str, Any]:
    return {"token": e.token, "logprob": e.logprob, "bytes": list(e.bytes)}


def chat_logprobs(entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    content = [{**_entry(e), "top_logprobs": [_entry(t) for t in e.top]} for e in entries]
    return {"content": content, "refusal": None}


def completion_logprobs(entries: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """The legacy shape; `offset`: where the first token's text starts in the completion."""
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e.token)
    return {
        "tokens": [_legacy(e) for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{_legacy(t): t.logprob for t in e.top} for e in entries],
        "text_offset": offsets,
    }


def _legacy(e: TokenLogprob) -> str:
    """A token's text in the legacy shape, which has no bytes: part of a UTF-8 sequence is spelled as OpenAI
    does, `bytes:\\xe2\\x80`, so two such alternatives never share a key."""
    try:
        return bytes(e.bytes).decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in e.bytes)


def relay(pieces: Iterable[str], entries: list[TokenLogprob], emit: Callable[[str], None]) -> None:
    """Emit each piece with the entries of the tokens generated since the last one (`entries` fills as the
    generation runs); tokens whose text a stop string held back come in a last, empty piece."""
    sent = 0
    for text in pieces:
        emit(piece(text, entries[sent:]))
        sent = len(entries)
    if sent < len(entries):
        emit(piece("", entries[sent:]))


def result_logprobs(entries: Sequence[TokenLogprob] | None, chat: bool) -> dict[str, Any] | None:
    """A whole response's `logprobs` (None when not asked)."""
    if entries is None:
        return None
    return chat_logprobs(entries) if chat else completion_logprobs(entries)


class ChunkLogprobs:
    """Each stream chunk's `logprobs`, the legacy text offsets running on across chunks."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.offset = 0

    def __call__(self, item: str) -> dict[str, Any] | None:
        if not isinstance(item, LoggedPiece):
            return None
        if self.chat:
            return chat_logprobs(item.logprobs)
        out = completion_logprobs(item.logprobs, self.offset)
        self.offset += sum(len(e.token) for e in item.logprobs)
        return out
