"""Tiny decoder graphs and random feeds for the graph_opt tests: each pass is checked by running the graph
before and after it on the same random inputs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from edge.models.arch import ArchConfig
from edge.models.gguf_file import open_gguf
from edge.models.transformer import BuildOptions, build_decoder
from tests.tiny_models import TinySpec, write_tiny_model

ARCHS = ("llama", "qwen2", "gemma3", "qwen3", "phi3")
SPECS = {
    "llama": TinySpec(arch="llama"),
    "qwen2": TinySpec(arch="qwen2", tied=True, seed=1),
    "gemma3": TinySpec(arch="gemma3", n_layer=6, sliding_window=8, rope_base=1e6, seed=2),
    "qwen3": TinySpec(arch="qwen3", seed=3),
    "phi3": TinySpec(arch="phi3", seed=9),  # fused QKV and gate-up tensors
}


def tiny_gguf(root: Path, arch: str, spec: TinySpec | None = None) -> Path:
    path = root / f"{arch}.gguf"
    if not path.exists():
        write_tiny_model(path, spec or SPECS[arch])
    return path


def tiny_config(path: Path) -> ArchConfig:
    g = open_gguf(path)
    return ArchConfig.from_gguf(g.metadata, set(g.tensors))


def tiny_graph(path: Path, options: BuildOptions | None = None) -> onnx.ModelProto:
    g = open_gguf(path)
    return build_decoder(g, None, options)


def feeds_for(
    model: onnx.ModelProto, cfg: ArchConfig, *, q: int = 3, past: int = 5, seed: int = 0
) -> dict[str, np.ndarray]:
    """Random inputs for every graph input: hidden states, K/V prefixes, positions after the past, and masks
    that hide one past slot and the future (every row sees at least itself)."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for inp in model.graph.input:
        name = inp.name
        if name == "hidden":
            feeds[name] = rng.standard_normal((1, q, cfg.n_embd)).astype(np.float32)
        elif name == "positions":
            feeds[name] = np.arange(past, past + q, dtype=np.int64)
        elif name.startswith("mask_"):
            mask = np.zeros((1, 1, q, past + q), np.float32)
            mask[..., 1] = -np.inf
            mask[0, 0, :, past:] = np.where(np.tri(q, dtype=bool), 0.0, -np.inf)
            feeds[name] = mask
        elif name.startswith("past_"):
            feeds[name] = rng.standard_normal((1, past, cfg.n_head_kv, cfg.head_dim)).astype(np.float32)
        elif name == "logit_rows":
            feeds[name] = np.arange(q, dtype=np.int64)
        else:
            raise KeyError(name)
    return feeds


def to_ir(model: onnx.ModelProto) -> ir.Model:
    return ir.serde.deserialize_model(model)


def to_proto(model: ir.Model) -> onnx.ModelProto:
    return ir.serde.serialize_model(model)


def run_ort(model: onnx.ModelProto | ir.Model, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    proto = to_proto(model) if isinstance(model, ir.Model) else model
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, dict(feeds)), strict=True))


def run_openvino(
    model: onnx.ModelProto | ir.Model, feeds: Mapping[str, np.ndarray], tmp: Path
) -> dict[str, np.ndarray]:
    import openvino as ov

    proto = to_proto(model) if isinstance(model, ir.Model) else model
    path = tmp / "ov_model.onnx"
    onnx.save_model(proto, path)
    core = ov.Core()
    compiled = core.compile_model(
        str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}
    )
    res = compiled(dict(feeds))
    return {out.get_any_name(): np.asarray(res[out]) for out in compiled.outputs}


def max_abs_diff(
    a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray], names: Sequence[str] | None = None
) -> float:
    keys = names or sorted(a)
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in keys)


def ops(model: ir.Model | onnx.ModelProto) -> dict[str, int]:
    from collections import Counter

    nodes = model.graph.all_nodes() if isinstance(model, ir.Model) else model.graph.node
    return dict(Counter(n.op_type for n in nodes))


def token_feeds(model: onnx.ModelProto, path: Path, *, q: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    """A prefill of q random token ids from an empty cache: embeddings as the model sees them (quantization
    is judged on these; random normal hidden states are far from any embedding a model was built for)."""
    from edge.models.transformer import Embedder

    g = open_gguf(path)
    cfg = ArchConfig.from_gguf(g.metadata, set(g.tensors))
    feeds = feeds_for(model, cfg, q=q, past=0, seed=seed)
    ids = np.random.default_rng(seed).integers(3, cfg.n_vocab, q).tolist()
    feeds["hidden"] = Embedder(g, cfg)(ids)
    return feeds


def linear_graph(
    weights: Mapping[str, np.ndarray | object], *, rows: int = 3, lowering: str = "nbits"
) -> onnx.ModelProto:
    """A graph of linears (graph_opt's emitter, tagged) all reading x [rows, k]: output y_<name> per weight."""
    from onnx import TensorProto, helper

    from edge.graph_opt import BlockWeight, linear_protos

    nodes, inits, outputs = [], [], []
    k = None
    for name, w in weights.items():
        n, k = (w.n, w.k) if isinstance(w, BlockWeight) else w.shape  # type: ignore[union-attr]
        lin_nodes, lin_inits = linear_protos(w, "x", f"y_{name}", name, lowering=lowering, rank=2)  # type: ignore[arg-type]
        nodes += lin_nodes
        inits += lin_inits
        outputs.append(helper.make_tensor_value_info(f"y_{name}", TensorProto.FLOAT, [rows, n]))
    graph = helper.make_graph(
        nodes, "linears", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])], outputs, inits
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model
