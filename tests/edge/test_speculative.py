"""Speculative decoding (issue 7, "Done when").

- Greedy: with any draft (a random model, the target itself, prompt lookup) the tokens, text, stop reason and
  EOS handling equal the target alone, on llama.cpp and on the GraphDecoder (ring-buffer KV, rollback limit,
  wrap), and on the real qwen2.5-coder pair (slow).
- Sampling: the first token drawn through a speculative round has the target's distribution (chi-square over
  4,000 fixed-seed draws), and the same test fails for wrong acceptance rules (always accept; resample from p
  instead of the residual).
- A draft with another vocabulary is refused with VocabMismatchError naming both models.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edge.devices.base import Decoder
from edge.devices.graph_decoder import GraphDecoder, GraphOptions
from edge.devices.llamacpp import LlamaCppDecoder, LlamaCppOptions
from edge.drafters import Drafter, ModelDrafter, NgramDrafter, check_vocab_compatible
from edge.errors import VocabMismatchError
from edge.generate import Generation, GenerationConfig
from edge.kvcache.staging import WINDOW, piece_sizes
from edge.models.gguf_file import open_gguf
from edge.models.tokenizer import Tokenizer, load_tokenizer
from edge.sampling import SamplingConfig, probabilities
from edge.speculative import AcceptRule, AdaptiveK, SpecConfig, SpeculativeDecoding, rejection_rule
from tests.near_ties import assert_equal_but_near_ties
from tests.tiny_models import TinySpec, write_tiny_model

PROMPT = [1, 300, 301, 302, 303, 304, 305]
N_VOCAB = 320


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("spec")
    return {
        "target": write_tiny_model(d / "target.gguf", TinySpec(seed=0)),
        "draft": write_tiny_model(d / "draft.gguf", TinySpec(seed=1, n_layer=1)),  # same vocabulary
        "other_vocab": write_tiny_model(d / "other.gguf", TinySpec(seed=2, n_vocab=600)),
    }


def llama(path: Path, n_ctx: int = 512) -> LlamaCppDecoder:
    return LlamaCppDecoder(path, LlamaCppOptions(n_ctx=n_ctx, n_threads=1))


@pytest.fixture(scope="module")
def target(files: dict[str, Path]) -> Iterator[LlamaCppDecoder]:
    with llama(files["target"]) as dec:
        yield dec


@pytest.fixture(scope="module")
def tokenizer(files: dict[str, Path]) -> Tokenizer:
    return load_tokenizer(open_gguf(files["target"]).metadata)


def drafter_for(kind: str, files: dict[str, Path]) -> Drafter:
    if kind == "ngram":
        return NgramDrafter()
    path = files["target"] if kind == "self" else files["draft"]
    return ModelDrafter(llama(path), kind, N_VOCAB)


def generate(
    dec: Decoder,
    tok: Tokenizer,
    cfg: GenerationConfig,
    drafter: Drafter | None = None,
    spec: SpecConfig | None = None,
    prompt: list[int] = PROMPT,
) -> Generation:
    decoding = None if drafter is None else SpeculativeDecoding(dec, drafter, spec)
    gen = Generation(dec, tok, prompt, cfg, decoding=decoding)
    gen.run()
    return gen


def same_output(a: Generation, b: Generation) -> None:
    assert b.token_ids == a.token_ids
    assert (b.text, b.stats.stop_reason, b.stats.n_tokens) == (a.text, a.stats.stop_reason, a.stats.n_tokens)


# -- greedy: the target's own tokens -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["random", "self", "ngram"])
@pytest.mark.parametrize(
    "spec", [SpecConfig(), SpecConfig(adaptive=False, k_max=1), SpecConfig(adaptive=False, k_max=6)]
)
def test_greedy_equals_target_alone(
    kind: str, spec: SpecConfig, target: LlamaCppDecoder, tokenizer: Tokenizer, files: dict[str, Path]
) -> None:
    cfg = GenerationConfig(max_tokens=120, ignore_eos=True)
    plain = generate(target, tokenizer, cfg)
    drafter = drafter_for(kind, files)
    try:
        spec_gen = generate(target, tokenizer, cfg, drafter, spec)
    finally:
        drafter.close()
    same_output(plain, spec_gen)
    st = spec_gen.stats.draft
    assert st is not None and st.tokens >= st.accepted + st.rounds
    assert st.method == kind
    if kind == "self" and not spec.adaptive:  # the target drafting for itself is always right
        assert st.drafted > 0 and st.acceptance_rate == 1.0
    if kind == "random" and not spec.adaptive:
        assert st.drafted >= 100 and st.acceptance_rate < 0.5


def test_greedy_with_repeat_penalty_eos_and_stop_string(
    target: LlamaCppDecoder, tokenizer: Tokenizer, files: dict[str, Path]
) -> None:
    greedy = SamplingConfig(temperature=0.0, repeat_penalty=1.3, repeat_last_n=16)
    plain = generate(target, tokenizer, GenerationConfig(max_tokens=80, sampling=greedy))
    text = generate(target, tokenizer, GenerationConfig(max_tokens=80, sampling=greedy, ignore_eos=True)).text
    stop = text[len(text) // 2 : len(text) // 2 + 4]  # a stop string met halfway
    for cfg in (
        GenerationConfig(max_tokens=80, sampling=greedy),  # EOS active
        GenerationConfig(max_tokens=80, sampling=greedy, ignore_eos=True, stop=(stop,)),
        GenerationConfig(max_tokens=7, sampling=greedy, ignore_eos=True),  # the budget caps a round
    ):
        plain = generate(target, tokenizer, cfg)
        for kind in ("self", "ngram"):
            drafter = drafter_for(kind, files)
            try:
                same_output(
                    plain, generate(target, tokenizer, cfg, drafter, SpecConfig(adaptive=False, k_max=5))
                )
            finally:
                drafter.close()
    assert plain.stats.stop_reason == "length" and plain.stats.n_tokens == 7


def test_context_limit_is_respected(files: dict[str, Path], tokenizer: Tokenizer) -> None:
    cfg = GenerationConfig(max_tokens=500, ignore_eos=True)
    with llama(files["target"], n_ctx=48) as small:
        plain = generate(small, tokenizer, cfg)
        spec = generate(
            small, tokenizer, cfg, drafter_for("self", files), SpecConfig(adaptive=False, k_max=8)
        )
    assert plain.stats.stop_reason == "context"
    same_output(plain, spec)


def test_graph_decoder_rollback_limit_and_ring_wrap(
    files: dict[str, Path], tokenizer: Tokenizer, edge_cache: Path
) -> None:
    gguf = open_gguf(files["target"])
    # capacity 64 wraps the ring well before 150 tokens; the undo log covers 4 tokens only
    opts = GraphOptions(backend="ort", threads=1, capacity=64, max_rollback=4)
    cfg = GenerationConfig(max_tokens=150, ignore_eos=True)
    target = GraphDecoder(gguf, opts)
    draft = GraphDecoder(open_gguf(files["draft"]), opts)
    try:
        plain = generate(target, tokenizer, cfg)
        for drafter in (ModelDrafter(draft, "random", N_VOCAB), NgramDrafter()):
            decoding = SpeculativeDecoding(target, drafter, SpecConfig(adaptive=False, k_max=16))
            assert decoding.k_cap == (4 if drafter.max_k is None else min(4, drafter.max_k))
            gen = Generation(target, tokenizer, PROMPT, cfg, decoding=decoding)
            gen.run()
            same_output(plain, gen)
            assert gen.stats.draft is not None and gen.stats.draft.drafted > 0
    finally:
        target.close()
        draft.close()


def test_model_turns_reuse_the_kv_with_a_draft(files: dict[str, Path]) -> None:
    """Model.generate with a draft, turn after turn: the target's session and the draft's KV keep the shared
    prefix, and the output equals the model without a draft."""
    from edge.api import load

    cfg = GenerationConfig(max_tokens=30, ignore_eos=True)
    turns = ["w1 w2 w3", "w1 w2 w3 w4 w5", "w1 w2 w3 w4 w5 w6 w7"]
    with load(str(files["target"]), n_ctx=512) as plain_model:
        plain = [plain_model.generate(t, cfg, reuse=False, raw=True).token_ids for t in turns]
    with load(str(files["target"]), n_ctx=512, draft=str(files["draft"])) as m:
        assert m.speculative is not None
        drafter = m.speculative.drafter
        assert isinstance(drafter, ModelDrafter)
        for text, expected in zip(turns, plain, strict=True):
            prompt = m.prompt_ids(text, raw=True)
            result = m.generate(text, cfg, reuse=False, raw=True)
            assert result.token_ids == expected
            assert result.stats.draft is not None and result.stats.draft.method == "draft.gguf"
            # the draft KV still starts with this turn's prompt (all but its last token)
            assert drafter._tokens[: len(prompt) - 1] == prompt[:-1]
            assert drafter.decoder.position == len(drafter._tokens)


# -- sampling: the target's distribution, exactly ----------------------------------------------------------


def chi2_critical(df: int, alpha_z: float = 3.0902) -> float:
    """Upper 0.001 quantile of chi-square(df), Wilson-Hilferty (accurate to ~1% for df >= 10)."""
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + alpha_z * math.sqrt(h)) ** 3


def chi2_statistic(counts: np.ndarray, p: np.ndarray, min_expected: float = 5.0) -> tuple[float, int]:
    """Pearson's statistic, tokens expected fewer than `min_expected` times pooled into one bin."""
    n = counts.sum()
    big = p * n >= min_expected
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(p[big] * n, p[~big].sum() * n)
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    return float(((obs - exp) ** 2 / exp).sum()), int(keep.sum() - 1)


