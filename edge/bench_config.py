"""What one `edge bench` run is asked (BenchConfig) and what one round of one backend measured (Sample): a leaf
that the bench and its peers (edge/bench_peers.py) both build on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from edge.devices.auto import AUTO
from edge.devices.phase_split import is_phase_plan, parse_phase_plan

if TYPE_CHECKING:
    from edge.grammar import Grammar

__all__ = ["BenchConfig", "Sample"]


@dataclass(frozen=True)
class BenchConfig:
    # "auto": the backend `--backend auto` runs the model on (resolved by run_bench, which says why)
    backends: tuple[str, ...] = (AUTO,)
    against: str | None = None  # the ratios' reference; None: the first of `backends`
    device: str = "cpu"
    prompt_tokens: int = 128
    gen_tokens: int = 128
    repeat: int = 5
    threads: int | None = None  # None: the backend's default (physical cores)
    # --draft: also decode on --against with and without speculative decoding (edge.bench_draft)
    draft: str | None = None
    draft_device: str = "cpu"
    draft_k: int = 16
    # --plan: device plans measured beside the backends (e.g. "hetero:openvino:cpu,ort:cpu", "npu-emulated"),
    # each through the planner, with the time of each of its partitions
    plans: tuple[str, ...] = ()
    precision: str = "fast"  # the graph backends' (llama.cpp has one)
    # --json-schema / --json-object: also decode under this grammar's mask (edge/grammar.py), same round
    grammar: Grammar | None = None

    @property
    def entries(self) -> tuple[str, ...]:
        return self.backends + self.plans

    def __post_init__(self) -> None:
        if self.draft_k < 1:
            raise ValueError(f"--draft-k must be >= 1 (got {self.draft_k})")
        if not self.backends:
            raise ValueError("--backends must name at least one backend")
        if len(set(self.backends)) != len(self.backends):
            raise ValueError(f"--backends lists a backend twice: {','.join(self.backends)}")
        if self.against is None:
            object.__setattr__(self, "against", self.backends[0])
        if self.against not in self.backends:
            raise ValueError(f"--against {self.against} is not in --backends {','.join(self.backends)}")
        for name, value in (
            ("prompt-tokens", self.prompt_tokens),
            ("gen-tokens", self.gen_tokens),
            ("repeat", self.repeat),
        ):
            if value < 1:
                raise ValueError(f"--{name} must be >= 1 (got {value})")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads must be >= 1 (got {self.threads})")
        for entry in self.plans:  # a phase plan that does not parse fails before anything is measured
            if is_phase_plan(entry):
                parse_phase_plan(entry, self.precision)

    @property
    def n_ctx(self) -> int:
        """Context for the run: prompt + generated tokens, rounded up to 256 (KV size affects load and RSS)."""
        need = self.prompt_tokens + self.gen_tokens + 1
        return -(-need // 256) * 256


@dataclass(frozen=True)
class Sample:
    """One backend in one round."""

    load_s: float
    ttft_ms: float
    prefill_tok_s: float
    decode_tok_s: float
    peak_rss_mb: float
    rss_growth_mb: float
    prefill_warm_tok_s: float = 0.0  # the same prompt again after reset: shapes already seen
    # time of a forward of k tokens (all rows' logits, what a speculative verify needs) in one-token decode
    # steps, for k in BATCH_SIZES
    batch_cost: tuple[float, ...] = ()
    # per partition of a plan: (label, prefill ms, decode ms per token)
    partitions: tuple[tuple[str, float, float], ...] = ()
    # --json-schema: greedy decode steps under the grammar's mask (mask + advance + the forward), and the
    # same number of the plain decode's first steps, in tok/s (0.0: no grammar)
    constrained_decode_tok_s: float = 0.0
    plain_decode_same_steps_tok_s: float = 0.0
    constrained_steps: int = 0
    # --json-schema: whole greedy generations under the grammar, its forced tokens fed in one forward
    # (edge/fastforward.py) and drawn one step each, in tokens per second of decode; whether their outputs
    # are the same token for token; how many tokens were forced
    fast_forward_tok_s: float = 0.0
    step_by_step_tok_s: float = 0.0
    fast_forward_identical: bool = True
    forced_tokens: int = 0
