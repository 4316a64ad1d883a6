"""The memory-bandwidth roofline of decoding: weights read per token / measured read bandwidth.

Decoding one token reads every weight matrix once, so on a CPU it is bound by memory bandwidth:
bound tok/s = bandwidth / bytes of weights per token. Measured decode speed is reported as a fraction of it.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from edge.devices.memory import file_weight_bytes_per_token
from edge.models.gguf_file import GGUFFile

__all__ = ["Bandwidth", "WeightBytes", "measure_read_bandwidth", "weight_bytes_per_token"]

TOKEN_EMBEDDING = "token_embd.weight"


@dataclass(frozen=True)
class WeightBytes:
    bytes_per_token: int
    total_tensor_bytes: int
    excluded: tuple[str, ...]  # tensors not read in full per token
    note: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def weight_bytes_per_token(gguf: GGUFFile) -> WeightBytes:
    """Sum of tensor bytes read to decode one token (KV-cache reads, small at these lengths, not counted)."""
    total = sum(t.nbytes for t in gguf.tensors.values())
    per_token = file_weight_bytes_per_token(gguf)
    if per_token < total:
        # NOTE: with a separate output head the embedding table is only gathered (one row per token).
        note = f"{TOKEN_EMBEDDING} excluded: only one row of it is gathered per token"
        return WeightBytes(per_token, total, (TOKEN_EMBEDDING,), note)
    note = (
        f"all tensors counted: the embeddings are tied, {TOKEN_EMBEDDING} is read in full as the output head"
    )
    return WeightBytes(total, total, (), note)


@dataclass(frozen=True)
class Bandwidth:
    gb_s: float  # best of the repeats, all threads together (1 GB = 1e9 bytes)
    median_gb_s: float  # the typical pass; on a shared or virtual machine it can sit well below the best
    single_thread_gb_s: float
    threads: int
    array_mb: int
    repeats: int
    method: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure_read_bandwidth(threads: int = 1, *, array_mb: int = 512, repeats: int = 10) -> Bandwidth:
    """Read bandwidth from numpy sums over an array far larger than any cache (~1 s for 512 MB).

    A sum is the cheapest full read numpy has; it still does arithmetic, so this is a lower bound of what the
    memory system gives, and decode's fraction of the resulting roofline is, if anything, an overestimate.
    """
    if threads < 1 or array_mb < 1 or repeats < 1:
        raise ValueError("threads, array_mb and repeats must be >= 1")
    data = np.ones(array_mb * 2**20 // 8, dtype=np.float64)  # written once, so every page is resident
    parts = np.array_split(data, threads)

    def read_all() -> None:  # numpy releases the GIL inside the sum, so the threads read in parallel
        workers = [threading.Thread(target=np.sum, args=(p,)) for p in parts]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    multi = _seconds(read_all, repeats)
    single = _seconds(lambda: np.sum(data), repeats)
    gb = data_bytes(array_mb) / 1e9
    return Bandwidth(
        gb_s=gb / min(multi),
        median_gb_s=gb / statistics.median(multi),
        single_thread_gb_s=gb / min(single),
        threads=threads,
        array_mb=array_mb,
        repeats=repeats,
        method=f"numpy float64 sum over {array_mb} MiB split across {threads} thread(s), best of {repeats}",
    )


def data_bytes(array_mb: int) -> int:
    return array_mb * 2**20 // 8 * 8


def _seconds(fn: Callable[[], object], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out