def always_accept(p: np.ndarray, q: np.ndarray | None, token: int, rng: np.random.Generator) -> int | None:
    return None


def resample_from_p(p: np.ndarray, q: np.ndarray | None, token: int, rng: np.random.Generator) -> int | None:
    """Accepts correctly but draws a rejected position from p instead of norm(max(0, p - q))."""
    q_tok = 1.0 if q is None else float(q[token])
    if rng.random() * q_tok < p[token]:
        return None
    return int(rng.choice(p.shape[0], p=p))


@pytest.mark.parametrize(
    ("rule", "exact"), [(rejection_rule, True), (always_accept, False), (resample_from_p, False)]
)
def test_first_sampled_token_has_the_target_distribution(
    rule: AcceptRule, exact: bool, target: LlamaCppDecoder, files: dict[str, Path]
) -> None:
    sampling = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    target.reset()
    logits = target.forward(PROMPT, last_only=True)[-1]
    p = probabilities(logits, sampling)
    drafter = ModelDrafter(llama(files["draft"]), "random", N_VOCAB)
    spec = SpeculativeDecoding(target, drafter, SpecConfig(adaptive=False, k_max=3), rule=rule)
    n = 4000
    counts = np.zeros(N_VOCAB, dtype=np.int64)
    drafted = 0
    try:
        for seed in range(n):
            spec.begin(PROMPT, logits, replace(sampling, seed=seed))
            first = spec.step(PROMPT, budget=8)[0]  # speculated: the prefill row verifies the first draft
            counts[first] += 1
            drafted += spec.stats.drafted
            target.rollback(target.position - len(PROMPT))
    finally:
        drafter.close()
    assert drafted == 3 * n  # every round drafted k = 3
    stat, df = chi2_statistic(counts, p)
    critical = chi2_critical(df)
    print(f"\n{rule.__name__}: chi2 {stat:.0f} on {df} df, critical(0.001) {critical:.0f}")
    assert (stat < critical) == exact


