"""Constrained decoding: a grammar (a JSON Schema, any JSON object, a regex, a Lark grammar) as a token mask
applied to the logits before sampling, advanced with every token the generation keeps.

The engine is llguidance (an Earley parser over the tokenizer's byte trie; benchmarks/grammar_engines.py
says why it was chosen). A JSON Schema is first checked against its meta-schema (the `jsonschema` library),
then compiled by llguidance with `lenient` off, so a keyword the engine cannot enforce is an error naming it,
never a silently looser answer. Compilation is bounded by the schema's size and llguidance's fuel limits.

NOTE: JSON is generated compact-ish (", " and ": " separators, no free whitespace), so that a value that is
complete leaves nothing to sample but the end: a model cannot pad a finished object with newlines up to
`max_tokens`.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from edge.errors import ConstraintError, GrammarError
from edge.schemas import check_schema, read_schema

if TYPE_CHECKING:
    from edge.models.tokenizer import Tokenizer

__all__ = [
    "KINDS",
    "MAX_GRAMMAR_BYTES",
    "Constraint",
    "Grammar",
    "check_grammar",
    "cli_grammar",
    "compile_grammar",
    "grammar_of",
    "schema_file",
]

KINDS = ("json_schema", "json_object", "regex", "lark")
MAX_GRAMMAR_BYTES = 256 * 1024  # a schema or grammar text larger than this is refused before compiling
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_LIMITS = {"max_grammar_size": 200_000, "initial_lexer_fuel": 2_000_000, "step_lexer_fuel": 400_000}


@dataclass(frozen=True)
class Grammar:
    """What the output must match. `source`: the JSON Schema as JSON text, the regex, or the Lark grammar
    ("" for json_object)."""

    kind: str
    source: str = ""
    # what reading a client's schema dropped (annotation keys): said to the client, never part of equality
    notes: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GrammarError(f"unknown grammar kind {self.kind!r}", hint=f"use one of {', '.join(KINDS)}")
        if len(self.source.encode("utf-8", "surrogatepass")) > MAX_GRAMMAR_BYTES:
            raise GrammarError(
                f"the {self.kind.replace('_', ' ')} is larger than {MAX_GRAMMAR_BYTES // 1024} KiB",
                hint="send a smaller schema",
            )
        if self.kind == "json_schema":
            check_schema(self.schema())
        _validate(self, None)  # a Grammar that exists can be enforced: refused here, before any model work

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | str) -> Grammar:
        """A client's JSON Schema (a mapping, or its JSON text), read as the engine enforces it (annotation keys
        dropped and noted, other drafts' spellings translated), checked against its meta-schema and the engine."""
        if isinstance(schema, str):
            if len(schema.encode("utf-8", "surrogatepass")) > MAX_GRAMMAR_BYTES:
                return cls("json_schema", schema)  # refused for its size, before parsing
            schema = _parse(schema)
        read = read_schema(schema)
        return cls("json_schema", json.dumps(read.schema), read.notes)

    @classmethod
    def json_object(cls) -> Grammar:
        return cls("json_object")

    def schema(self) -> dict[str, Any]:
        """The JSON Schema this grammar enforces (json_object: any object)."""
        if self.kind == "json_object":
            return {"type": "object"}
        if self.kind != "json_schema":
            raise GrammarError(f"a {self.kind} grammar has no JSON Schema")
        return _parse(self.source)


