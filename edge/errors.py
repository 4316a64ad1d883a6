"""Typed errors shared by every layer.

NOTE: this module imports nothing from the project, so the lower layers (models, devices, kvcache)
may raise these types without importing the higher layers of `edge`; it is the one allowed upward import.
"""

from __future__ import annotations


class EdgeError(Exception):
    """Base of every error edge raises on purpose. `hint` says what the user can do about it."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class ModelFormatError(EdgeError):
    """A model file is truncated, corrupt, hostile or of a kind edge cannot read."""


class ModelNotFoundError(EdgeError):
    """A model name is not in the catalog and is not a readable file."""


class PullError(EdgeError):
    """Fetching or assembling a catalog model failed."""


class ChecksumError(PullError):
    """An assembled model file does not have the SHA-256 the catalog promises."""


class PullCancelled(PullError):
    """A pull stopped by its caller (a progress callback raised it); the cache is left as it was."""


class ModelInUseError(EdgeError):
    """A model's files cannot be removed now: it is loaded, being served or being pulled."""


class TokenizerError(EdgeError):
    """The tokenizer described by a model file cannot be built or used."""


class TemplateError(EdgeError):
    """A chat template is unsafe, too expensive, or fails to render."""


class GrammarError(EdgeError):
    """A schema or grammar for constrained output is invalid, cannot be enforced, or admits no token."""


class ToolError(EdgeError):
    """A request's tools or tool_choice are invalid, or the model cannot make tool calls (a 400)."""


class ThinkingError(EdgeError):
    """A request asks for thinking (on, or a budget) of a model whose chat template does not think (a 400);
    `param` is the request field that asked."""

    def __init__(self, message: str, *, hint: str | None = None, param: str = "reasoning") -> None:
        super().__init__(message, hint=hint)
        self.param = param


class ConstraintError(EdgeError):
    """Constrained decoding failed mid-answer (the engine's state, not the request's schema): a server error."""


class DeviceError(EdgeError):
    """A requested device or backend is not available."""


class DeviceLostError(DeviceError):
    """A backend failed mid-generation (the device went away, a driver error). `failed` is the "backend:device"
    that failed; `switched_to` the one the model now runs on when it was loaded with fallback, else None."""

    def __init__(
        self, message: str, *, failed: str, switched_to: str | None = None, hint: str | None = None
    ) -> None:
        super().__init__(message, hint=hint)
        self.failed = failed
        self.switched_to = switched_to


class NoUsableDeviceError(DeviceError):
    """No backend runs the device asked for (`--device gpu` tries each that reports one). `attempts` holds each
    backend tried and why it did not run there, in the order tried."""

    def __init__(
        self, message: str, *, attempts: tuple[tuple[str, str], ...], hint: str | None = None
    ) -> None:
        super().__init__(message, hint=hint)
        self.attempts = attempts


class BackendUnavailableError(DeviceError):
    """A backend's SDK is not installed or cannot load."""


class PlanError(DeviceError):
    """A phase plan (`--plan prefill=B:D[:P],decode=B:D[:P]`) that does not parse, or whose halves cannot run
    together."""


class ContextOverflowError(EdgeError):
    """A prompt or a generation does not fit in the model's context."""


class GenerationCancelled(EdgeError):
    """Generation was stopped by the caller; the model state stays usable."""


class InsufficientMemoryError(EdgeError):
    """A model needs more memory than the machine has free; raised before anything large is allocated."""

    def __init__(self, message: str, *, needed: int, available: int, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.needed = needed
        self.available = available


class VocabMismatchError(EdgeError):
    """A draft model's vocabulary differs from its target's: its token ids would mean other text."""