def test_rejection_rule_on_explicit_distributions() -> None:
    """The rule alone: draft from q, keep or replace; the result is distributed as p (pure numpy)."""
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.1, 0.1, 0.2, 0.6])
    n = 40_000
    out = np.zeros(4, dtype=np.int64)
    for _ in range(n):
        x = int(rng.choice(4, p=q))
        r = rejection_rule(p, q, x, rng)
        out[x if r is None else r] += 1
    assert out[3] == 0  # a token the target never picks is never emitted
    assert (
        chi2_statistic(out, p)[0] < 16.27
    )  # chi-square(2) at 0.001 (the zero-probability token is its own empty bin)
    # a deterministic draft (q one-hot): accepted with probability p(x), else drawn from p without x
    out[:] = 0
    for _ in range(n):
        r = rejection_rule(p, None, 0, rng)
        out[0 if r is None else r] += 1
    assert chi2_statistic(out, p)[0] < 16.27


# -- adaptive k, prompt lookup ------------------------------------------------------------------------------


def test_adaptive_k_follows_acceptance_and_costs() -> None:
    k = AdaptiveK(SpecConfig(k_max=16, k_probe=4))
    assert k.choose(16) == 0  # a plain step is measured first
    k.observe_forward(1, 0.030)
    assert k.choose(16) == 4  # then the probe measures the draft
    k.observe_draft(4, 0.004)  # 1 ms per drafted token
    for n in range(2, 18):
        k.observe_forward(n, 0.030 + 0.005 * (n - 1))  # a verify token costs 1/6 of a decode step
    for _ in range(10):
        k.observe_round(16, 16)
    assert k.choose(16) == 16  # right every time and cheap: the longest draft
    assert k.choose(3) == 3  # but never past the limit (budget, context, rollback)
    for _ in range(5):
        k.observe_round(4, 1)
    assert 0 < k.choose(16) < 8  # often wrong lately: shorter drafts
    for _ in range(60):
        k.observe_round(4, 0)
    assert k.choose(16) == 0  # always wrong: plain steps
    # ... but after a long run of plain steps one probe, since a right draft would pay here
    assert [k.choose(16) for _ in range(31)] == [0] * 30 + [4]
    for _ in range(100):
        k.observe_plain_step()
    assert k.choose(16) > 0  # old evidence fades: drafting is tried again
    # a verify that costs a full step per token (a CPU's compute-bound batch) never pays for a paid draft
    slow = AdaptiveK(SpecConfig())
    slow.observe_forward(1, 0.030)
    slow.observe_draft(4, 0.060)
    for n in range(2, 18):
        slow.observe_forward(n, 0.030 * n)
    for _ in range(10):
        slow.observe_round(4, 4)
    assert slow.alpha > 0.95 and slow.choose(16) == 0
    assert not any(slow.choose(16) for _ in range(100))  # and it is never probed again


