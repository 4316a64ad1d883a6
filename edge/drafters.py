"""Drafters for speculative decoding: a small draft model on any `Decoder`, or prompt lookup (n-grams).

A drafter proposes up to k next tokens for a history; `edge.speculative` verifies them on the target, asking
several drafters in turn (`--draft auto`: prompt lookup, then a draft model where lookup finds nothing).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from edge.devices.base import Decoder, rollback_limit, rollback_reach, warm_kernels
from edge.errors import EdgeError, VocabMismatchError
from edge.history import common_prefix
from edge.sampling import SamplingConfig, apply_repeat_penalty, mask_logits, probabilities

if TYPE_CHECKING:
    from edge.grammar import Constraint
    from edge.models.tokenizer import Tokenizer

__all__ = [
    "Draft",
    "Drafter",
    "ModelDrafter",
    "NgramDrafter",
    "auto_drafts_on",
    "check_vocab_compatible",
    "open_drafter",
    "open_drafters",
    "verify_backend",
]

log = logging.getLogger(__name__)

# As llama.cpp's common_speculative_are_compatible: vocabularies may differ in size by this much (padding,
# added tokens), and the first few ids (special tokens that differ between fine-tunes) are not compared.
VOCAB_MAX_SIZE_DIFFERENCE = 128
VOCAB_CHECK_START_ID = 5
# `--draft auto` takes a draft model only when its file is at most this fraction of the target's: a drafted
# token must cost far less than a target step (the 0.5b for the 1.5b: 0.44 of the file, 0.39 of the step)
AUTO_DRAFT_MAX_SIZE = 0.5
# backends whose batched forward is cheap (a forward of 8 tokens: ~2 decode steps) and whose verify takes
# the same kernels as their decode; llama.cpp's costs ~5 steps and rounds differently (docs/performance.md)
AUTO_DRAFT_BACKENDS = ("ort", "openvino")
# A draft call's history extends the previous call's except in its last tokens, at most this many: a round's
# forced tokens (a grammar's, fast-forward) lead its draft and are not all kept (edge.fastforward.FF_MAX)
LOOKAHEAD = 64


@dataclass(frozen=True)
class Draft:
    tokens: list[int]
    # q rows the tokens were sampled from ([vocab] each, the target's vocabulary size);
    # None: a deterministic draft (greedy or lookup), i.e. q is one-hot on each token
    probs: list[np.ndarray] | None = None
    # how the drafter came by it, as a class whose acceptance is estimated on its own (lookup: 1 when the
    # tokens before the matched n-gram agree too, i.e. a copied passage, else 0)
    kind: int = 0


class Drafter(Protocol):
    name: str
    max_k: int | None  # most tokens one draft may hold (a draft model's rollback limit); None: no limit
    # True: drafting costs next to nothing, so speculation drafts the most it may and then keeps as many
    # tokens as the draft's kind is worth (a draft model drafts exactly the k it is asked for)
    free: bool

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Start a generation on this prompt (a draft model prefills it)."""
        ...

    def draft(
        self,
        history: Sequence[int],
        k: int,
        sampling: SamplingConfig,
        rng: np.random.Generator,
        constraint: Constraint | None = None,
    ) -> Draft:
        """Up to k tokens to follow `history`, which extends the history of the previous call. `constraint`:
        the grammar's state after `history`; every drafted token is one it admits, and its state is the same
        on return."""
        ...

    def warm_up(self, opening: Sequence[int]) -> None:
        """Before the first generation (`Model.warm_up`): `opening` starts every first prompt."""
        ...

    def close(self) -> None: ...


