"""Reasoning: a thinking model's `<think>...</think>` block told apart from its answer.

- `Thinking` is what a request asks (on, off, or the template's default; a token budget). `plan_thinking`
  checks it against the template's declared `ThinkingStyle` (models/chat_template.py): asking a model that does
  not think is a ThinkingError, never ignored. The plan gives the template its switch (`enable_thinking`) and,
  from the rendered prompt, the generation's `ThinkingConfig`.
- `ReasoningSplitter` splits the output text into reasoning and content as it streams (a tag may span pieces;
  nothing of the tags reaches either side).
- `ThinkingGate` is the constraint of a thinking generation that has a grammar or a budget (the interface of
  edge.grammar.Constraint): free while thinking, the close tag forced when the budget is spent, then the
  answer's own Constraint from the first token after the close.

NOTE (why a gate in front of the answer's Constraint, not one Lark grammar `start: think answer`): Qwen3's
`<think>` / `</think>` are user-defined tokens that edge marks special for llguidance, so no grammar text matches
them; tool calls are already Lark grammars and schemas llguidance's JSON, each compiled its own way. A gate keeps
every existing grammar unchanged, and the same small state machine carries the budget.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from edge.errors import ConstraintError, ThinkingError
from edge.models.chat_template import ThinkingStyle

if TYPE_CHECKING:
    from edge.grammar import Constraint
    from edge.models.tokenizer import Tokenizer

__all__ = [
    "ReasoningSplitter",
    "ReasoningText",
    "Thinking",
    "ThinkingConfig",
    "ThinkingGate",
    "ThinkingPlan",
    "plan_thinking",
    "split_reasoning",
]

MAX_GAP = (
    4  # whitespace tokens a model may write between the close tag and a constrained answer (Qwen3: "\n\n")
)
_WS = b" \t\n\r\f\v"


@dataclass(frozen=True)
class Thinking:
    """What a request asks of thinking. `on` None: the template's default (Qwen3 thinks); `budget`: the most
    thinking tokens, after which the close tag is forced. `param` names the request field in a refusal."""

    on: bool | None = None
    budget: int | None = None
    param: str = "reasoning"

    def __post_init__(self) -> None:
        if self.budget is not None and self.budget < 0:
            raise ThinkingError(f"a thinking budget is >= 0 tokens (got {self.budget})", param=self.param)

    @property
    def asks(self) -> bool:
        """It asks for thinking (what a model that does not think must refuse)."""
        return bool(self.on) or (self.budget is not None and self.on is not False)


@dataclass(frozen=True)
class ThinkingConfig:
    """What the generation knows of thinking. `start`: "thinking" (the prompt opened the block), "answer" (the
    prompt holds a closed one: thinking off) or "either" (the model opens it or answers). `budget` None: as the
    model likes; 0: no thinking (the empty block is forced)."""

    open: str
    close: str
    start: str
    budget: int | None = None
    # the request asked for thinking: a model that would answer at once is made to open the block
    opens: bool = False

    @property
    def gated(self) -> bool:
        """Whether the gate runs even without a grammar (a budget to keep, a block to open)."""
        if self.start == "answer":
            return False
        return self.budget is not None or (self.opens and self.start == "either")

    def splitter(self) -> ReasoningSplitter:
        return ReasoningSplitter(self.open, self.close, self.start)


@dataclass(frozen=True)
class ThinkingPlan:
    """A request's thinking on a model whose template thinks."""

    style: ThinkingStyle
    on: bool
    budget: int | None
    asked: bool = False  # on because the request said so (not the template's default)

    def template_kwargs(self) -> dict[str, Any]:
        return {} if self.style.switch is None else {self.style.switch: self.on}

    def config(self, prompt: str) -> ThinkingConfig:
        """The generation's config for the rendered `prompt` (where its last think tags leave the answer)."""
        s = self.style
        opened, closed = prompt.rfind(s.open), prompt.rfind(s.close)
        if opened > closed:
            start = "thinking"
        elif closed >= 0 and not prompt[closed + len(s.close) :].strip():
            start = "answer"
        else:
            start = "either"
        # off on a template with no switch: the empty block is forced (budget 0)
        budget = self.budget if self.on else (None if start == "answer" else 0)
        return ThinkingConfig(s.open, s.close, start, budget, opens=self.on and self.asked)