def test_ngram_lookup() -> None:
    ng = NgramDrafter(n_min=2, n_max=3)
    ng.begin([])
    rng = np.random.default_rng(0)
    greedy = SamplingConfig()
    hist = [5, 6, 7, 8, 9, 1, 2, 6, 7, 8, 4, 6, 7]
    # the longest suffix seen before is [6, 7] (twice): the latest occurrence's continuation is proposed
    assert ng.draft(hist, 3, greedy, rng).tokens == [8, 4, 6]
    assert ng.draft([*hist, 8], 2, greedy, rng).tokens == [4, 6]  # [6, 7, 8] now matches at length 3
    assert ng.draft([*hist, 8, 3, 3], 4, greedy, rng).tokens == []  # [8, 3, 3]: never seen
    # of two occurrences of [3, 4], the older one is preceded by the same token as the present: it wins
    ng = NgramDrafter(n_min=1, n_max=2)
    ng.begin([])
    assert ng.draft([1, 2, 3, 4, 5, 9, 3, 4, 7, 2, 3, 4], 2, greedy, rng).tokens == [5, 9]
    periodic = [1, 2, 3, 1, 2, 3]
    ng.begin([])
    assert ng.draft(periodic, 7, greedy, rng).tokens == [1, 2, 3, 1, 2, 3, 1]  # runs on into the present


