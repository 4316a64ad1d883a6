"""Speculative decoding under a grammar (issue 27: "drafts from prompt lookup or the draft model are masked by
the grammar too; sampling still keeps the target's (constrained) distribution exactly").

- Greedy: with any drafter (prompt lookup, the target drafting for itself, a random model) a constrained
  generation's tokens equal the constrained generation without drafts, on llama.cpp and the own graph; the
  grammar's forced tokens lead the drafts; the target drafting for itself is always right, which it is only
  when its draft rows are masked as the target's are.
- Sampling: the first token of a speculative round under a grammar has the target's masked distribution
  (chi-square over 4,000 fixed-seed draws), and a wrong acceptance rule fails the same test.
- A drafter whose last history held tokens that were not kept (forced tokens a round rejected) drafts as one
  that never saw them.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema
import numpy as np
import pytest

import edge
from edge.devices.base import Decoder
from edge.devices.graph_decoder import GraphDecoder, GraphOptions
from edge.drafters import Drafter, ModelDrafter, NgramDrafter
from edge.generate import Generation, GenerationConfig
from edge.grammar import Grammar, compile_grammar
from edge.models.gguf_file import open_gguf
from edge.models.tokenizer import Tokenizer
from edge.sampling import SamplingConfig, mask_logits, probabilities
from edge.speculative import AcceptRule, AdaptiveK, SpecConfig, SpeculativeDecoding, rejection_rule
from tests.edge.test_grammar import PERSON

# the fixtures of test_speculative: the tiny target, a one-layer draft of the same vocabulary, the tokenizer
from tests.edge.test_speculative import (  # noqa: F401
    N_VOCAB,
    PROMPT,
    always_accept,
    chi2_critical,
    chi2_statistic,
    drafter_for,
    files,
    llama,
    target,
    tokenizer,
)

SCHEMA = Grammar.json_schema(PERSON)


def constrained(
    dec: Decoder,
    tok: Tokenizer,
    prompt: list[int],
    drafter: Drafter | None = None,
    spec: SpecConfig | None = None,
) -> Generation:
    cfg = GenerationConfig(max_tokens=160, grammar=SCHEMA)
    decoding = None if drafter is None else SpeculativeDecoding(dec, drafter, spec)
    gen = Generation(dec, tok, prompt, cfg, decoding=decoding)
    gen.run()
    return gen


def a_person(tok: Tokenizer) -> list[int]:
    """A prompt that holds answers to copy (the last name too long for the schema), spelt byte by byte as the
    grammar's forced tokens are on this vocabulary: prompt lookup finds the keys and values it admits."""
    text = " ".join(
        json.dumps({"name": n, "age": a, "tags": t, "nick": k})
        for n, a, t, k in (
            ("bo", 7, ["c"], "b"),
            ("ann", 31, ["a"], None),
            ("annabelle", 31, ["a", "b"], None),
        )
    )
    byte_id = {tok.token_bytes(i): i for i in range(tok.vocab_size)}
    return [1, *(byte_id[bytes([b])] for b in text.encode())]


@pytest.mark.parametrize("backend", ["llamacpp", "ort"])
@pytest.mark.parametrize("kind", ["ngram", "self", "random"])
def test_masked_drafts_keep_the_constrained_greedy_output(
    backend: str,
    kind: str,
    target: Decoder,  # noqa: F811
    tokenizer: Tokenizer,  # noqa: F811
    files: dict[str, Path],  # noqa: F811
    edge_cache: Path,
) -> None:
    dec = (
        target
        if backend == "llamacpp"
        else GraphDecoder(open_gguf(files["target"]), GraphOptions(backend="ort", threads=1))
    )
    prompt = a_person(tokenizer)
    drafter = drafter_for(kind, files)
    try:
        alone = constrained(dec, tokenizer, prompt)
        spec = constrained(dec, tokenizer, prompt, drafter, SpecConfig(adaptive=False, k_max=6))
    finally:
        drafter.close()
        if dec is not target:
            dec.close()
    assert spec.token_ids == alone.token_ids
    assert (
        (spec.text, spec.stats.stop_reason)
        == (alone.text, alone.stats.stop_reason)
        == (alone.text, "grammar")
    )
    jsonschema.validate(json.loads(spec.text), PERSON)
    forced, drafted = spec.stats.forced, spec.stats.draft
    assert forced is not None and forced.forced > 0 and forced.rounds > 0, forced
    assert drafted is not None and drafted.drafted > 0, drafted
    if kind == "self":  # masked as the target's rows are, its own drafts are always right
        assert drafted.acceptance_rate == 1.0, drafted