def plan_thinking(style: ThinkingStyle | None, asked: Thinking | None) -> ThinkingPlan | None:
    """`asked` on a template of `style` (None: it does not think). None: nothing of thinking applies."""
    asked = asked or Thinking()
    if style is None:
        if asked.asks:
            raise ThinkingError(
                "this model does not think (its chat template has no <think> block)",
                hint=f"leave {asked.param} unset or off, or load a thinking model (Qwen3, a DeepSeek-R1 distill)",
                param=asked.param,
            )
        return None
    return ThinkingPlan(style, asked.on is not False, asked.budget, asked.asks)


# -- splitting the text ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ReasoningText:
    """A piece of the model's thinking (what a stream sends as reasoning, not as content)."""

    text: str


class ReasoningSplitter:
    """Splits streamed text into reasoning and content: `feed` and `finish` give `(is_reasoning, text)` pieces.
    The reasoning is the text between the tags, stripped of the whitespace at its ends; the content is what
    follows the close tag, its leading whitespace dropped (as the templates render it back). A block never
    closed (cut by max_tokens) is all reasoning."""

    def __init__(self, open_tag: str, close_tag: str, start: str = "either") -> None:
        self.open, self.close = open_tag, close_tag
        self.state = {"thinking": "lead", "answer": "after", "either": "either"}[start]
        self._buf = ""  # text held back: a possible tag's beginning, or whitespace that may end the reasoning

    def feed(self, text: str) -> list[tuple[bool, str]]:
        self._buf += text
        out: list[tuple[bool, str]] = []
        while self._buf:
            before = (self.state, len(self._buf))
            self._step(out)
            if (self.state, len(self._buf)) == before:
                break  # waiting for more text
        return [p for p in out if p[1]]

    def finish(self) -> list[tuple[bool, str]]:
        buf, self._buf = self._buf, ""
        if self.state == "either":
            return [(False, buf)] if buf else []
        if self.state in ("lead", "thinking"):
            return [(True, buf.rstrip())] if buf.strip() else []
        return [(False, buf)] if buf and self.state == "content" else []

    def _step(self, out: list[tuple[bool, str]]) -> None:
        buf = self._buf
        if self.state == "either":
            head = buf.lstrip()
            if head.startswith(self.open):
                self._buf, self.state = head[len(self.open) :], "lead"
            elif head and not self.open.startswith(head):
                self.state = "content"
        elif self.state == "lead":  # the reasoning's leading whitespace is dropped, and an open tag written
            head = buf.lstrip()  # again where the prompt already opened the block (R1 distills' templates)
            if head.startswith(self.open):
                head = head[len(self.open) :].lstrip()
            elif self.open.startswith(head):
                self._buf = head
                return  # maybe the tag, not yet whole: wait
            self._buf = head
            if self._buf:
                self.state = "thinking"
        elif self.state == "thinking":
            at = buf.find(self.close)
            if at >= 0:
                out.append((True, buf[:at].rstrip()))
                self._buf, self.state = buf[at + len(self.close) :], "after"
                return
            keep = _held(buf, self.close)
            out.append((True, buf[: len(buf) - keep]))
            self._buf = buf[len(buf) - keep :]
        elif self.state == "after":  # the answer's leading whitespace is dropped
            self._buf = buf.lstrip()
            if self._buf:
                self.state = "content"
        else:
            out.append((False, buf))
            self._buf = ""


def _held(buf: str, tag: str) -> int:
    """How many characters at the end of `buf` to hold back: a beginning of `tag`, and the whitespace before
    it (trailing whitespace may end the reasoning, so it waits for what follows)."""
    keep = 0
    for n in range(min(len(tag) - 1, len(buf)), 0, -1):
        if tag.startswith(buf[-n:]):
            keep = n
            break
    rest = buf[: len(buf) - keep]
    return keep + len(rest) - len(rest.rstrip())


def split_reasoning(text: str, config: ThinkingConfig | None) -> tuple[str, str]:
    """A whole answer as (reasoning, content)."""
    if config is None:
        return "", text
    splitter = config.splitter()
    pieces = [*splitter.feed(text), *splitter.finish()]
    return "".join(t for r, t in pieces if r), "".join(t for r, t in pieces if not r)


