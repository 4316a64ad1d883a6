"""What opening a model on a backend takes in memory, asked of the backend before anything is allocated.

Each backend answers for its own forms: llama.cpp maps the file and keeps an f16 KV cache padded to 256 tokens;
edge's graph backends hold the graph's weights (imported as the file's blocks) and an fp32 ring-buffer KV.
Hyper-parameters that are missing or not positive integers count as 0 (the tensor data still counts): this is a
fail-fast check, not a validation of the file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edge.errors import InsufficientMemoryError
from edge.kvcache.spec import kv_numpy_dtype
from edge.models.gguf_file import GGUFFile

__all__ = ["MemoryEstimate", "MemoryEstimator", "check_fits", "graph_memory", "llamacpp_memory"]

_MIB = 1 << 20


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int  # tensor data as the backend holds it
    kv_cache: int  # K and V for the context on every layer, in the backend's KV dtype
    scratch: int  # compute buffers (attention scores of one batch dominate)
    kv_dtype: str  # "f16" | "f32": named in the error message

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.scratch


MemoryEstimator = Callable[[GGUFFile, int, str], MemoryEstimate]  # (file, n_ctx, KV type: f32 | f16)


def _kv_bytes(kv_dtype: str) -> int:
    return np.dtype(kv_numpy_dtype(kv_dtype)).itemsize


@dataclass(frozen=True)
class _Shape:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    kv_width: int  # key_length + value_length per KV head


def _shape(gguf: GGUFFile) -> _Shape:
    md = gguf.metadata
    arch = md.get("general.architecture")

    def num(key: str, default: int) -> int:
        v = md.get(f"{arch}.{key}", default)
        if isinstance(v, np.ndarray) and v.size and v.dtype.kind in "iu":
            v = int(v.max())  # per-layer values (e.g. KV heads per layer)
        ok = isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and v > 0
        return int(v) if ok else default

    n_embd = num("embedding_length", 0)
    n_head = num("attention.head_count", 1)
    k_len = num("attention.key_length", n_embd // n_head)
    v_len = num("attention.value_length", k_len)
    return _Shape(
        num("block_count", 0), n_embd, n_head, num("attention.head_count_kv", n_head), k_len + v_len
    )


def _weights(gguf: GGUFFile) -> int:
    return sum(t.nbytes for t in gguf.tensors.values())


def file_weight_bytes_per_token(gguf: GGUFFile) -> int:
    """The file's tensor bytes one decode step reads as stored: all of them, but the embedding table where a
    separate output head exists (then one row of it is gathered a token)."""
    total = sum(t.nbytes for t in gguf.tensors.values())
    embd = gguf.tensors.get("token_embd.weight")
    return total - embd.nbytes if embd is not None and "output.weight" in gguf.tensors else total


def llamacpp_memory(gguf: GGUFFile, n_ctx: int, kv_dtype: str = "f16", n_batch: int = 512) -> MemoryEstimate:
    """llama.cpp: the mapped file, a K and V per layer in `kv_dtype` for the context padded to 256, and the
    attention scores of one batch of `n_batch` tokens."""
    s = _shape(gguf)
    n_ctx = -(-n_ctx // 256) * 256
    kv = _kv_bytes(kv_dtype) * n_ctx * s.n_layer * s.n_head_kv * s.kv_width
    scratch = 4 * min(n_batch, n_ctx) * (s.n_head * n_ctx + 8 * s.n_embd) + (32 << 20)
    return MemoryEstimate(_weights(gguf), kv, scratch, kv_dtype)


def graph_memory(gguf: GGUFFile, n_ctx: int, kv_dtype: str = "f32", chunk: int = 256) -> MemoryEstimate:
    """edge's graphs (ONNX Runtime, OpenVINO): the runtime's copy of the weights, imported as the file's blocks;
    a ring of `n_ctx` slots per layer in `kv_dtype` (an upper bound: sliding-window layers hold only their
    window); the attention scores of one prefill chunk."""
    s = _shape(gguf)
    kv = _kv_bytes(kv_dtype) * n_ctx * s.n_layer * s.n_head_kv * s.kv_width
    scratch = 4 * min(chunk, n_ctx) * (s.n_head * n_ctx + 8 * s.n_embd) + (32 << 20)
    return MemoryEstimate(_weights(gguf), kv, scratch, kv_dtype)


def check_fits(
    need: MemoryEstimate, name: str, backend: str, n_ctx: int, available: int | None = None
) -> None:
    """Raise InsufficientMemoryError when `need` (model `name` on `backend`) exceeds the free memory
    (`available` pins it)."""
    import psutil

    free = psutil.virtual_memory().available if available is None else available
    if need.total <= free:
        return
    raise InsufficientMemoryError(
        f"{name} needs about {need.total // _MIB} MiB of memory on {backend} (weights {need.weights // _MIB} MiB, "
        f"KV cache for {n_ctx} tokens {need.kv_cache // _MIB} MiB in {need.kv_dtype}, "
        f"buffers {need.scratch // _MIB} MiB) but {free // _MIB} MiB is available",
        needed=need.total,
        available=free,
        hint="close other programs, lower --ctx-size, "
        + ("keep the KV cache in f16 (--kv-dtype f16), " if need.kv_dtype == "f32" else "")
        + "or use a smaller (more quantized) model",
    )


def check_slots_fit(n: int, kv_bytes: int) -> None:
    """n slots hold n KV caches where the load sized one (its own, freed for them): the n - 1 more must fit."""
    import psutil

    more, free = (n - 1) * kv_bytes, psutil.virtual_memory().available
    if more > free:
        raise InsufficientMemoryError(
            f"{n} slots need {n} KV caches of {kv_bytes >> 20} MiB: {more >> 20} MiB more than the model's "
            f"first, and {free >> 20} MiB is available",
            needed=more,
            available=free,
            hint="fewer slots (--parallel), or a smaller --ctx-size",
        )