def test_lookup_draft_kinds_and_their_own_acceptance() -> None:
    """A lookup whose preceding tokens agree too (a copied passage) is a draft of kind 1, a bare n-gram match
    kind 0; acceptance is estimated per kind, so copied passages get long drafts while bare matches, wrong
    more often, get short ones."""
    greedy, rng = SamplingConfig(), np.random.default_rng(0)
    ng = NgramDrafter(n_min=2, n_max=2)
    ng.begin([])
    copied = [
        10,
        11,
        12,
        13,
        14,
        15,
        16,
        99,
        11,
        12,
        13,
    ]  # [11, 12, 13] seen before, and [.., 12] before that
    assert ng.draft(copied, 3, greedy, rng).kind == 1
    ng.begin([])
    bare = [10, 11, 12, 13, 14, 99, 12, 13]  # [12, 13] seen, but 99 != 11 before it
    assert ng.draft(bare, 3, greedy, rng).kind == 0
    k = AdaptiveK(SpecConfig(k_max=16, k_probe=4))
    k.observe_forward(1, 0.030)
    k.observe_draft(4, 0.00001)  # lookup: free
    for n in range(2, 18):
        k.observe_forward(n, 0.030 + 0.006 * (n - 1))
    for _ in range(10):
        k.observe_round(16, 16, kind=1)
        k.observe_round(16, 2, kind=0)
    assert k.alpha_of(1) > 0.9 > 0.7 > k.alpha_of(0)  # kind 0: 2 of every 3 judged tokens right
    assert k.choose(16, 1) >= 12 and 0 < k.choose(16, 0) < 6


def test_k_weighs_the_pieces_a_staged_forward_is_cut_into() -> None:
    """A staged graph cuts a short forward at its window ends (kvcache.staging), so a draft that would cross
    one costs a second forward: k stops at the window end unless the longer draft is worth that."""
    k = AdaptiveK(SpecConfig(k_max=16, k_probe=4), pieces=piece_sizes)
    k.observe_forward(1, 0.030)
    k.observe_draft(4, 0.00001)  # lookup: free
    for n in range(2, 18):
        k.observe_forward(n, 0.060 + 0.005 * (n - 1))  # a forward's fixed cost dominates (a CPU's verify)
    for _ in range(10):
        k.observe_round(16, 16, kind=1)
    assert piece_sizes(WINDOW - 12, 17) == (12, 5)
    assert k.choose(16, 1) == 16  # without a position: one forward of 17
    assert k.choose(16, 1, WINDOW - 12, 1) == 11  # 1 pending + 11 drafted fill the window: one forward
    assert k.choose(16, 1, WINDOW, 1) == 16  # at a window start the whole draft fits
    assert not k.splits(WINDOW - 6, 6) and k.splits(WINDOW - 6, 7)
    assert k.forward_cost(WINDOW - 6, 17) == pytest.approx(k.forward_cost(0, 6) + k.forward_cost(0, 11))
    # an unstaged target (no pieces): a forward is one forward whatever its position
    plain = AdaptiveK(SpecConfig(k_max=16, k_probe=4))
    assert not plain.splits(WINDOW - 6, 17)


def test_a_copied_passage_survives_one_miss() -> None:
    """Lookup's copied passages (kind 1) start from a stronger prior than bare matches: one rejected first
    token lowers their estimate less, so copying goes on (a weight of 1 switched it off on edit prompts)."""
    k = AdaptiveK(SpecConfig())
    k.observe_round(6, 0, kind=1)
    k.observe_round(6, 0, kind=0)
    assert k.alpha_of(0) < 0.5 < k.alpha_of(1)


# -- vocabulary compatibility ----------------------------------------------------------------------------


def test_incompatible_vocabulary_is_refused(files: dict[str, Path], tokenizer: Tokenizer) -> None:
    other = load_tokenizer(open_gguf(files["other_vocab"]).metadata)
    with pytest.raises(
        VocabMismatchError, match=r"draft model other cannot draft for tiny: vocabulary sizes"
    ):
        check_vocab_compatible(tokenizer, other, "tiny", "other")
    md = dict(open_gguf(files["target"]).metadata)
    tokens = list(md["tokenizer.ggml.tokens"])
    tokens[300] = "\u2581changed"
    md["tokenizer.ggml.tokens"] = tokens
    with pytest.raises(VocabMismatchError, match="token 300"):
        check_vocab_compatible(tokenizer, load_tokenizer(md), "tiny", "changed")
    check_vocab_compatible(tokenizer, load_tokenizer(open_gguf(files["draft"]).metadata), "tiny", "draft")


# -- the command line ------------------------------------------------------------------------------------


