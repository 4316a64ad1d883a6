"""`edge bench MODEL --draft DRAFT|ngram`: the target's decode speed with and without speculative decoding.

Both run in the same process on the same loaded target, alternating which goes first each round, on the bench
prompt with greedy decoding and EOS ignored, so the ratio is what speculation buys on this machine now. With
`--json-schema` both decode under the grammar until its value is complete: without drafts by fast-forward
alone (edge/fastforward.py), with them by masked drafts led by the forced tokens (edge/speculative.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edge.devices.registry import DecoderOptions, open_decoder
from edge.generate import Generation, GenerationConfig
from edge.models.checked import CheckedModel
from edge.speculative import open_speculative

if TYPE_CHECKING:
    from edge.grammar import Grammar

__all__ = ["DraftBenchResult", "measure_draft"]


def _stat(values: Sequence[float], digits: int) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


@dataclass(frozen=True)
class DraftBenchResult:
    draft: str
    backend: str
    device: str
    draft_device: str
    k_max: int
    plain_tok_s: tuple[float, ...]  # per round
    draft_tok_s: tuple[float, ...]
    same_tokens: bool  # greedy speculation must give the target's own tokens
    stats: tuple[dict[str, Any], ...]  # DraftStats.to_dict() per round
    constrained: bool = False  # both decoded under --json-schema's grammar (plain: fast-forward alone)

    def to_dict(self) -> dict[str, Any]:
        ratios = [d / p for d, p in zip(self.draft_tok_s, self.plain_tok_s, strict=True)]
        return {
            "draft": self.draft,
            "backend": self.backend,
            "device": self.device,
            "draft_device": self.draft_device,
            "k_max": self.k_max,
            "rounds": len(ratios),
            "plain_decode_tok_s": _stat(self.plain_tok_s, 2),
            "draft_decode_tok_s": _stat(self.draft_tok_s, 2),
            "ratio_decode": _stat(ratios, 4),
            "same_tokens": self.same_tokens,
            "constrained": self.constrained,
            "stats": list(self.stats),
        }

    def summary(self) -> str:
        d = self.to_dict()
        last = self.stats[-1]
        return (
            f"draft {self.draft}: decode {d['draft_decode_tok_s']['median']:.1f} tok/s vs "
            f"{d['plain_decode_tok_s']['median']:.1f} "
            f"{'fast-forward alone' if self.constrained else 'plain'} = {d['ratio_decode']['median']:.2f}x "
            f"(acceptance {100 * last['acceptance_rate']:.0f}%, mean k {last['mean_k']}, "
            f"{'same tokens' if self.same_tokens else 'TOKENS DIFFER'})"
        )


def measure_draft(
    model: CheckedModel,
    prompt: list[int],
    *,
    draft: str,
    backend: str,
    device: str,
    draft_device: str,
    draft_k: int,
    gen_tokens: int,
    repeat: int,
    n_ctx: int,
    threads: int | None,
    precision: str = "fast",
    grammar: Grammar | None = None,
    kv_dtype: str = "auto",
) -> DraftBenchResult:
    """Decode `gen_tokens` greedy tokens `repeat` times without and with the draft, alternating the order.
    Greedy generations are drafted whatever the draft spec (what `--draft ngram|MODEL` does; `--draft auto`
    at --precision fast leaves them alone in run/chat/serve), and `same_tokens` says whether they agreed."""
    dopts = DecoderOptions(n_ctx=n_ctx, n_threads=threads, precision=precision, kv_dtype=kv_dtype)
    target = open_decoder(backend, model, device, dopts)
    try:
        spec = open_speculative(
            draft,
            target,
            model.tokenizer,
            model.name,
            target_backend=backend,
            target_path=model.path,
            draft_device=draft_device,
            draft_k=draft_k,
            n_ctx=n_ctx,
            n_threads=threads,
            precision=precision,
            greedy=True,  # measured on greedy decoding, whatever auto's policy
            kv_dtype=kv_dtype,
        )
        if spec is None:
            why = "nothing to compare" if draft in ("", "none") else "auto is off on llama.cpp"
            raise ValueError(f"--draft {draft} drafts nothing on {backend} ({why})")
        try:
            gen_cfg = GenerationConfig(max_tokens=gen_tokens, ignore_eos=True, grammar=grammar)
            plain_rates: list[float] = []
            draft_rates: list[float] = []
            stats: list[dict[str, Any]] = []
            same = True
            for r in range(repeat):
                runs: dict[bool, Generation] = {}
                for speculative in (False, True) if r % 2 == 0 else (True, False):
                    decoding = spec if speculative else None
                    gen = Generation(target, model.tokenizer, prompt, gen_cfg, decoding=decoding)
                    gen.run()
                    runs[speculative] = gen
                plain_rates.append(runs[False].stats.decode_tok_s)
                draft_rates.append(runs[True].stats.decode_tok_s)
                same &= runs[False].token_ids == runs[True].token_ids
                stats.append(spec.stats.to_dict())
        finally:
            spec.close()
    finally:
        target.close()
    return DraftBenchResult(
        spec.name,
        backend,
        device,
        draft_device,
        draft_k,
        tuple(plain_rates),
        tuple(draft_rates),
        same,
        tuple(stats),
        grammar is not None,
    )