# -- the gate --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _State:
    phase: str  # force | think | gap | answer
    queue: tuple[int, ...] = ()  # force: the tokens still to force
    then: str = "think"  # force: the phase after the queue
    n_think: int = 0
    tail: bytes = b""  # think: the last bytes of the thinking (a close tag may be under way)
    gap: int = 0


class ThinkingGate:
    """A thinking generation's constraint (edge.grammar.Constraint's interface): while thinking every token
    but the end of generation (with a grammar to honour) and any that would run past the close tag into
    the answer; the close forced when the budget is spent; then whitespace and the answer's `inner` grammar
    (None: free)."""

    def __init__(
        self, config: ThinkingConfig, tokenizer: Tokenizer, n_vocab: int, inner: Constraint | None = None
    ) -> None:
        self.config, self.inner, self.n_vocab = config, inner, n_vocab
        self._tok = tokenizer
        self._vocab = _vocabulary(tokenizer, n_vocab)
        self._close = config.close.encode()
        self._open_ids = tokenizer.encode(config.open + "\n", continues=True)
        self._close_ids = tokenizer.encode("\n" + config.close + "\n\n", continues=True)
        self._history: list[tuple[_State, bool]] = []  # per consumed token: the state before, inner advanced
        self.state = self._first()
        # the grammar module's Grammar, for messages that name it
        self.grammar = None if inner is None else inner.grammar

    def _first(self) -> _State:
        cfg = self.config
        if cfg.start == "answer":
            return _State("answer")
        empty = cfg.budget == 0
        if cfg.start == "thinking":
            return _State("force", tuple(self._close_ids), "answer") if empty else _State("think")
        if empty:  # Qwen3's own empty block, as its template writes it for enable_thinking=False
            ids = self._tok.encode(f"{cfg.open}\n\n{cfg.close}\n\n", continues=True)
            return _State("force", tuple(ids), "answer")
        return _State("force", tuple(self._open_ids), "think")

    # -- the Constraint interface
    @property
    def done(self) -> bool:
        return self.state.phase == "answer" and self.inner is not None and self.inner.done

    @property
    def accepting(self) -> bool:
        if self.state.phase in ("force", "think"):
            return False
        return self.inner is None or self.inner.accepting

    def allowed(self) -> np.ndarray:
        s = self.state
        if s.phase == "force":
            mask = np.zeros(self.n_vocab, dtype=bool)
            mask[s.queue[0]] = True
            return mask
        if s.phase == "think":
            return self._vocab.thinking(self._close, _partial(s.tail, self._close), self.inner is not None)
        if self.inner is None:
            return self._vocab.free()
        if s.phase == "gap" and s.gap + 1 < MAX_GAP:  # the last gap token goes to the answer's grammar
            return self.inner.allowed() | self._vocab.whitespace()
        return self.inner.allowed()

    def forced(self) -> list[int]:
        s = self.state
        if s.phase == "force":
            return list(s.queue)
        if s.phase == "answer" and self.inner is not None:
            return self.inner.forced()
        return []

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        ids = [int(t) for t in tokens]
        taken = 0
        while taken < len(ids) and self.state.phase != "answer" and self._admits(ids[taken]):
            self.advance(ids[taken])
            taken += 1
        n = taken
        if n < len(ids) and self.state.phase == "answer":
            n += len(ids) - n if self.inner is None else self.inner.valid_prefix(ids[n:])
        self.rollback(taken)
        return n

    def advance(self, token: int) -> None:
        token = int(token)
        if self.state.phase != "answer" and not self._admits(token):
            raise ConstraintError(f"token {token} does not continue the thinking block as it must")
        before = self.state
        self.state, to_inner = self._next(before, token)
        if to_inner:
            assert self.inner is not None
            self.inner.advance(token)
        self._history.append((before, to_inner))

    def rollback(self, n: int) -> None:
        if n > len(self._history):
            raise ConstraintError(f"the thinking gate cannot roll back {n} tokens")
        if not n:
            return
        popped = self._history[-n:]
        del self._history[-n:]
        inner = sum(1 for _, adv in popped if adv)
        if inner:
            assert self.inner is not None
            self.inner.rollback(inner)
        self.state = popped[0][0]

    # -- the state machine
    def _admits(self, token: int) -> bool:
        s = self.state
        if s.phase == "force":
            return token == s.queue[0]
        if s.phase == "think":
            return bool(self.allowed()[token])
        if self.inner is None:
            return True
        if s.phase == "gap" and s.gap + 1 < MAX_GAP and self._vocab.whitespace()[token]:
            return True
        return self.inner.valid_prefix([token]) == 1

    def _next(self, s: _State, token: int) -> tuple[_State, bool]:
        """The state after `token`, and whether the answer's grammar takes it."""
        if s.phase == "force":
            queue = s.queue[1:]
            if queue:
                return replace(s, queue=queue), False
            return _State(s.then), False
        if s.phase == "think":
            text = s.tail + self._vocab.bytes(token)
            if self._close in text:
                return _State("gap" if self.inner is not None else "answer"), False
            n = s.n_think + 1
            if self.config.budget is not None and n >= self.config.budget:
                return _State("force", tuple(self._close_ids), "answer"), False
            return _State("think", n_think=n, tail=text[-(len(self._close) - 1) :]), False
        if s.phase == "gap":
            assert self.inner is not None
            ws = bool(self._vocab.whitespace()[token])
            if ws and s.gap + 1 < MAX_GAP and self.inner.valid_prefix([token]) == 0:
                return replace(s, gap=s.gap + 1), False
            return _State("answer"), True
        return s, self.inner is not None