def edge_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edge.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_cli_draft_json_summary_and_refusal(files: dict[str, Path]) -> None:
    common = [
        "run",
        str(files["target"]),
        "w1 w2 w3 w1 w2 w3",
        "--temperature",
        "0",
        "--max-tokens",
        "24",
        "--ctx-size",
        "1024",
        "--backend",  # written against llama.cpp, where --draft auto drafts nothing
        "llamacpp",
    ]
    plain = json.loads(edge_cli(*common, "--json").stdout)
    assert plain["draft"] is None
    for draft in ("ngram", str(files["draft"])):
        proc = edge_cli(*common, "--json", "--draft", draft, "--draft-k", "4")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["token_ids"] == plain["token_ids"] and out["text"] == plain["text"]
        keys = {
            "method",
            "drafted",
            "accepted",
            "acceptance_rate",
            "mean_accepted_length",
            "speedup_estimate",
        }
        assert keys <= set(out["draft"])
    proc = edge_cli(*common, "--draft", str(files["draft"]))
    assert proc.returncode == 0 and "draft draft.gguf:" in proc.stderr and "accepted" in proc.stderr
    proc = edge_cli(*common, "--draft", str(files["other_vocab"]))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1
    assert "other.gguf cannot draft for target.gguf" in lines[0] and "vocabulary sizes" in lines[0]


def test_a_generation_that_drafted_nothing_says_so(files: dict[str, Path]) -> None:
    """Prompt lookup that found nothing to draft used to read `0% of 0 accepted, 0.00 tok/forward, k 0.0`."""
    from edge.speculative import DraftStats

    assert DraftStats("ngram", plain_steps=7, tokens=7).summary() == "draft ngram: nothing drafted"
    assert DraftStats("ngram").summary(brief=True) == "draft ngram: nothing drafted"
    drafted = DraftStats("ngram", drafted=10, accepted=5, rounds=2, plain_steps=1, tokens=9)
    assert drafted.summary().startswith("draft ngram: 50% of 10 accepted, 3.00 tok/forward, k 0.0")
    # one token comes from the prompt's forward: no decode step, nothing drafted, on the run's summary line
    run = ("run", str(files["target"]), "w1 w2", "--draft", "ngram", "--max-tokens", "1")
    proc = edge_cli(*run, "--backend", "llamacpp")
    assert proc.returncode == 0, proc.stderr
    assert "draft ngram: nothing drafted · " in proc.stderr and "of 0" not in proc.stderr


# -- the real pair ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_qwen_pair_greedy_equals_target_and_smollm_is_refused() -> None:
    from edge.api import load

    cfg = GenerationConfig(max_tokens=40)
    prompt = "Write a Python function that returns the n-th Fibonacci number."
    # llama.cpp's guarantee (greedy_guarantee): the target's tokens except near-ties, since its batched verify
    # rounds differently from its one-token decode (by how much depends on the CPU's kernels)
    with load(
        "qwen2.5-coder-1.5b",
        backend="llamacpp",
        n_ctx=1024,
        draft="qwen2.5-coder-0.5b",
        draft_device="llamacpp:cpu",
    ) as m:
        assert m.speculative is not None
        drafter = m.speculative.drafter
        # a fixed k = 4 verifies 5 tokens per target forward (adaptive k may find plain steps cheaper here)
        m.speculative = SpeculativeDecoding(m.decoder, drafter, SpecConfig(adaptive=False, k_max=4))
        spec = m.generate(prompt, cfg, reuse=False)
        m.speculative = None
        plain = m.generate(prompt, cfg, reuse=False)
        drafter.close()
        assert_equal_but_near_ties(m.decoder, plain.prompt_ids, spec.token_ids, plain.token_ids)
    st = spec.stats.draft
    assert st is not None and st.method == "qwen2.5-coder-0.5b"
    print(f"\nqwen pair: {st.to_dict()}")
    with pytest.raises(VocabMismatchError, match=r"smollm2-135m cannot draft for qwen2\.5-coder-1\.5b"):
        load("qwen2.5-coder-1.5b", n_ctx=256, draft="smollm2-135m")


def test_greedy_guarantee_names_what_holds() -> None:
    from edge.speculative import greedy_guarantee

    assert greedy_guarantee("ort", "fast", True).startswith("identical to the target alone")
    assert "~1e-4" in greedy_guarantee("ort", "exact")
    assert "int8" in greedy_guarantee("openvino", "fast")
    assert "llama.cpp" in greedy_guarantee("llamacpp", None)