class ModelDrafter:
    """A draft model. Its KV cache follows the history: the common prefix is kept, rejected tokens rolled back.

    `p_min` stops a draft after a token the draft model gave less probability than that (as llama.cpp's
    speculative example): where the draft is unsure the target rarely agrees, and each drafted token costs.
    """

    def __init__(
        self, decoder: Decoder, name: str, n_vocab: int, *, p_min: float = 0.0, lazy: bool = False
    ) -> None:
        self.decoder = decoder
        self.name = name
        self.n_vocab = n_vocab  # the target's: draft rows are cut or padded to it
        self.p_min = p_min
        # lazy: prefill the prompt at the first draft, not at begin (a fallback drafter may never be asked,
        # and its prefill would only delay the first token)
        self.lazy = lazy
        self._prompt: list[int] | None = None
        limit = rollback_limit(decoder)
        # the draft KV holds k - 1 drafted tokens when verification starts, so k - 1 may need rolling back
        self.max_k = None if limit is None else int(limit) + 1
        self.free = False
        self._tokens: list[int] = []  # what the draft KV holds
        self._synced = 0  # history length at the last call: that prefix, but its last LOOKAHEAD, is unchanged

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Prefill all but the last prompt token (the first draft feeds it, for its logits), keeping what the
        KV already holds of it (a chat's earlier turns)."""
        if self.lazy:
            self._prompt = list(prompt_ids)
            return
        self._prefill(prompt_ids)

    def warm_up(self, opening: Sequence[int]) -> None:
        """The draft decoder's first-run kernels where it has them, then `opening` held in its KV (the first
        generation's prefill keeps it), on a drafter not used yet."""
        if self._tokens or self.decoder.position:
            return
        if self.decoder.capabilities().first_run_costs:
            warm_kernels(self.decoder)
        if opening:
            self._prefill([*opening, opening[-1]])  # all but the last id are prefilled

    def _prefill(self, prompt_ids: Sequence[int]) -> None:
        self._prompt = None
        dec, tokens = self.decoder, self._tokens
        head = list(prompt_ids[:-1])
        keep = common_prefix(tokens, head)
        limit = rollback_limit(dec)
        if dec.position != len(tokens) or (limit is not None and len(tokens) - keep > limit):
            keep = 0  # used behind our back, or too far to roll back
        if keep == 0:
            dec.reset()
        elif keep < len(tokens):
            dec.rollback(len(tokens) - keep)
        del tokens[keep:]
        if len(head) > keep:
            dec.forward(head[keep:], last_only=True)
            tokens.extend(head[keep:])
        self._synced = len(tokens)

    def _sync(self, history: Sequence[int]) -> np.ndarray:
        """Bring the KV to `history` and return the logits row for the position after it."""
        tokens, n = self._tokens, max(0, self._synced - LOOKAHEAD)
        end = min(len(tokens), len(history))
        while n < end and tokens[n] == history[n]:
            n += 1
        n = min(n, len(history) - 1)  # feed at least one token: its row is the one we need
        reach = rollback_reach(self.decoder)
        if reach is not None and len(tokens) - n > reach:  # too far back to undo: feed it all again
            self.decoder.reset()
            tokens.clear()
            n = 0
        if n < len(tokens):
            self.decoder.rollback(len(tokens) - n)
            del tokens[n:]
        feed = list(history[n:])
        tokens.extend(feed)
        self._synced = len(history)
        return self.decoder.forward(feed, last_only=True)[-1]

    def _row(self, logits: np.ndarray) -> np.ndarray:
        n = self.n_vocab
        if logits.shape[0] >= n:
            return logits[:n]
        return np.concatenate([logits, np.full(n - logits.shape[0], -np.inf, dtype=logits.dtype)])

    def draft(
        self,
        history: Sequence[int],
        k: int,
        sampling: SamplingConfig,
        rng: np.random.Generator,
        constraint: Constraint | None = None,
    ) -> Draft:
        """With a grammar, each row is masked by it before the draw, so q (what the rejection rule divides
        by) is the distribution the token was really drawn from; the grammar is advanced with each drafted
        token and rolled back at the end."""
        dec = self.decoder
        k = min(k, dec.n_ctx - len(history) + 1)  # the KV will hold history + k - 1 tokens
        if k <= 0:
            return Draft([])
        if self._prompt is not None:
            self._prefill(self._prompt)
        logits = self._sync(history)
        penalize = sampling.repeat_penalty != 1.0 and sampling.repeat_last_n != 0
        recent = (
            list(history[-sampling.repeat_last_n :] if sampling.repeat_last_n > 0 else history)
            if penalize
            else []
        )
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        try:
            for i in range(k):
                row = self._row(logits)
                if constraint is not None:
                    row = mask_logits(row, constraint.allowed())
                    if not np.isfinite(row).any():  # it admits only ids past the draft's vocabulary
                        break
                if penalize:
                    row = apply_repeat_penalty(row, recent, sampling.repeat_penalty, sampling.repeat_last_n)
                token, q, confidence = self._pick(row, sampling, rng)
                if constraint is not None:
                    constraint.advance(token)
                tokens.append(token)
                if penalize:
                    recent.append(token)
                if q is not None:
                    probs.append(q)
                unsure = self.p_min > 0.0 and confidence < self.p_min
                if i == k - 1 or unsure or (constraint is not None and constraint.done):
                    break
                logits = dec.forward([token], last_only=True)[-1]
                self._tokens.append(token)
        finally:
            if constraint is not None:
                constraint.rollback(len(tokens))
        return Draft(tokens, None if sampling.greedy else probs)

    def _pick(
        self, row: np.ndarray, sampling: SamplingConfig, rng: np.random.Generator
    ) -> tuple[int, np.ndarray | None, float]:
        """(token, the q row it was drawn from (None: greedy), the draft's confidence in it)."""
        if sampling.greedy:
            token = int(np.argmax(row))
            if self.p_min <= 0.0:
                return token, None, 1.0
            return token, None, 1.0 / float(np.exp(row - row[token]).sum())  # softmax at the argmax
        q = probabilities(row, sampling)
        token = int(rng.choice(q.shape[0], p=q))
        return token, q, float(q[token])

    def close(self) -> None:
        self.decoder.close()


class NgramDrafter:
    """Prompt lookup: find an earlier occurrence of the history's last n tokens (longest n first) and propose
    what followed it. Of several occurrences the one whose preceding tokens match the history longest wins
    (code repeats short n-grams everywhere; the right place is where the longer context agrees), the latest
    on a tie. No model; an index of every n-gram keeps each lookup cheap."""

    max_k = None
    free = True
    candidates = 16  # most recent occurrences compared per lookup
    context = 32  # tokens of preceding context compared at most

    def __init__(self, n_min: int = 2, n_max: int = 4) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError(f"ngram sizes need 1 <= n_min <= n_max (got {n_min}, {n_max})")
        self.name = "ngram"
        self.n_min, self.n_max = n_min, n_max
        self._index: dict[int, dict[tuple[int, ...], list[int]]] = {}
        self._held: list[int] = []  # the history indexed

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self._index = {n: {} for n in range(self.n_min, self.n_max + 1)}
        self._held = []

    def warm_up(self, opening: Sequence[int]) -> None:
        pass  # an index of the prompt costs nothing worth doing ahead

    def _extend(self, history: Sequence[int]) -> None:
        # index[n][gram]: where continuations of gram start, in order; only positions whose continuation
        # exists, so the history's own last n-gram is never its own match
        held = self._held
        keep = self._kept(history)
        for pos in range(len(held) - 1, keep - 1, -1):  # positions whose continuation changed, last first
            for n, index in self._index.items():
                if pos >= n:
                    gram = tuple(held[pos - n : pos])
                    index[gram].pop()  # each list ascends: pos is its last
                    if not index[gram]:
                        del index[gram]
        del held[keep:]
        for pos in range(keep, len(history)):
            for n, index in self._index.items():
                if pos >= n:
                    index.setdefault(tuple(history[pos - n : pos]), []).append(pos)
        held.extend(history[keep:])

    def _kept(self, history: Sequence[int]) -> int:
        """How much of the indexed history `history` still begins with (only the last LOOKAHEAD tokens can
        differ)."""
        held = self._held
        start = max(0, len(held) - LOOKAHEAD)
        end = min(len(held), len(history))
        return start + common_prefix(held[start:end], history[start:end])

    def _agreement(self, history: Sequence[int], start: int, n: int) -> int:
        """How many tokens before the matched n-gram also equal the ones before the history's own."""
        size, m = len(history), 0
        while (
            m < self.context and start - n - m > 0 and history[start - n - m - 1] == history[size - n - m - 1]
        ):
            m += 1
        return m

    def draft(
        self,
        history: Sequence[int],
        k: int,
        sampling: SamplingConfig,
        rng: np.random.Generator,
        constraint: Constraint | None = None,
    ) -> Draft:
        """With a grammar, the copied passage is cut at its first token the grammar does not admit."""
        self._extend(history)
        size = len(history)
        for n in range(min(self.n_max, size), self.n_min - 1, -1):
            found = self._index[n].get(tuple(history[size - n :]))
            if not found:
                continue
            recent = found[-self.candidates :]
            start = max(reversed(recent), key=lambda s: self._agreement(history, s, n))
            out: list[int] = []
            for j in range(k):  # a continuation running into the present repeats itself (periodic text)
                at = start + j
                out.append(history[at] if at < size else out[at - size])
            # measured on edit prompts (qwen2.5-coder-1.5b): a bare n-gram match kept ~2-4 of 16 drafted
            # tokens, one whose preceding tokens agree too (a copied passage) 8-16
            if constraint is not None:
                out = out[: constraint.valid_prefix(out)]
            return Draft(out, kind=int(self._agreement(history, start, n) > 0))
        return Draft([])

    def close(self) -> None:
        pass


def check_vocab_compatible(target: Tokenizer, draft: Tokenizer, target_name: str, draft_name: str) -> None:
    """Refuse a draft whose token ids mean other text than the target's (llama.cpp's rules, see above)."""

    def refuse(why: str) -> VocabMismatchError:
        return VocabMismatchError(
            f"draft model {draft_name} cannot draft for {target_name}: {why}",
            hint="use a draft from the target's model family (same tokenizer), or --draft ngram",
        )

    if target.model != draft.model:
        raise refuse(f"tokenizer types differ ({target.model} vs {draft.model})")
    nt, nd = target.vocab_size, draft.vocab_size
    if abs(nt - nd) > VOCAB_MAX_SIZE_DIFFERENCE:
        raise refuse(
            f"vocabulary sizes {nt} and {nd} differ by {abs(nt - nd)} (at most {VOCAB_MAX_SIZE_DIFFERENCE})"
        )
    if target.add_bos != draft.add_bos or (target.add_bos and target.bos_id != draft.bos_id):
        raise refuse(f"BOS tokens differ ({target.bos_id} vs {draft.bos_id})")
    if target.eos_id != draft.eos_id:
        raise refuse(f"EOS tokens differ ({target.eos_id} vs {draft.eos_id})")
    for i in range(VOCAB_CHECK_START_ID, min(nt, nd)):
        a, b = target.id_to_text(i), draft.id_to_text(i)
        if a != b:
            raise refuse(f"token {i} is {a!r} in the target but {b!r} in the draft")


def open_drafter(
    spec: str,
    target_tokenizer: Tokenizer,
    target_name: str,
    n_vocab: int,
    *,
    device: str = "cpu",
    n_ctx: int = 4096,
    n_threads: int | None = None,
    precision: str = "fast",
    lazy: bool = False,
    kv_dtype: str = "auto",
) -> Drafter:
    """`ngram`, or a draft model (catalog name or path) on `[backend:]device` (no backend or `auto`: on the CPU
    the one --backend auto picks for the draft model, devices/auto.py; elsewhere llama.cpp)."""
    if spec == "ngram":
        return NgramDrafter()
    from edge.devices.auto import AUTO, choose_backend
    from edge.devices.discovery import discover
    from edge.devices.memory import check_fits
    from edge.devices.placement import place
    from edge.devices.registry import DecoderOptions, estimate_memory, open_decoder
    from edge.models.checked import check_model

    model = check_model(spec)  # before any backend reads the draft's file
    name = model.name
    check_vocab_compatible(target_tokenizer, model.tokenizer, target_name, name)
    backend, _, dev = device.rpartition(":")
    if backend in ("", AUTO) and dev == "cpu":
        # a draft runs whole on one backend: no split by phase
        backend = choose_backend(model.path, precision=precision, threads=n_threads, split=False).backend
    elif backend == AUTO:
        backend = ""
    placement = place(discover((backend or "llamacpp",)), backend=backend or None, device=dev)
    # it takes turns with the target (no spinning threads); its KV in the type the load asked for
    opts = DecoderOptions(n_ctx, n_threads, precision, spin=False, kv_dtype=kv_dtype)
    need = estimate_memory(placement.backend, model, n_ctx, opts, placement.device)
    if need is not None:  # sized against what the loaded target left free
        check_fits(need, name, placement.backend, n_ctx)
    decoder = open_decoder(placement.backend, model, placement.device, opts)
    return ModelDrafter(decoder, name, n_vocab, lazy=lazy)


def auto_drafts_on(backend: str) -> bool:
    """Whether `--draft auto` drafts for a target on `backend` (AUTO_DRAFT_BACKENDS says why)."""
    return backend in AUTO_DRAFT_BACKENDS


def verify_backend(decoder: Decoder, backend: str) -> str:
    """The backend a target's verifies run on, which decides drafting: a phase split's decode half (it runs
    every forward of up to its threshold: decode steps and verifies), else `backend`."""
    phases = decoder.capabilities().phases
    return backend if phases is None else phases.decode.split(":", 1)[0]


def _auto_candidates(target_path: Path, target_vocab: int) -> list[str]:
    """Catalog models already on this machine (never a download), smallest first, at most AUTO_DRAFT_MAX_SIZE
    of the target's file, whose vocabulary has about the target's size (read from the metadata, so no
    tokenizer is built for a model of another family; open_drafter checks the vocabulary itself)."""
    from edge.models.catalog import CATALOG
    from edge.models.gguf_file import open_gguf
    from edge.models.store import is_verified, model_path

    size = target_path.stat().st_size
    out = []
    for entry in sorted(CATALOG.values(), key=lambda e: e.size):
        path = model_path(entry)
        skip = entry.embedding or entry.size > AUTO_DRAFT_MAX_SIZE * size or path == target_path
        if skip or not is_verified(entry):
            continue
        n_tokens = len(open_gguf(path).metadata.get("tokenizer.ggml.tokens", ()))
        if abs(n_tokens - target_vocab) <= VOCAB_MAX_SIZE_DIFFERENCE:
            out.append(entry.name)
    return out


def open_drafters(
    spec: str | None,
    target_tokenizer: Tokenizer,
    target_name: str,
    n_vocab: int,
    *,
    target_backend: str,
    target_path: Path,
    device: str = "cpu",
    n_ctx: int = 4096,
    n_threads: int | None = None,
    precision: str = "fast",
    kv_dtype: str = "auto",
) -> list[Drafter]:
    """The drafters `--draft` asks for, in the order they are asked each round.

    none (or None): no speculative decoding. ngram | a model: that drafter. auto: prompt lookup, then the
    smallest compatible catalog model already pulled (on the target's backend, lazily prefilled) where lookup
    finds nothing; nothing at all on backends outside AUTO_DRAFT_BACKENDS (llama.cpp's verify is costly and
    rounds differently from its decode, so a draft there could change greedy output)."""
    if spec in (None, "", "none"):
        return []
    if spec != "auto":
        return [
            open_drafter(
                spec,
                target_tokenizer,
                target_name,
                n_vocab,
                device=device,
                n_ctx=n_ctx,
                n_threads=n_threads,
                precision=precision,
                kv_dtype=kv_dtype,
            )
        ]
    if not auto_drafts_on(target_backend):
        return []
    drafters: list[Drafter] = [NgramDrafter()]
    for model in _auto_candidates(target_path, target_tokenizer.vocab_size):
        try:  # optional: where the draft model does not fit or does not open, lookup drafts alone
            drafters.append(
                open_drafter(
                    model,
                    target_tokenizer,
                    target_name,
                    n_vocab,
                    device=f"{target_backend}:cpu",
                    n_ctx=n_ctx,
                    n_threads=n_threads,
                    precision=precision,
                    lazy=True,
                    kv_dtype=kv_dtype,
                )
            )
            break
        except VocabMismatchError:  # another family after all: the next candidate
            continue
        except EdgeError as exc:
            log.warning("--draft auto: no draft model (%s); prompt lookup drafts alone", exc.message)
            break
    return drafters