def _partial(tail: bytes, tag: bytes) -> int:
    """The longest end of `tail` that begins `tag` (0..len(tag)-1): how much of a close tag is under way."""
    for n in range(min(len(tag) - 1, len(tail)), 0, -1):
        if tag.startswith(tail[-n:]):
            return n
    return 0


class _Vocabulary:
    """What the gate reads of a vocabulary, computed once per tokenizer and logits width: each token's bytes,
    the whitespace tokens, and the thinking masks."""

    def __init__(self, tokenizer: Tokenizer, n_vocab: int) -> None:
        self.n_vocab = n_vocab
        self._bytes = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        self._eog = sorted(tokenizer.eog_ids)
        self._special = {i for i in range(tokenizer.vocab_size) if tokenizer.is_special(i)}
        self._ws: np.ndarray | None = None
        self._think: dict[tuple[bytes, int, bool], np.ndarray] = {}
        self._lock = threading.Lock()

    def bytes(self, token: int) -> bytes:
        return self._bytes[token] if token < len(self._bytes) else b""

    def free(self) -> np.ndarray:
        """Every token (not the logits' padding past the vocabulary)."""
        return self.thinking(b"", 0, False)  # an empty tag bans nothing

    def whitespace(self) -> np.ndarray:
        if self._ws is None:
            mask = np.zeros(self.n_vocab, dtype=bool)
            for i, b in enumerate(self._bytes):
                mask[i] = bool(b) and not b.strip(_WS) and i not in self._special
            mask.flags.writeable = False
            self._ws = mask
        return self._ws

    def thinking(self, tag: bytes, k: int, no_end: bool) -> np.ndarray:
        """What may follow thinking whose last k bytes begin the close `tag`: not a token that completes the
        tag and goes on into the answer (the answer's grammar could not see that text), nor, with `no_end`
        (a grammar to honour), the end of generation."""
        key = (tag, k, no_end)
        with self._lock:
            if key not in self._think:
                mask = np.ones(self.n_vocab, dtype=bool)
                mask[len(self._bytes) :] = False  # the logits' padding is no token
                head = tag[:k]
                for i, b in enumerate(self._bytes if tag else ()):
                    text = head + b
                    at = text.find(tag)
                    if at >= 0 and text[at + len(tag) :].strip(_WS):
                        mask[i] = False
                if no_end:
                    mask[self._eog] = False
                mask.flags.writeable = False  # shared by every generation on this vocabulary
                self._think[key] = mask
            return self._think[key]


_VOCABS: weakref.WeakKeyDictionary[Tokenizer, dict[int, _Vocabulary]] = weakref.WeakKeyDictionary()
_VOCABS_LOCK = threading.Lock()


def _vocabulary(tokenizer: Tokenizer, n_vocab: int) -> _Vocabulary:
    with _VOCABS_LOCK:
        per_width = _VOCABS.setdefault(tokenizer, {})
        if n_vocab not in per_width:
            per_width[n_vocab] = _Vocabulary(tokenizer, n_vocab)
        return per_width[n_vocab]
