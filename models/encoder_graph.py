"""The BERT encoder as an ONNX graph, from a checked sentence-transformers folder (models/encoder_folder.py):
bidirectional attention under a padding mask, absolute positions, token types, exact (erf) GELU, post-norm;
then the folder's declared pooling and, when declared, L2 normalization. Many inputs per forward:

    inputs   input_ids       int64   [b, s]     padded with anything (masked out)
             attention_mask  int64   [b, s]     1 for a real token, 0 for padding
             token_type_ids  int64   [b, s]
    outputs  embeddings      float32 [b, d]

Weights are imported as stored (f32; f16/bf16 widened exactly); positions are 0..s-1 (right padding).
"""

from __future__ import annotations

import math

import numpy as np

from edge.models.encoder_folder import EncoderSource

__all__ = ["OPSET", "build_encoder"]

OPSET = 18  # LayerNormalization; axes as inputs of ReduceL2 and ReduceMax
_NEG = -1e9
# inputs per int8 weight scale (one scale per output channel gave cosine 0.9985 on MiniLM, below fast's 0.999)
INT8_GROUP = 32  # added to a padded key's score: exp() of it is exactly 0 in f32


class _G:
    def __init__(self, int8_weights: bool = False) -> None:
        self.int8_weights = int8_weights
        from onnx import helper, numpy_helper

        self.h, self.nh = helper, numpy_helper
        self.nodes: list = []
        self.inits: list = []
        self._n = 0
        self._names: set[str] = set()

    def op(self, op_type: str, *inputs: str, domain: str = "", **attrs: object) -> str:
        self._n += 1
        out = f"{op_type.lower()}_{self._n}"
        node = self.h.make_node(op_type, list(inputs), [out], name=f"n{self._n}", domain=domain, **attrs)
        self.nodes.append(node)
        return out

    def const(self, name: str, value: np.ndarray) -> str:
        """An initializer; a name seen before is the same constant (the shared scalars, the shapes)."""
        if name in self._names:
            return name
        self._names.add(name)
        self.inits.append(self.nh.from_array(np.ascontiguousarray(value), name))
        return name

    def linear(self, x: str, w: np.ndarray, b: np.ndarray, name: str) -> str:
        # [out, in] as stored -> MatMul's [in, out]
        wt = w.T.astype(np.float32)
        if self.int8_weights and wt.shape[0] % INT8_GROUP == 0:
            weight = self._int8(wt, name)
        else:
            weight = self.const(f"{name}.weight_t", wt)
        return self.op("Add", self.op("MatMul", x, weight), self.const(f"{name}.bias", b.astype(np.float32)))

    def _int8(self, wt: np.ndarray, name: str) -> str:
        """Symmetric int8 codes with one scale per INT8_GROUP inputs of each output, widened in the graph
        (int8 -> f32, times the scales, back to [in, out]): the form OpenVINO runs as compressed weights."""
        n_in, n_out = wt.shape
        grouped = wt.reshape(n_in // INT8_GROUP, INT8_GROUP, n_out)
        scale = np.maximum(np.abs(grouped).max(1, keepdims=True), 1e-30) / 127.0
        codes = np.clip(np.round(grouped / scale), -127, 127).astype(np.int8)
        wide = self.op("Cast", self.const(f"{name}.weight_q", codes), to=1)
        scaled = self.op("Mul", wide, self.const(f"{name}.weight_s", scale.astype(np.float32)))
        return self.op(
            "Reshape", scaled, self.const(f"{name}.weight_shape", np.array([n_in, n_out], np.int64))
        )

    def norm(self, x: str, f: EncoderSource, name: str) -> str:
        w, b = f.weight(f"{name}.weight"), f.weight(f"{name}.bias")
        return self.op(
            "LayerNormalization", x, self.const(f"{name}.weight", w), self.const(f"{name}.bias", b),
            axis=-1, epsilon=f.config.eps,
        )  # fmt: skip


def _embeddings(g: _G, f: EncoderSource) -> str:
    words = g.op(
        "Gather", g.const("word_embeddings", f.weight("embeddings.word_embeddings.weight")), "input_ids"
    )
    type_table = g.const("type_embeddings", f.weight("embeddings.token_type_embeddings.weight"))
    types = g.op("Gather", type_table, "token_type_ids")
    # positions 0..s-1 on every row, [b, s]: a cumulative sum of ones (no scalar shape arithmetic)
    ones = g.op("ConstantOfShape", g.op("Shape", "input_ids"), value=g.h.make_tensor("one", 7, [1], [1]))
    one = g.const("one_i", np.array(1, np.int64))
    positions = g.op("Sub", g.op("CumSum", ones, one), one)
    pos_table = g.const("position_embeddings", f.weight("embeddings.position_embeddings.weight"))
    pos = g.op("Gather", pos_table, positions)
    return g.norm(g.op("Add", g.op("Add", words, types), pos), f, "embeddings.LayerNorm")


def _fused_attention(g: _G, f: EncoderSource, x: str, lay: str) -> str:
    """ONNX Runtime's MultiHeadAttention (com.microsoft): one kernel for the heads' scores, the padding mask
    (key_padding_mask [b, s]) and the softmax, on [b, s, d] Q/K/V as the linears give them."""
    name = f"{lay}attention.self"
    q, k, v = (
        g.linear(x, f.weight(f"{name}.{t}.weight"), f.weight(f"{name}.{t}.bias"), f"{name}.{t}")
        for t in ("query", "key", "value")
    )
    ctx = g.op(
        "MultiHeadAttention", q, k, v, "", "mask_i32", domain="com.microsoft", num_heads=f.config.n_head
    )
    out = f"{lay}attention.output"
    y = g.linear(ctx, f.weight(f"{out}.dense.weight"), f.weight(f"{out}.dense.bias"), f"{out}.dense")
    return g.norm(g.op("Add", y, x), f, f"{out}.LayerNorm")


def _attention(g: _G, f: EncoderSource, x: str, mask: str, lay: str) -> str:
    cfg = f.config
    heads = g.const("heads_shape", np.array([0, 0, cfg.n_head, cfg.head_dim], np.int64))

    def proj(kind: str, perm: list[int]) -> str:
        name = f"{lay}attention.self.{kind}"
        y = g.linear(x, f.weight(f"{name}.weight"), f.weight(f"{name}.bias"), name)
        return g.op("Transpose", g.op("Reshape", y, heads), perm=perm)

    q, k, v = proj("query", [0, 2, 1, 3]), proj("key", [0, 2, 3, 1]), proj("value", [0, 2, 1, 3])
    scale = g.const("attn_scale", np.array(1.0 / math.sqrt(cfg.head_dim), np.float32))
    scores = g.op("Add", g.op("Mul", g.op("MatMul", q, k), scale), mask)  # [b, h, s, s]
    ctx = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)  # [b, h, s, hd]
    merge_shape = g.const("merge_shape", np.array([0, 0, cfg.hidden], np.int64))
    merged = g.op("Reshape", g.op("Transpose", ctx, perm=[0, 2, 1, 3]), merge_shape)
    out = f"{lay}attention.output"
    y = g.linear(merged, f.weight(f"{out}.dense.weight"), f.weight(f"{out}.dense.bias"), f"{out}.dense")
    return g.norm(g.op("Add", y, x), f, f"{out}.LayerNorm")


