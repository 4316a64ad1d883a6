"""An encoder graph (models/encoder_graph.py) opened on a runtime: ONNX Runtime or OpenVINO, on the CPU.

Precision: "exact" is the graph's fp32 as built (OpenVINO told to keep f32, no bf16 rounding). "fast" uses
int8 only where it holds cosine >= 0.999 to a float64 forward. On OpenVINO it does: the graph's weights are
int8 with a scale per 32 inputs (OpenVINO's compressed weights) and its dynamic quantization takes the
activations per group of 16 (DQ_GROUP). On ONNX Runtime it does not: its dynamic int8 MatMuls (per-channel
weights, one activation scale per tensor per forward) gave 0.9895 on all-MiniLM-L6-v2 (0.9985 with the
feed-forwards left in f32), as BERT's activations carry outliers one scale cannot hold; there "fast" is fp32
on its fused attention kernel.
"""

from __future__ import annotations

import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge.errors import BackendUnavailableError, DeviceError

__all__ = ["ENCODER_BACKENDS", "EncoderOptions", "EncoderRunner", "open_encoder", "resolve_backend"]

ENCODER_BACKENDS = ("ort", "openvino")
PRECISIONS = ("fast", "exact")
# OpenVINO's activation groups at fast, on weights with a scale per 32 inputs (models/encoder_graph.py): on
# MiniLM's test texts 16 -> cosine 0.99934, 32 -> 0.99896 (below 0.999); interleaved on 1 loaded core it ran
# 1.4x f32's sentences/s and about half its one-query latency
DQ_GROUP = 16


def resolve_backend(backend: str) -> str:
    """`auto`: OpenVINO where it imports (on 2 cores it embedded 1.6-2.2x the sentences/s of ONNX Runtime on
    MiniLM, `edge bench --embed`), else ONNX Runtime; another name is checked and kept."""
    if backend == "auto":
        try:
            import openvino  # noqa: F401
        except ImportError:
            return "ort"
        return "openvino"
    if backend not in ENCODER_BACKENDS:
        raise DeviceError(
            f"an encoder runs on {', '.join(ENCODER_BACKENDS)}, not {backend!r}",
            hint="pass --backend auto, ort or openvino",
        )
    return backend


@dataclass(frozen=True)
class EncoderOptions:
    backend: str = "ort"
    precision: str = "fast"
    n_threads: int | None = None  # None: the runtime's default (the physical cores)


class EncoderRunner:
    """One compiled encoder; `run` takes padded [b, s] int64 ids, mask and types, gives [b, d] float32."""

    def __init__(self, run: Any, backend: str, precision: str) -> None:
        self._run = run
        self.backend = backend
        self.precision = precision

    def run(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        return np.asarray(self._run(ids, mask, types), dtype=np.float32)


def open_encoder(model: Any, opts: EncoderOptions) -> EncoderRunner:
    """Compile the onnx.ModelProto `model` on `opts.backend` at `opts.precision`."""
    if opts.precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)} (got {opts.precision!r})")
    if opts.backend == "ort":
        return EncoderRunner(_ort(model, opts), "ort", opts.precision)
    if opts.backend == "openvino":
        return EncoderRunner(_openvino(model, opts), "openvino", opts.precision)
    raise DeviceError(
        f"an encoder runs on {', '.join(ENCODER_BACKENDS)}, not {opts.backend!r}",
        hint="pass --backend ort or --backend openvino",
    )


def _ort(model: Any, opts: EncoderOptions) -> Any:
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise BackendUnavailableError(f"onnxruntime cannot be imported: {exc}") from None
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if opts.n_threads:
        so.intra_op_num_threads = opts.n_threads
    data = model.SerializeToString()
    session = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])

    def run(ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return session.run(["embeddings"], feeds)[0]

    return run


def _openvino(model: Any, opts: EncoderOptions) -> Any:
    try:
        import openvino as ov
    except ImportError as exc:
        raise BackendUnavailableError(f"openvino cannot be imported: {exc}") from None
    core = ov.Core()
    config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32"}  # no bf16 rounding of the products
    if opts.precision == "fast":  # int8 weights (the graph's): activations quantized per group of 16
        config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = str(DQ_GROUP)
    if opts.n_threads:
        config["INFERENCE_NUM_THREADS"] = opts.n_threads
    with tempfile.TemporaryDirectory(prefix="edge-encoder-") as tmp:
        path = os.path.join(tmp, "encoder.onnx")
        Path(path).write_bytes(model.SerializeToString())
        compiled = core.compile_model(core.read_model(path), "CPU", config)
    # NOTE: an InferRequest is not safe to share between threads (the server embeds in a thread pool): one per
    # thread, on the one compiled model
    local = threading.local()

    def run(ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        request = getattr(local, "request", None)
        if request is None:
            request = local.request = compiled.create_infer_request()
        out = request.infer({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
        return next(iter(out.values())).copy()

    return run