def _parse(source: str) -> dict[str, Any]:
    try:
        value = json.loads(source)
    except ValueError as exc:
        raise GrammarError(f"the JSON Schema is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise GrammarError(f"a JSON Schema is an object, not {type(value).__name__}")
    return value


def cli_grammar(json_schema: str | None, json_object: bool) -> Grammar | None:
    """`--json-schema FILE` / `--json-object` of edge run and edge bench (None: neither given)."""
    if json_object:
        return Grammar.json_object()
    return None if json_schema is None else schema_file(json_schema)


def schema_file(path: str) -> Grammar:
    """The JSON Schema in the file at `path` (edge run / edge bench --json-schema FILE)."""
    try:
        with open(path, encoding="utf-8") as f:
            return Grammar.json_schema(json.load(f))
    except OSError as exc:
        raise GrammarError(f"cannot read --json-schema {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise GrammarError(f"--json-schema {path} is not JSON: {exc}") from None


def grammar_of(response_format: Grammar | Mapping[str, Any]) -> Grammar | None:
    """A Grammar from OpenAI's `response_format` ({"type": "text"} is None: no constraint); a shape or key it
    does not know is an error, never an unconstrained answer."""
    if isinstance(response_format, Grammar):
        return response_format
    if not isinstance(response_format, Mapping):
        raise GrammarError(f"response_format is an object, not {type(response_format).__name__}")
    kind = response_format.get("type")
    _only_keys(response_format, {"type", "json_schema", "schema"}, "response_format")
    if kind == "text" and set(response_format) == {"type"}:
        return None
    if kind == "json_object":
        schema = response_format.get("schema")  # llama.cpp's server takes a schema here too
        if "json_schema" in response_format:
            raise GrammarError(
                "response_format json_object takes no json_schema", hint='use "type": "json_schema"'
            )
        return Grammar.json_object() if schema is None else Grammar.json_schema(schema)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping) or "schema" in response_format:
            raise GrammarError(
                'response_format json_schema needs "json_schema": {"name": ..., "schema": {...}}'
            )
        _only_keys(spec, {"name", "schema", "strict", "description"}, "response_format.json_schema")
        if not isinstance(spec.get("schema"), Mapping):
            raise GrammarError("response_format.json_schema.schema must be a JSON Schema object")
        return Grammar.json_schema(spec["schema"])  # strict or not: edge always enforces it
    raise GrammarError(
        f"response_format type {kind!r} is not supported", hint='use "text", "json_object" or "json_schema"'
    )


def _only_keys(value: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(value) - known)
    if unknown:
        raise GrammarError(f"{where} has unknown keys {unknown}", hint=f"known: {', '.join(sorted(known))}")


class Constraint:
    """One generation's grammar state: the mask of the next token, advanced with each kept token."""

    def __init__(self, matcher: Any, n_vocab: int, grammar: Grammar) -> None:
        self._m = matcher
        self.grammar = grammar
        self.n_vocab = n_vocab
        self._bits = np.zeros((n_vocab + 31) // 32, dtype=np.int32)

    @property
    def done(self) -> bool:
        """The output is complete: nothing may follow but the end."""
        return bool(self._m.is_stopped())

    @property
    def accepting(self) -> bool:
        """The output so far is a complete match (it may stop here)."""
        return bool(self._m.is_accepting())

    def allowed(self) -> np.ndarray:
        """Which token ids may come next (bool, n_vocab)."""
        self._m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        self._check()
        return np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self.n_vocab].astype(bool)

    def forced(self) -> list[int]:
        """The tokens the grammar admits as the only continuation from here (llguidance's fast-forward
        tokens: the forced bytes in the vocabulary's spelling, short of a last token a longer one could
        replace); [] when the next token is a choice."""
        ids = self._m.compute_ff_tokens()
        self._check()
        return list(ids)

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, in order, the grammar admits from here (its state unchanged): a draft is cut
        there."""
        n = int(self._m.validate_tokens([int(t) for t in tokens]))
        self._check()
        return n

    def advance(self, token: int) -> None:
        if not self._m.consume_token(int(token)):
            self._check()
            raise ConstraintError(
                f"token {token} does not continue the {self.grammar.kind.replace('_', ' ')}"
            )

    def rollback(self, n: int) -> None:
        if n and not self._m.rollback(n):
            self._check()
            raise ConstraintError(f"the grammar cannot roll back {n} tokens")

    def _check(self) -> None:
        if self._m.is_error():
            raise ConstraintError(f"constrained decoding failed: {self._m.get_error()}")


def compile_grammar(grammar: Grammar, tokenizer: Tokenizer, n_vocab: int) -> Constraint:
    """A fresh Constraint for `grammar` over `tokenizer`'s ids, masks `n_vocab` wide (the logits' width)."""
    import llguidance

    lltok = ll_tokenizer(tokenizer, n_vocab)
    text, limits = _validate(grammar, lltok)
    matcher = llguidance.LLMatcher(lltok, text, log_level=0, limits=limits)
    if matcher.is_error():  # the grammar itself, over this vocabulary: the request's to fix
        raise GrammarError(f"the {grammar.kind.replace('_', ' ')} cannot be enforced: {matcher.get_error()}")
    return Constraint(matcher, n_vocab, grammar)


def _validate(grammar: Grammar, lltok: Any) -> tuple[str, Any]:
    """llguidance's grammar text for `grammar` and the limits it runs under; GrammarError naming what the
    engine refuses (an unimplemented keyword and where it stands, an unsatisfiable schema, a bad regex)."""
    import llguidance

    if grammar.kind in ("json_schema", "json_object"):
        text = llguidance.LLMatcher.grammar_from_json_schema(
            grammar.schema(), overrides={**_JSON_OPTIONS, "lenient": False}
        )
    elif grammar.kind == "regex":
        text = llguidance.LLMatcher.grammar_from_regex(grammar.source)
    else:
        text = llguidance.LLMatcher.grammar_from_lark(grammar.source)
    limits = llguidance.LLParserLimits(**_LIMITS, verbose_errors=False)
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, lltok, limits=limits)
    if failed:
        where = _keyword_paths(grammar, messages[0])
        raise GrammarError(
            f"the {grammar.kind.replace('_', ' ')} cannot be enforced: {messages[0]}{where}",
            hint="remove or change what the message names",
        )
    return text, limits


def _keyword_paths(grammar: Grammar, message: str) -> str:
    """Where in the schema the keywords llguidance names as unimplemented stand (JSON pointers)."""
    head = "Unimplemented keys: "
    if grammar.kind != "json_schema":
        return ""
    if message.startswith("oneOf constraints are not supported"):
        keys = {"oneOf"}  # those left are the ones edge could not prove disjoint (edge/schemas.py)
    elif head in message:
        try:
            keys = set(json.loads(message.split(head, 1)[1].split("]", 1)[0] + "]"))
        except ValueError:
            return ""
    else:
        return ""
    found: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k in keys:
                    found.append(f"{path}/{k}")
                walk(v, f"{path}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}/{i}")

    walk(grammar.schema(), "#")
    return f" (at {', '.join(found[:8])})" if found else ""


def check_grammar(grammar: Grammar, tokenizer: Tokenizer, n_vocab: int) -> None:
    """Raise GrammarError where `grammar` cannot be enforced over this vocabulary (what compile_grammar
    refuses), without keeping the compiled state."""
    compile_grammar(grammar, tokenizer, n_vocab)


# one llguidance tokenizer per (edge tokenizer, logits width): building it walks the whole vocabulary (~1 s)
_TOKENIZERS: weakref.WeakKeyDictionary[Tokenizer, dict[int, Any]] = weakref.WeakKeyDictionary()
_TOKENIZERS_LOCK = threading.Lock()


def ll_tokenizer(tokenizer: Tokenizer, n_vocab: int) -> Any:
    """llguidance's view of `tokenizer`: every id's bytes (special tokens marked with a 0xff prefix, so a
    grammar's text never matches them), padded with empty tokens up to the logits' width."""
    import llguidance

    with _TOKENIZERS_LOCK:
        per_width = _TOKENIZERS.setdefault(tokenizer, {})
        if n_vocab not in per_width:
            per_width[n_vocab] = llguidance.LLTokenizer(
                llguidance.TokenizerWrapper(_Vocabulary(tokenizer, n_vocab)),
                n_vocab=n_vocab,
                eos_token=sorted(tokenizer.eog_ids) or None,
            )
        return per_width[n_vocab]


class _Vocabulary:
    """What llguidance.TokenizerWrapper reads of a tokenizer."""

    def __init__(self, tokenizer: Tokenizer, n_vocab: int) -> None:
        self._tok = tokenizer
        special = [i for i in range(tokenizer.vocab_size) if tokenizer.is_special(i)]
        tokens = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        for i in special:
            tokens[i] = b"\xff" + tokens[i]
        self.tokens = tokens + [b""] * max(0, n_vocab - len(tokens))
        self.special_token_ids = special
        eos = tokenizer.eos_id if tokenizer.eos_id is not None else next(iter(sorted(tokenizer.eog_ids)), 0)
        self.eos_token_id = eos
        self.bos_token_id = tokenizer.bos_id
        self._by_bytes: dict[bytes, int] | None = None  # for _greedy, built on first need
        self._longest = 1

    def __call__(self, text: bytes) -> list[int]:
        """The tokens of a piece of output (bytes llguidance forces): the model's own tokenization where its
        bytes are exactly `text` (no space prefix: it continues earlier text), else the longest tokens that
        spell it (a vocabulary whose SentencePiece spaces fall back to bytes spells " " otherwise)."""
        ids = self._tok.encode(text.decode("utf-8", "replace"), parse_special=False, continues=True)
        if b"".join(self.tokens[i] for i in ids) == text:
            return ids
        return self._greedy(text)

    def _greedy(self, text: bytes) -> list[int]:
        if self._by_bytes is None:
            special = set(self.special_token_ids)
            self._by_bytes = {t: i for i, t in enumerate(self.tokens) if t and i not in special}
            self._longest = max(map(len, self._by_bytes), default=1)
        out, at = [], 0
        while at < len(text):
            for n in range(min(self._longest, len(text) - at), 0, -1):
                tid = self._by_bytes.get(text[at : at + n])
                if tid is not None:
                    out.append(tid)
                    at += n
                    break
            else:
                raise GrammarError(f"no token spells byte {text[at]:#04x} of the grammar's text")
        return out
