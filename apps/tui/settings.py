"""What the chat app runs with: the model and where it runs, and how it answers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChatSettings:
    model: str | None = None  # catalog name or .gguf path; None: the catalog default
    device: str = "cpu"
    backend: str | None = None  # None: auto (the backend that measures fastest for the model here)
    fallback: bool | str = False  # or the device kind to fall back to (edge chat --fallback cpu)
    draft: str | None = "auto"  # see edge.drafters.open_drafters
    system: str = ""  # system prompt of new conversations ("" leaves the template's default)
    temperature: float = 0.7
    max_tokens: int = 512
    n_ctx: int = 4096
    n_threads: int | None = None
    precision: str = "fast"  # fast | exact (the graph backends')
    emulate: bool = False  # --device npu: the NPU-shaped graphs on the CPU
    draft_device: str = "cpu"  # [backend:]device of a draft model
    draft_k: int = 16  # most tokens drafted per step
    plan: str | None = None  # split by phase: "prefill=B:D[:P],decode=B:D[:P]" (edge chat --plan)
    kv_dtype: str = "auto"  # the KV cache's type (--kv-dtype): auto | f32 | f16

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (got {self.temperature})")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 (got {self.max_tokens})")

    def load_key(self) -> tuple[object, ...]:
        """The fields that need the model loaded again when they change."""
        return (
            self.model,
            self.device,
            self.backend,
            self.fallback,
            self.draft,
            self.n_ctx,
            self.n_threads,
            self.precision,
            self.emulate,
            self.draft_device,
            self.draft_k,
            self.plan,
            self.kv_dtype,
        )