def _feed_forward(g: _G, f: EncoderSource, x: str, lay: str) -> str:
    name = f"{lay}intermediate.dense"
    h = g.linear(x, f.weight(f"{name}.weight"), f.weight(f"{name}.bias"), name)
    # exact GELU: 0.5 x (1 + erf(x / sqrt 2)) (ONNX Runtime fuses the pattern)
    erf = g.op("Erf", g.op("Mul", h, g.const("inv_sqrt2", np.array(1 / math.sqrt(2), np.float32))))
    half_h = g.op("Mul", h, g.const("half", np.array(0.5, np.float32)))
    gelu = g.op("Mul", half_h, g.op("Add", erf, g.const("one_f", np.array(1.0, np.float32))))
    name = f"{lay}output.dense"
    y = g.linear(gelu, f.weight(f"{name}.weight"), f.weight(f"{name}.bias"), name)
    return g.norm(g.op("Add", y, x), f, f"{lay}output.LayerNorm")


def _pool(g: _G, f: EncoderSource, h: str, m: str) -> str:
    """h [b, s, d], m float [b, s] -> [b, d] by the folder's pooling mode."""
    mode = f.pooling.mode
    m3 = g.op("Unsqueeze", m, g.const("axis_last", np.array([-1], np.int64)))  # [b, s, 1]
    axis1 = g.const("axis1", np.array([1], np.int64))
    if mode == "cls":
        # NOTE: a Slice, not a Gather of index 0: ORT's optimizer rewrites a scalar-index Gather into a Slice
        # it then runs wrongly (a [b, 1, d] result, or "Starts must be a 1-D array")
        start, end = g.const("zero_1", np.array([0], np.int64)), g.const("one_1", np.array([1], np.int64))
        first = g.op("Slice", h, start, end, axis1)
        return g.op("Squeeze", first, axis1)
    if mode == "max":
        pad_shift = g.op("Mul", g.op("Sub", m3, "one_f"), g.const("big", np.array(1e9, np.float32)))
        masked = g.op("Add", h, pad_shift)
        return g.op("ReduceMax", masked, axis1, keepdims=0)
    total = g.op("ReduceSum", g.op("Mul", h, m3), axis1, keepdims=0)
    count = g.op("Max", g.op("ReduceSum", m3, axis1, keepdims=0), g.const("tiny", np.array(1e-9, np.float32)))
    return g.op("Div", total, count)


