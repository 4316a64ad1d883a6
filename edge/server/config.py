"""The server's settings, in small frozen dataclasses, and the one check made before anything binds."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from edge.errors import EdgeError

__all__ = ["Limits", "LoadSettings", "ServerConfig", "UnsafeBindError", "check_bind", "is_loopback"]

LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost", "ip6-loopback"})


class UnsafeBindError(EdgeError):
    """The server was asked to listen beyond this machine without an API key."""


@dataclass(frozen=True)
class LoadSettings:
    """What `edge.load` gets for every model the server loads (the `edge serve` flags)."""

    device: str = "cpu"
    backend: str | None = "auto"  # auto: the backend that measures fastest for each model here
    fallback: bool | str = False
    precision: str = "fast"
    n_ctx: int = 4096
    n_threads: int | None = None  # None: the physical cores, split between the replicas
    draft: str | None = "auto"  # see edge.drafters.open_drafters
    draft_device: str = "cpu"
    draft_k: int = 16
    emulate: bool = False  # --device npu: the NPU-shaped graphs on the CPU
    plan: str | None = None  # a phase plan (prefill=...,decode=...: devices/phase_split.py), or None
    kv_dtype: str = "auto"  # the KV cache's type (--kv-dtype): auto | f32 | f16


@dataclass(frozen=True)
class Limits:
    """Bounds on what one request may ask, so none can exhaust memory (413 / 400 beyond them)."""

    max_body_bytes: int = 2 << 20
    max_messages: int = 512
    max_prompt_tokens: int | None = None  # None: the model's context size
    max_tokens: int = 4096  # the most new tokens one request may ask for
    queue_size: int = 32  # requests waiting per model beyond those running (429 when full)

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_messages", "max_tokens", "queue_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (got {getattr(self, name)})")


@dataclass(frozen=True)
class ServerConfig:
    models: tuple[str, ...] = ()  # catalog names or .gguf paths loaded at start (empty: the default model)
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()  # Host header names accepted besides the loopback ones
    models_max: int = (
        1  # models held at once; above the ones named at start, pulled catalog models load on demand
    )
    # requests per model run at once: slots of one batched model (replicas with a draft model, or where the
    # backend runs one sequence: a static NPU prefill half)
    parallel: int = 1
    load: LoadSettings = field(default_factory=LoadSettings)
    limits: Limits = field(default_factory=Limits)
    # seconds a model stays loaded after its last request (None: until the server stops); a request's own
    # keep_alive (Ollama's API) overrides it for its model. An unloaded model loads again on its next request.
    keep_alive_s: float | None = None

    def __post_init__(self) -> None:
        if self.parallel < 1:
            raise ValueError(f"parallel must be >= 1 (got {self.parallel})")
        if self.models_max < max(1, len(self.models)):
            raise ValueError(f"models_max ({self.models_max}) is below the {len(self.models)} models named")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535 (got {self.port})")


def is_loopback(host: str) -> bool:
    """True for a name or address that only this machine reaches."""
    name = host.strip().lower().strip("[]")
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")


def parse_duration(value: str | float | int) -> float | None:
    """A keep-alive as Ollama writes one (a number of seconds, or Go's "5m", "1h30m", "250ms") in seconds;
    a negative one is None: for ever."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):
        return None if value < 0 else float(value)
    text = value.strip()
    sign, body = (-1, text[1:]) if text.startswith("-") else (1, text)
    try:
        seconds = float(body)
    except ValueError:
        parts = _PART.findall(body)
        if not parts or "".join(n + u for n, u in parts) != body:
            raise ValueError(f"{value!r} is not a duration (e.g. 5m, 1h, 30s, 0, -1)") from None
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    return None if sign < 0 else seconds


def check_bind(config: ServerConfig) -> None:
    """Refuse to listen beyond loopback without an API key."""
    if not is_loopback(config.host) and not config.api_key:
        raise UnsafeBindError(
            f"refusing to listen on {config.host} without an API key: anyone who reaches it could use the model",
            hint="pass --api-key KEY (or set EDGE_API_KEY), or keep the default --host 127.0.0.1",
        )