def test_drafts_hold_only_what_the_grammar_admits(files: dict[str, Path], tokenizer: Tokenizer) -> None:  # noqa: F811
    """Each drafter, asked for a draft after a prefix: every drafted token continues the grammar, and the
    grammar's state is the same after the draft as before."""
    prompt = a_person(tokenizer)
    opening = compile_grammar(SCHEMA, tokenizer, N_VOCAB).forced()  # '{"name": "'
    greedy = SamplingConfig()
    rng = np.random.default_rng(0)
    for kind in ("ngram", "self", "random"):
        drafter = drafter_for(kind, files)
        grammar = compile_grammar(SCHEMA, tokenizer, N_VOCAB)
        for t in opening:
            grammar.advance(t)
        try:
            drafter.begin(prompt)
            draft = drafter.draft([*prompt, *opening], 12, greedy, rng, grammar)
        finally:
            drafter.close()
        assert grammar.valid_prefix(draft.tokens) == len(draft.tokens), (kind, draft.tokens)
        assert grammar.allowed()[tokenizer.encode("a", parse_special=False, continues=True)[0]]  # not moved
        if kind == "ngram":  # "annabelle" is one letter longer than the schema's maxLength: cut there
            assert tokenizer.decode_bytes(draft.tokens) == b"annabell", draft.tokens


@pytest.mark.parametrize(("rule", "exact"), [(rejection_rule, True), (always_accept, False)])
def test_first_sampled_token_has_the_masked_target_distribution(
    rule: AcceptRule,
    exact: bool,
    target: Decoder,  # noqa: F811
    tokenizer: Tokenizer,  # noqa: F811
    files: dict[str, Path],  # noqa: F811
) -> None:
    sampling = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    grammar = compile_grammar(Grammar("regex", "[a-z]{2,6}"), tokenizer, N_VOCAB)
    target.reset()
    logits = target.forward(PROMPT, last_only=True)[-1]
    allowed = grammar.allowed()
    p = probabilities(mask_logits(logits, allowed), sampling)
    drafter = ModelDrafter(llama(files["draft"]), "random", N_VOCAB)
    spec = SpeculativeDecoding(target, drafter, SpecConfig(adaptive=False, k_max=3), rule=rule)
    n = 4000
    counts = np.zeros(N_VOCAB, dtype=np.int64)
    drafted = 0
    try:
        for seed in range(n):
            spec.begin(PROMPT, logits, replace(sampling, seed=seed), grammar)
            out = spec.step(PROMPT, budget=8)  # the prefill row verifies the first drafted token
            counts[out[0]] += 1
            drafted += spec.stats.drafted
            grammar.rollback(len(out))
            target.rollback(target.position - len(PROMPT))
    finally:
        drafter.close()
    assert drafted >= 2 * n  # masked drafts of 2..3 letters (the regex may end after 2)
    assert not counts[~allowed].any()  # nothing outside the grammar, whatever the rule
    stat, df = chi2_statistic(counts, p)
    critical = chi2_critical(df)
    print(f"\n{rule.__name__}: chi2 {stat:.0f} on {df} df, critical(0.001) {critical:.0f}")
    assert (stat < critical) == exact


def test_the_token_after_forced_ones_has_the_masked_target_distribution(
    target: Decoder,  # noqa: F811
    tokenizer: Tokenizer,  # noqa: F811
    files: dict[str, Path],  # noqa: F811
) -> None:
    """A round whose draft follows forced tokens: each drafted token is judged against its own q row (the
    forced ones have none), so the first token drawn after them keeps the target's masked distribution."""
    sampling = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    grammar = compile_grammar(Grammar("regex", "ab[a-z]{2,6}"), tokenizer, N_VOCAB)
    forced = grammar.forced()
    assert tokenizer.decode_bytes(forced) == b"ab"
    target.reset()
    logits = target.forward(PROMPT, last_only=True)[-1]
    after = target.forward(forced, last_only=True)[-1]
    for t in forced:
        grammar.advance(t)
    allowed = grammar.allowed()
    p = probabilities(mask_logits(after, allowed), sampling)
    grammar.rollback(len(forced))
    drafter = ModelDrafter(llama(files["draft"]), "random", N_VOCAB)
    spec = SpeculativeDecoding(target, drafter, SpecConfig(adaptive=False, k_max=3))
    n = 4000
    counts = np.zeros(N_VOCAB, dtype=np.int64)
    try:
        for seed in range(n):
            target.rollback(target.position - len(PROMPT))
            spec.begin(PROMPT, logits, replace(sampling, seed=seed), grammar)
            out = spec.step(PROMPT, budget=8)
            assert out[: len(forced)] == forced and spec.stats.drafted == 3
            counts[out[len(forced)]] += 1
            grammar.rollback(len(out))
    finally:
        drafter.close()
    assert not counts[~allowed].any()
    stat, df = chi2_statistic(counts, p)
    critical = chi2_critical(df)
    print(f"\nafter forced tokens: chi2 {stat:.0f} on {df} df, critical(0.001) {critical:.0f}")
    assert stat < critical