def build_encoder(  # type: ignore[no-untyped-def]
    f: EncoderSource, *, fused: bool = False, int8_weights: bool = False
):
    """The encoder of folder `f` as an onnx.ModelProto (weights inline: a BERT-base is ~0.4 GB). `fused`:
    attention as ONNX Runtime's MultiHeadAttention kernel (ORT only; else standard ONNX ops throughout).
    `int8_weights`: the linears' weights as int8 codes, a scale per 32 inputs (OpenVINO reads the pattern as
    compressed weights and runs its int8 kernels on them)."""
    from onnx import TensorProto

    g = _G(int8_weights)
    h = g.h
    m = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)  # [b, s]
    axes = g.const("axes_12", np.array([1, 2], np.int64))
    # 0 over real keys, _NEG over padding: (m - 1) * -_NEG, [b, 1, 1, s]
    shifted = g.op("Sub", g.op("Unsqueeze", m, axes), g.const("one_f", np.array(1.0, np.float32)))
    mask = g.op("Mul", shifted, g.const("neg", np.array(-_NEG, np.float32)))
    x = _embeddings(g, f)
    if fused:
        g.nodes.append(
            h.make_node("Cast", ["attention_mask"], ["mask_i32"], name="mask_i32", to=TensorProto.INT32)
        )
    for n in range(f.config.n_layer):
        lay = f"encoder.layer.{n}."
        att = _fused_attention(g, f, x, lay) if fused else _attention(g, f, x, mask, lay)
        x = _feed_forward(g, f, att, lay)
    pooled = _pool(g, f, x, m)
    if f.pooling.normalize:  # torch's F.normalize: x / max(|x|, 1e-12)
        norm = g.op("ReduceL2", pooled, g.const("axis_m1", np.array([-1], np.int64)), keepdims=1)
        pooled = g.op("Div", pooled, g.op("Max", norm, g.const("eps12", np.array(1e-12, np.float32))))
    g.nodes.append(h.make_node("Identity", [pooled], ["embeddings"], name="out"))
    names = ("input_ids", "attention_mask", "token_type_ids")
    ids = [h.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"]) for n in names]
    out = h.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["batch", f.config.hidden])
    graph = h.make_graph(g.nodes, "bert_encoder", ids, [out], g.inits)
    opsets = [h.make_opsetid("", OPSET)] + ([h.make_opsetid("com.microsoft", 1)] if fused else [])
    return h.make_model(graph, opset_imports=opsets, producer_name="edge")
