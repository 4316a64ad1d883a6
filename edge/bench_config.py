"""What one `edge bench` run is asked (BenchConfig) and what one round of one backend measured (Sample): a leaf
that the bench and its peers (edge/bench_peers.py) both build on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from edge.devices.auto import AUTO
from edge.devices.phase_split import is_phase_plan, parse_phase_plan
from edge.errors import ContextOverflowError, EdgeError

if TYPE_CHECKING:
    from edge.grammar import Grammar

__all__ = ["BATCH_SIZES", "BenchConfig", "Sample"]

# the widths of the k-token forwards each round times after its decode (a speculative verify's price)
BATCH_SIZES = (1, 2, 4, 8, 16)


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
    kv_dtype: str = "auto"  # the KV cache's type (--kv-dtype: devices/precision.kv_dtype_for)
    # --json-schema / --json-object: also decode under this grammar's mask (edge/grammar.py), same round
    grammar: Grammar | None = None
    # --depth: tokens already in the KV before the prompt (their prefill is not timed), as llama-bench's -d
    depth: int = 0
    # --ctx-size: the KV's tokens; None: what the run needs, rounded up to 256 (KV size affects load and RSS)
    ctx_size: int | None = None

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
        if self.depth < 0:
            raise ValueError(f"--depth must be >= 0 (got {self.depth})")
        self._check_depth()
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads must be >= 1 (got {self.threads})")
        for entry in self.plans:  # a phase plan that does not parse fails before anything is measured
            if is_phase_plan(entry):
                parse_phase_plan(entry, self.precision)

    def _check_depth(self) -> None:
        if self.ctx_size is not None and self.ctx_size < self.tokens_needed:
            raise ContextOverflowError(
                f"--depth {self.depth} + --prompt-tokens {self.prompt_tokens} + --gen-tokens {self.gen_tokens}"
                f" + {max(BATCH_SIZES)} (the k-token forwards) = {self.tokens_needed} tokens do not fit in "
                f"--ctx-size {self.ctx_size}",
                hint=f"give --ctx-size {self.tokens_needed} or more, or leave it out (it then fits the run)",
            )
        if self.depth and (self.draft or self.grammar is not None):
            raise EdgeError(
                "--depth measures the plain prompt and decode; --draft, --json-schema and --json-object "
                "run at depth 0",
                hint="measure them in a run without --depth",
            )

    @property
    def tokens_needed(self) -> int:
        """The most tokens a round holds: depth + prompt + generated, then the widest k-token forward."""
        return self.depth + self.prompt_tokens + self.gen_tokens + max(BATCH_SIZES)

    @property
    def n_ctx(self) -> int:
        """Context for the run: --ctx-size, else what a round holds rounded up to 256 (KV size affects load and
        RSS)."""
        if self.ctx_size is not None:
            return self.ctx_size
        return -(-self.tokens_needed // 256) * 256


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
    # bytes of weights a decode step read (Capabilities.weights_read; 0: not known, as a peer's own pipeline)
    weights_read: int = 0