def test_forced_and_drafted_tokens_stay_within_the_rollback_limit(
    tokenizer: Tokenizer,  # noqa: F811
    files: dict[str, Path],  # noqa: F811
    edge_cache: Path,
) -> None:
    """A ring that has wrapped undoes only its last 4 tokens: a round's forced and drafted tokens together
    stay within that, since a forced token the row rejects (where the grammar admits others too) rolls back
    the draft after it as well; the generation after the wrap, rejections and all, is the one without."""
    opts = GraphOptions(backend="ort", threads=1, capacity=64, max_rollback=4)
    ring = GraphDecoder(open_gguf(files["target"]), opts)
    prompt = a_person(tokenizer)  # longer than the ring: it has wrapped before the first token
    drafter = drafter_for("random", files)
    try:
        periodic = [5, 6, 7] * 8  # prompt lookup would draft any length here
        lookup = SpeculativeDecoding(ring, NgramDrafter(), SpecConfig(adaptive=False, k_max=16))
        lookup.drafters[0].begin(periodic)
        for n_forced in range(5):
            _, draft, _, _ = lookup._ask(periodic, 16, 0, 1, n_forced)
            assert n_forced + len(draft.tokens) <= 4, (n_forced, draft.tokens)
        alone = constrained(ring, tokenizer, prompt)
        spec = constrained(ring, tokenizer, prompt, drafter, SpecConfig(adaptive=False, k_max=6))
    finally:
        drafter.close()
        ring.close()
    assert spec.token_ids == alone.token_ids
    forced, drafted = spec.stats.forced, spec.stats.draft
    assert forced is not None and forced.forced > 0 and drafted is not None and drafted.drafted > 0
    assert drafted.accepted < drafted.drafted  # drafts were rejected, so rollbacks ran after the wrap


def test_a_draft_after_forced_tokens_is_weighed_by_what_it_adds() -> None:
    """The forward carries the forced tokens anyway: a draft pays when its expected tokens per added cost
    beat plain steps, not when the whole forward beats a one-token step."""
    k = AdaptiveK(SpecConfig(k_max=16, k_probe=4))
    k.observe_forward(1, 0.010)
    for n, s in ((2, 0.0125), (4, 0.0175), (8, 0.0275), (16, 0.0475)):
        k.observe_forward(n, s)
    k.observe_draft(4, 0.004)  # 1 ms a drafted token
    for _ in range(10):
        k.observe_round(5, 4)  # alpha ~0.8
    plain = k.choose(6, 0, None, 1)
    assert plain > 0
    for forced in (4, 10):
        assert k.choose(6, 0, None, 1, forced) > 0, forced
    slow = AdaptiveK(k.cfg, {n: 0.010 * n for n in range(1, 18)})  # a full step a token: never pays
    slow.observe_draft(4, 0.004)
    assert slow.choose(6, 0, None, 1, 4) == 0


def test_lookup_forgets_a_tail_that_was_not_kept() -> None:
    greedy, rng = SamplingConfig(), np.random.default_rng(0)
    base = [5, 6, 7, 8, 5, 6, 9, 5, 6]
    ng, fresh = NgramDrafter(), NgramDrafter()
    ng.begin(base)
    ng.draft([*base, 7, 8, 5, 6], 4, greedy, rng)  # looked ahead at 4 tokens...
    got = ng.draft([*base, 9, 5], 4, greedy, rng)  # ...of which none was kept
    fresh.begin(base)
    assert got == fresh.draft([*base, 9, 5], 4, greedy, rng)
    assert ng._index == fresh._index


def test_draft_model_forgets_a_tail_that_was_not_kept(files: dict[str, Path]) -> None:  # noqa: F811
    greedy, rng = SamplingConfig(), np.random.default_rng(0)
    drafter = ModelDrafter(llama(files["draft"]), "d", N_VOCAB)
    fresh = ModelDrafter(llama(files["draft"]), "d", N_VOCAB)
    try:
        drafter.begin(PROMPT)
        drafter.draft([*PROMPT, 40, 41, 42], 3, greedy, rng)
        got = drafter.draft([*PROMPT, 43], 5, greedy, rng)  # shorter than what it looked ahead at
        fresh.begin(PROMPT)
        assert got == fresh.draft([*PROMPT, 43], 5, greedy, rng)
        assert drafter.decoder.position == len(drafter._tokens)
        drafter.begin(PROMPT)
        drafter.draft([*PROMPT, 40, 41, 42], 3, greedy, rng)
        got = drafter.draft([*PROMPT, 43, 44, 45], 5, greedy, rng)  # as long, every looked-ahead token other
        fresh.begin(PROMPT)
        assert got == fresh.draft([*PROMPT, 43, 44, 45], 5, greedy, rng)
        assert drafter._tokens[len(PROMPT) :][:3] == [43, 44, 45]
    finally:
        drafter.close()
        fresh.close()


def test_a_loaded_model_drafts_under_a_grammar(files: dict[str, Path], edge_cache: Path) -> None:  # noqa: F811
    cfg = GenerationConfig(max_tokens=160, grammar=SCHEMA)
    with edge.load(str(files["target"]), backend="ort", n_ctx=512, draft="none") as plain:
        alone = plain.generate("ann bo ann", cfg, raw=True)
    with edge.load(str(files["target"]), backend="ort", n_ctx=512, draft="ngram") as m:
        got = m.generate("ann bo ann", cfg, raw=True)
        assert m.decoder.position == len(m.session.held)  # the session holds exactly what was fed
    assert got.token_ids == alone.token_ids
    assert got.stats.draft is not None and got.stats.draft.method == "ngram"
    assert got.stats.forced is not None and got.stats.forced.forced > 0
    jsonschema.validate(json.loads(got.text), PERSON)
