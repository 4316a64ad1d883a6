"""The shared decoder-only transformer as an ONNX graph, built from a GGUF (one builder for every family;
`models/archs/<arch>.py` declares what differs: its `ArchTraits`, tensor names from `models/arch.py`).

Graph contract (q = new tokens this step, r = rows whose logits are wanted, L_k = past slots bound for KV
kind k: all dynamic; a static-shape device fixes them):

    inputs   hidden      float32 [1, q, d]        embeddings (see `Embedder`), or the previous partition's output
             positions   int64   [q]              absolute positions, for RoPE
             mask_<k>    float32 [1, 1, q, L_k+q]  additive mask over (past slots ++ new tokens) per KV kind
             past_key_<i>, past_value_<i>  float32 [1, L_k, kvh, hd]   a slot prefix of layer i's ring buffer
                                                      (float16 with BuildOptions.kv_dtype "f16")
             logit_rows  int64   [r]              (with the head) positions within the step to score
    outputs  logits      float32 [1, r, vocab]    (with the head) else hidden_out [1, q, d]
             new_key_<i>, new_value_<i>  float32 [1, q, kvh, hd]    K (rotated) / V of the new tokens only

Staged attention (`BuildOptions.staged`, w = staging slots): the new tokens' K/V are scattered into a staging
window first and the queries get one padding row, so a row's columns (past slots ++ staging slots) and every
matmul's shape class do not depend on how many tokens the step carries:

             stage_key_<i>, stage_value_<i>  float32 [1, w, kvh, hd]   the staging window's K/V (a copy;
                                                      float16 with kv_dtype "f16", as past_*)
             stage_index int64   [1, q, 2]              (0, staging slot) of each new token
             mask_<k>    float32 [1, 1, q+1, L_k+w]   over (past slots ++ staging slots); the last row is the
                                                      padding query's (any finite row)

(MLAS takes another kernel for a one-row matmul, whose sums round differently: the padding row keeps every
attention matmul at >= 2 rows. Measured: ORT's MatMul and opset-23 Attention give bit-identical rows for any
row count >= 2 at a fixed column count, not for 1.)

K is cached after RoPE at absolute positions, so the cache may keep slots in any order. RoPE is always the
NeoX (halves) form in the graph: for families whose GGUF uses adjacent pairs (llama), the Q/K weight rows are
permuted within each head at import, which leaves q.k unchanged and is exact for quantized rows too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from edge.errors import ModelFormatError
from edge.graph_opt import kquant_op
from edge.graph_opt.weight import BlockWeight, stack_rows, take_rows
from edge.kvcache.spec import kv_numpy_dtype
from edge.models.arch import GLOBAL_TENSORS, LAYER_TENSORS, ArchConfig
from edge.models.gguf_file import GGUFFile
from edge.models.weights import dequantize_rows, import_linear

OPSET = 21
SPILL_MIN = 1024  # initializers of at least this many bytes go to the external file as they are built


@dataclass(frozen=True)
class BuildOptions:
    first_layer: int = 0
    last_layer: int | None = None  # exclusive; None = all layers
    head: bool = True  # final norm + lm_head (the last partition)
    lowering: str = "nbits_split"  # quantized linears' ONNX form: graph_opt.FORMS (nbits_split = nbits)
    accuracy_level: int = 0  # MatMulNBits accuracy level; 0 = fp32-exact
    head_accuracy_level: int | None = None  # for the lm_head alone (None: accuracy_level)
    long_rope: bool = False  # LongRoPE's long table (KV past the original context: ArchConfig.long_rope)
    # Batch-invariant attention (see "Staged attention" above): every row attends over the same columns in the
    # same order whether its forward carries 1 token or a verify batch, so speculative decoding's output
    # equals one-token decoding bit for bit.
    staged: bool = False
    # Attention per slot (devices/batch.py): a packed step's rows gathered into [slots, rows] (input slot_rows,
    # the rows of each slot, its last repeated where it has fewer; staged: one more, the padding row) attend
    # over their own slot's past ([slots, L, kvh, hd]) and window only, not every slot's columns; the contexts
    # go back to packed order through row_back. The linears still run on the packed rows. One slot: [1, q].
    slot_axis: bool = False
    # The element type of the K/V the graph reads from the ring (past_*, stage_*): KV_DTYPES. "f16" halves the
    # ring's bytes; the graph widens each input to f32 at its entry (no CPU runtime here reads fp16 K/V in its
    # attention kernel: benchmarks/results/bench-depth-*); its new K/V outputs stay f32 (the ring rounds them as
    # it stores them) and its own attention reads them rounded (`as_stored`).
    kv_dtype: str = "f32"
    # K-quant linears (Q4_K/Q5_K/Q6_K rows of 256-multiples) as edge.kquant.MatMulKQuant on the file's own
    # bytes (graph_opt/kquant_op.py): a decode step reads each weight byte once, where MatMulNBits' one level
    # of f32 scales reads ~1.4x; the kernel rounds activations to int8 blocks, so precision fast only
    kquant: bool = False


def layer_kinds(cfg: ArchConfig) -> list[int]:
    """KV kind per layer: 0 = global, 1 = sliding window (only for families that have one)."""
    return [1 if cfg.is_local(i) else 0 for i in range(cfg.n_layer)]


class _Graph:
    """Tiny helper: unique names, constants, nodes; with `spill` (an open file), the large initializers' bytes
    are written to it as they come, so a build holds one layer's weights, not the model's."""

    def __init__(self, spill: BinaryIO | None = None, location: str = "") -> None:
        from onnx import helper, numpy_helper

        self.h, self.nh = helper, numpy_helper
        self.nodes: list = []
        self.inits: list = []
        self._n = 0
        self._consts: dict[tuple, str] = {}
        self._spill, self._location = spill, location
        self._spilled = 0  # inits[:_spilled] have been looked at

    def spill(self) -> None:
        """Move the bytes of the initializers added since the last call to the external file."""
        from onnx import TensorProto

        fh = self._spill
        if fh is None:
            return
        for i in range(self._spilled, len(self.inits)):
            tensor = self.inits[i]
            raw = tensor.raw_data
            if tensor.data_location == TensorProto.EXTERNAL or len(raw) < SPILL_MIN:
                continue
            offset = fh.tell()
            offset += (-offset) % 64  # aligned, so a runtime may map tensors in place
            fh.seek(offset)
            fh.write(raw)
            # NOTE: a new proto, not the old one with raw_data cleared: protobuf keeps a message's bytes in its
            # arena until the message itself is gone (measured: the 1.5b's build held every layer's weights)
            ref = TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
            ref.data_location = TensorProto.EXTERNAL
            for key, value in (
                ("location", self._location),
                ("offset", str(offset)),
                ("length", str(len(raw))),
            ):
                entry = ref.external_data.add()
                entry.key, entry.value = key, value
            self.inits[i] = ref
        self._spilled = len(self.inits)

    def name(self, base: str) -> str:
        self._n += 1
        return f"{base}_{self._n}"

    def op(
        self, op_type: str, inputs: Sequence[str], *, out: str | None = None, domain: str = "", **attrs
    ) -> str:
        y = out or self.name(op_type.lower())
        self.nodes.append(
            self.h.make_node(op_type, list(inputs), [y], name=self.name(op_type), domain=domain, **attrs)
        )
        return y

    def const(self, value: np.ndarray | float | int | Sequence[int], dtype: type = np.float32) -> str:
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            name = self.name("const")
            self.inits.append(self.nh.from_array(arr, name))
            self._consts[key] = name
        return self._consts[key]

    def init(self, name: str, arr: np.ndarray) -> str:
        self.inits.append(self.nh.from_array(np.ascontiguousarray(arr), name))
        return name


def _neox_perm(n_heads: int, head_dim: int) -> np.ndarray:
    """Row order turning adjacent-pair RoPE (x0,x1),(x2,x3).. into halves (x0,x2,..,x1,x3,..), per head."""
    within = np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])
    return (np.arange(n_heads)[:, None] * head_dim + within[None, :]).reshape(-1)


def w_n(w: BlockWeight | np.ndarray) -> int:
    return w.n if isinstance(w, BlockWeight) else int(w.shape[0])


@dataclass(frozen=True)
class _Proj:
    """One projection: rows of a GGUF tensor (all of it, a permutation, or its share of a fused tensor)."""

    tensor: str
    rows: np.ndarray | None  # None: every row, in file order
    label: str  # its name in the graph (the unfused tensor's name)


def _share(offset: int, n: int, perm: np.ndarray | None) -> np.ndarray:
    """Rows offset..offset+n of a fused tensor, in `perm` order when given."""
    return offset + (np.arange(n) if perm is None else perm)


def _blk(i: int, role: str) -> str:
    """The GGUF name of layer i's tensor for `role` (LAYER_TENSORS)."""
    return f"blk.{i}.{LAYER_TENSORS[role]}"


class _Builder:
    def __init__(
        self,
        gguf: GGUFFile,
        cfg: ArchConfig,
        opts: BuildOptions,
        spill: BinaryIO | None = None,
        location: str = "",
        on_step: Callable[[], None] | None = None,
    ) -> None:
        self.gguf, self.cfg, self.opts = gguf, cfg, opts
        self.g = _Graph(spill, location)
        self.on_step = on_step or (lambda: None)

    # -- weights -----------------------------------------------------------------------------------------
    def tensor(self, name: str) -> np.ndarray:
        if name not in self.gguf.tensors:
            raise ModelFormatError(
                f"{self.gguf.path.name}: tensor {name!r} is missing", hint="the file is incomplete"
            )
        return np.asarray(self.gguf.tensor_array(name), dtype=np.float32)

    def _weight(self, name: str, perm: np.ndarray | None) -> BlockWeight | np.ndarray:
        if name not in self.gguf.tensors:
            raise ModelFormatError(
                f"{self.gguf.path.name}: tensor {name!r} is missing", hint="the file is incomplete"
            )
        w = import_linear(self.gguf, name)
        return w if perm is None else take_rows(w, perm)

    def _bias(self, name: str, perm: np.ndarray | None) -> np.ndarray | None:
        bias_name = name.replace(".weight", ".bias")
        if bias_name not in self.gguf.tensors:
            return None
        b = self.tensor(bias_name)
        return b if perm is None else b[perm]

    def _emit(self, x: str, w: BlockWeight | np.ndarray, prefix: str, accuracy: int | None) -> str:
        """One linear through graph_opt's emitter: its nodes carry the linear's name for the passes."""
        y = self.g.name(prefix.replace(".weight", ""))
        level = self.opts.accuracy_level if accuracy is None else accuracy
        from edge.graph_opt.linear import linear_protos  # onnx_ir: only a build needs it

        nodes, inits = linear_protos(w, x, y, prefix, lowering=self.opts.lowering, accuracy_level=level)
        self.g.nodes += nodes
        self.g.inits += inits
        return y

    def _kquant_rows(self, name: str, rows: np.ndarray | None) -> tuple[int, np.ndarray] | None:
        """(GGML type, the rows as stored [n, row_bytes]) where the K-quant op reads the tensor, else None."""
        info = self.gguf.tensors.get(name)
        if not self.opts.kquant or info is None or len(info.shape) != 2:
            return None
        k, n = int(info.shape[0]), int(info.shape[1])
        if not kquant_op.takes(info.ggml_type, k):
            return None
        raw = self.gguf.tensor_bytes(name).reshape(n, kquant_op.row_bytes(info.ggml_type, k))
        return int(info.ggml_type), (raw if rows is None else raw[rows])

    def _emit_kquant(self, x: str, ggml_type: int, rows: np.ndarray, label: str) -> str:
        g = self.g
        k = rows.shape[1] // kquant_op.ROW_BYTES_PER_256[ggml_type] * 256
        w = g.init(g.name(label.replace(".weight", "") + ".kquant"), np.ascontiguousarray(rows))
        return g.op(
            kquant_op.OP_TYPE, [x, w], domain=kquant_op.DOMAIN, ggml_type=ggml_type, k=k, n=rows.shape[0]
        )

    def _bias_added(self, y: str, label: str, b: np.ndarray | None) -> str:
        return y if b is None else self.g.op("Add", [y, self.g.init(label.replace(".weight", ".bias"), b)])

    def linear(
        self, x: str, name: str, perm: np.ndarray | None = None, *, accuracy: int | None = None
    ) -> str:
        kq = self._kquant_rows(name, perm)
        if kq is not None:
            y = self._emit_kquant(x, *kq, name)
        else:
            y = self._emit(x, self._weight(name, perm), name, accuracy)
        return self._bias_added(y, name, self._bias(name, perm))

    def linears(self, x: str, projs: Sequence[_Proj]) -> list[str]:
        """Linears sharing one input, fused into one matmul when their weights have the same form (QKV,
        gate+up): per token one kernel and one block-sum instead of several."""
        kq = [self._kquant_rows(p.tensor, p.rows) for p in projs]
        biases = [self._bias(p.tensor, p.rows) for p in projs]
        if any(r is not None for r in kq):
            return self._kquant_linears(x, projs, kq, biases)
        decoded: dict[str, BlockWeight | np.ndarray] = {}  # a fused tensor is decoded once for its shares
        for p in projs:
            if p.tensor not in decoded:
                decoded[p.tensor] = self._weight(p.tensor, None)
        ws = [decoded[p.tensor] if p.rows is None else take_rows(decoded[p.tensor], p.rows) for p in projs]
        fused = stack_rows(ws)
        if fused is None:
            return [
                self._bias_added(self._emit(x, w, p.label, None), p.label, b)
                for p, w, b in zip(projs, ws, biases, strict=True)
            ]
        y = self._emit(x, fused, projs[0].label.replace(".weight", "") + "_fused", None)
        return self._split_fused(y, projs, biases, [w_n(w) for w in ws])

    def _kquant_linears(
        self,
        x: str,
        projs: Sequence[_Proj],
        kq: Sequence[tuple[int, np.ndarray] | None],
        biases: Sequence[np.ndarray | None],
    ) -> list[str]:
        """`linears` where K-quant rows are among them: the shares of one GGML type stacked into one op (the
        activations rounded once for them; Q4_K_M's Q4_K Q/K beside its Q6_K V: two ops), the rest as usual."""
        outs: dict[int, str] = {}
        by_type: dict[int | None, list[int]] = {}
        for i, r in enumerate(kq):
            by_type.setdefault(None if r is None else r[0], []).append(i)
        for t, idx in by_type.items():
            if t is None:
                for i in idx:
                    y = self._emit(x, self._proj_weight(projs[i]), projs[i].label, None)
                    outs[i] = self._bias_added(y, projs[i].label, biases[i])
                continue
            rows = [kq[i][1] for i in idx]  # type: ignore[index]
            label = projs[idx[0]].label
            y = self._emit_kquant(x, t, np.concatenate(rows), label if len(idx) == 1 else label + "_fused")
            if len(idx) == 1:
                outs[idx[0]] = self._bias_added(y, label, biases[idx[0]])
                continue
            parts = self._split_fused(
                y, [projs[i] for i in idx], [biases[i] for i in idx], [len(r) for r in rows]
            )
            outs.update(zip(idx, parts, strict=True))
        return [outs[i] for i in range(len(projs))]

    def _proj_weight(self, p: _Proj) -> BlockWeight | np.ndarray:
        w = self._weight(p.tensor, None)
        return w if p.rows is None else take_rows(w, p.rows)

    def _split_fused(
        self, y: str, projs: Sequence[_Proj], biases: Sequence[np.ndarray | None], sizes: Sequence[int]
    ) -> list[str]:
        """A fused linear's output (its biases added, zeros where a share has none) split back per share."""
        g = self.g
        label = projs[0].label
        if any(b is not None for b in biases):
            full = np.concatenate(
                [b if b is not None else np.zeros(n, np.float32) for b, n in zip(biases, sizes, strict=True)]
            )
            y = g.op("Add", [y, g.init(label.replace(".weight", "_fused.bias"), full)])
        outs = [g.name(p.label.replace(".weight", "")) for p in projs]
        g.nodes.append(
            g.h.make_node("Split", [y, g.const(list(sizes), np.int64)], outs, axis=-1, name=g.name("Split"))
        )
        return outs

    # -- blocks ------------------------------------------------------------------------------------------
    def rms_norm(self, x: str, weight_name: str) -> str:
        # NOTE: the exact op sequence of a PyTorch export (Pow, ReduceMean, Add, Sqrt, Div, Mul, Mul): ORT and
        # OpenVINO both recognize it and fuse it into one RMSNorm kernel.
        g = self.g
        ms = g.op("ReduceMean", [g.op("Pow", [x, g.const(2.0)]), g.const([-1], np.int64)], keepdims=1)
        inv = g.op("Div", [g.const(1.0), g.op("Sqrt", [g.op("Add", [ms, g.const(self.cfg.rms_eps)])])])
        return g.op("Mul", [g.init(weight_name, self.tensor(weight_name)), g.op("Mul", [x, inv])])

    def rope_factors(self) -> np.ndarray | None:
        """The per-pair frequency divisors llama.cpp applies to this file (Llama 3.x, LongRoPE), if any."""
        name = self.cfg.rope_factor_tensor(self.gguf.tensors, self.opts.long_rope)
        return None if name is None else self.tensor(name).astype(np.float64)

    def rope_tables(self, positions: str, base: float) -> dict[str, str]:
        """Per RoPE base, once per graph: full-width cos/sin [q, hd] for keys ([q, 1, hd]) and for queries
        with the attention scale folded in (one multiply fewer per layer). RoPE scaling (ggml_rope_ext without
        YaRN): angle p * freq_scale * base^(-2i/hd) / factor_i; cos and sin times attn_factor, which for
        q.k is attn_factor^2 on the query side alone."""
        g, hd, rs = self.g, self.cfg.head_dim, self.cfg.rope_scaling
        inv_freq64 = rs.freq_scale / base ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
        factors = self.rope_factors()
        if factors is not None:
            inv_freq64 = inv_freq64 / factors
        inv_freq = inv_freq64.astype(np.float32)
        pos = g.op("Cast", [positions], to=1)  # float32 [q]
        ang = g.op("Mul", [g.op("Unsqueeze", [pos, g.const([1], np.int64)]), g.const(inv_freq[None, :])])
        cos, sin = (g.op("Concat", [t, t], axis=-1) for t in (g.op("Cos", [ang]), g.op("Sin", [ang])))
        scale, axis1, axes12 = (
            g.const(self.cfg.attn_scale * rs.attn_factor**2),
            g.const([1], np.int64),
            g.const([1, 2], np.int64),
        )
        return {  # queries [1, q, kvh, grp, hd], keys [1, q, kvh, hd]: sequence on axis 1
            "cos_q": g.op("Unsqueeze", [g.op("Mul", [cos, scale]), axes12]),
            "sin_q": g.op("Unsqueeze", [g.op("Mul", [sin, scale]), axes12]),
            "cos_k": g.op("Unsqueeze", [cos, axis1]),
            "sin_k": g.op("Unsqueeze", [sin, axis1]),
        }

    def rope(self, x: str, cos: str, sin: str, *, out: str | None = None) -> str:
        """x * cos + rotate_half(x) * sin; rotate_half as a [hd, hd] signed permutation matmul (exact: one
        nonzero term per output), 4 kernels instead of 9."""
        g, hd = self.g, self.cfg.head_dim
        half = hd // 2
        rot = np.zeros((hd, hd), np.float32)
        rot[np.arange(half) + half, np.arange(half)] = -1.0  # out[:half] = -x[half:]
        rot[np.arange(half), np.arange(half) + half] = 1.0  # out[half:] = x[:half]
        rotated = g.op("MatMul", [x, g.const(rot)])
        return g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [rotated, sin])], out=out)

    def _per_slot(self, t: str) -> str:
        """Packed rows [1, q, ..] -> each slot's [slots, m, ..] (`slot_axis`: the input slot_rows)."""
        g = self.g
        return g.op("Squeeze", [g.op("Gather", [t, "slot_rows"], axis=1), g.const([0], np.int64)])

    def kv_in(self, name: str) -> str:
        """A K/V input as f32: itself, or (kv_dtype f16) its Cast, the graph's first read of it."""
        if self.opts.kv_dtype == "f32":
            return name
        from onnx import TensorProto

        return self.g.op("Cast", [name], to=TensorProto.FLOAT)

    def as_stored(self, t: str) -> str:
        """The step's new K or V as later steps will read it from the ring: itself, or (kv_dtype f16) rounded to
        fp16 and back. So a token's row attends over the same values whether its K/V were computed in this
        forward or read from the ring, and a k-token forward's rows equal k one-token forwards' (the batch
        invariance speculative decoding's greedy guarantee rests on), as llama.cpp stores a batch's K/V before
        it attends over them."""
        if self.opts.kv_dtype == "f32":
            return t
        from onnx import TensorProto

        g = self.g
        return g.op("Cast", [g.op("Cast", [t], to=TensorProto.FLOAT16)], to=TensorProto.FLOAT)

    def keys_t(self, t: str) -> str:
        """Slot-major K [1, n, kvh, hd] -> [1, kvh, 1, hd, n], ready to multiply grouped queries."""
        g = self.g
        return g.op("Unsqueeze", [g.op("Transpose", [t], perm=[0, 2, 3, 1]), g.const([2], np.int64)])

    def values_h(self, t: str) -> str:
        """Slot-major V [1, n, kvh, hd] -> [1, kvh, 1, n, hd]."""
        g = self.g
        return g.op("Unsqueeze", [g.op("Transpose", [t], perm=[0, 2, 1, 3]), g.const([2], np.int64)])

    def activation(self, x: str) -> str:
        g = self.g
        if self.cfg.traits.activation == "silu":
            return g.op("Mul", [x, g.op("Sigmoid", [x])])
        # GELU, tanh approximation (ggml_gelu)
        x3 = g.op("Mul", [g.op("Mul", [x, x]), x])
        inner = g.op(
            "Mul", [g.op("Add", [x, g.op("Mul", [x3, g.const(0.044715)])]), g.const(math.sqrt(2 / math.pi))]
        )
        return g.op(
            "Mul", [g.op("Mul", [x, g.const(0.5)]), g.op("Add", [g.op("Tanh", [inner]), g.const(1.0)])]
        )

    def layer(
        self, i: int, x: str, positions: str, ropes: dict[float, dict[str, str]], kinds: list[int]
    ) -> str:
        """One decoder layer: x + attention, then + MLP (llama.cpp's build_attn / build_ffn)."""
        base = self.cfg.rope_base_for(i)
        if base not in ropes:
            ropes[base] = self.rope_tables(positions, base)
        x = self.g.op("Add", [x, self.attention(i, x, ropes[base], kinds[i])])
        return self.g.op("Add", [x, self.mlp(i, x)])

    def qkv(self, i: int, x: str, rt: dict[str, str]) -> tuple[str, str, str]:
        """The layer's normed queries (RoPE'd, [1, kvh, grp, q, hd]; staged: one padding row more) and the new
        tokens' keys and values ([1, q, kvh, hd], graph outputs new_key_i / new_value_i; staged: scattered into
        the window, [1, w, kvh, hd])."""
        cfg, g, t = self.cfg, self.g, self.cfg.traits
        h, hd, kvh = cfg.n_head, cfg.head_dim, cfg.n_head_kv
        grp = h // kvh
        xn = self.rms_norm(x, _blk(i, "attn_norm"))
        perm_q = _neox_perm(h, hd) if t.rope_style == "norm" else None
        perm_k = _neox_perm(kvh, hd) if t.rope_style == "norm" else None
        if t.fused_qkv and _blk(i, "qkv") in self.gguf.tensors:  # [q; k; v] rows of one tensor
            qn, kn = h * hd, kvh * hd
            shares = [(0, qn, perm_q), (qn, kn, perm_k), (qn + kn, kn, None)]
            projs = [
                _Proj(_blk(i, "qkv"), _share(*s), _blk(i, r)) for s, r in zip(shares, "qkv", strict=True)
            ]
        else:
            projs = [
                _Proj(_blk(i, r), pm, _blk(i, r)) for r, pm in zip("qkv", (perm_q, perm_k, None), strict=True)
            ]
        q, k, v = self.linears(xn, projs)
        # NOTE: RoPE runs with the sequence on axis 1 for Q and K alike ([1, q, heads.., hd], as the projection
        # leaves them), the form fused rotary kernels take; Q is transposed for attention afterwards.
        q = g.op("Reshape", [q, g.const([1, -1, kvh, grp, hd], np.int64)])  # [1, q, kvh, grp, hd]
        k = g.op(
            "Reshape", [k, g.const([1, -1, kvh, hd], np.int64)]
        )  # [1, q, kvh, hd]: slot-major, as cached
        v = g.op("Reshape", [v, g.const([1, -1, kvh, hd], np.int64)], out=f"new_value_{i}")
        if t.qk_norm:
            q = self.rms_norm(q, _blk(i, "q_norm"))
            k = self.rms_norm(k, _blk(i, "k_norm"))
        q = self.rope(q, rt["cos_q"], rt["sin_q"])  # scaled
        k = self.rope(k, rt["cos_k"], rt["sin_k"], out=f"new_key_{i}")  # [1, q, kvh, hd]
        k, v = self.as_stored(k), self.as_stored(v)
        if self.opts.slot_axis:  # [slots, m, ..]: each slot's rows (staged: with the padding row, repeated)
            q, k, v = self._per_slot(q), self._per_slot(k), self._per_slot(v)
        qs = g.op("Transpose", [q], perm=[0, 2, 3, 1, 4])  # [1 (slots), kvh, grp, q (m), hd]
        if self.opts.slot_axis:
            if self.opts.staged:  # the repeated row writes what its original writes, where it writes it
                k = g.op("ScatterND", [self.kv_in(f"stage_key_{i}"), "stage_index", k])  # [slots, w, kvh, hd]
                v = g.op("ScatterND", [self.kv_in(f"stage_value_{i}"), "stage_index", v])
            return qs, k, v
        if self.opts.staged:  # see "Staged attention": scatter into the window, pad the queries by one row
            k = g.op("ScatterND", [self.kv_in(f"stage_key_{i}"), "stage_index", k])  # [1, w, kvh, hd]
            v = g.op("ScatterND", [self.kv_in(f"stage_value_{i}"), "stage_index", v])
            qs = g.op("Concat", [qs, g.const(np.zeros((1, kvh, grp, 1, hd), np.float32))], axis=3)
        return qs, k, v

    def attention(self, i: int, x: str, rt: dict[str, str], kind: int) -> str:
        """Layer i's attention over the bound past slots and the new tokens, through its output projection."""
        cfg, g = self.cfg, self.g
        qs, k, v = self.qkv(i, x, rt)
        # NOTE: attention is split into (past slots) and (new tokens) so the past is never concatenated
        # (copied) with the new K/V; the past is whatever prefix of the ring the caller binds.
        s_past = g.op("MatMul", [qs, self.keys_t(self.kv_in(f"past_key_{i}"))])  # [1, kvh, grp, q, L]
        s_new = g.op("MatMul", [qs, self.keys_t(k)])  # [1, kvh, grp, q, q] (staged: [.., q+1, w])
        scores = g.op("Concat", [s_past, s_new], axis=-1)
        scores = g.op("Add", [scores, g.op("Unsqueeze", [f"mask_{kind}", g.const([2], np.int64)])])
        probs = g.op("Softmax", [scores], axis=-1)
        p_past, p_new = g.name("p_past"), g.name("p_new")
        g.nodes.append(
            g.h.make_node("Split", [probs, f"split_{kind}"], [p_past, p_new], axis=-1, name=g.name("Split"))
        )
        ctx = g.op(
            "Add",
            [
                g.op("MatMul", [p_past, self.values_h(self.kv_in(f"past_value_{i}"))]),
                g.op("MatMul", [p_new, self.values_h(v)]),
            ],
        )
        hd_all = cfg.n_head * cfg.head_dim
        if self.opts.slot_axis:
            # [slots, kvh, grp, m, hd] -> [slots * m, h*hd] -> the packed rows' [1, q, h*hd]
            ctx = g.op(
                "Reshape", [g.op("Transpose", [ctx], perm=[0, 3, 1, 2, 4]), g.const([-1, hd_all], np.int64)]
            )
            ctx = g.op("Gather", [ctx, "row_back"], axis=0)  # row_back [1, q]: [1, q, h*hd]
            return self._output(i, ctx)
        if self.opts.staged:  # drop the padding row
            one = g.const([1], np.int64)
            ctx = g.op(
                "Slice", [ctx, g.const([0], np.int64), g.const([-1], np.int64), g.const([3], np.int64), one]
            )
        ctx = g.op(
            "Reshape", [g.op("Transpose", [ctx], perm=[0, 3, 1, 2, 4]), g.const([1, -1, hd_all], np.int64)]
        )
        return self._output(i, ctx)

    def _output(self, i: int, ctx: str) -> str:
        """The attention's output projection of the context [1, q, h*hd] (and its post-norm)."""
        attn = self.linear(ctx, _blk(i, "attn_output"))
        if self.cfg.traits.post_norms:
            attn = self.rms_norm(attn, _blk(i, "post_attention_norm"))
        return attn

    def mlp(self, i: int, x: str) -> str:
        """Layer i's gated MLP: down(act(gate(xn)) * up(xn)), xn the ffn-normed input."""
        cfg, g, t = self.cfg, self.g, self.cfg.traits
        xn = self.rms_norm(x, _blk(i, "ffn_norm"))
        if t.fused_gate_up:  # ffn_up holds [gate; up]
            ff = cfg.n_ff
            projs = [
                _Proj(_blk(i, "up"), _share(0, ff, None), _blk(i, "gate")),
                _Proj(_blk(i, "up"), _share(ff, ff, None), _blk(i, "up")),
            ]
        else:
            projs = [_Proj(_blk(i, "gate"), None, _blk(i, "gate")), _Proj(_blk(i, "up"), None, _blk(i, "up"))]
        gate, up = self.linears(xn, projs)
        mlp = self.linear(g.op("Mul", [self.activation(gate), up]), _blk(i, "down"))
        if t.post_norms:
            mlp = self.rms_norm(mlp, _blk(i, "post_ffw_norm"))
        return mlp

    def _attention_inputs(self, used_kinds: Sequence[int]) -> list:  # type: ignore[type-arg]
        """The masks (one per layer kind), the staged graph's stage_index, a slot_axis graph's row maps."""
        from onnx import TensorProto, helper

        F, I64 = TensorProto.FLOAT, TensorProto.INT64
        staged, slots = self.opts.staged, self.opts.slot_axis
        rows, cols = ("q1", "plus_w") if staged else ("q", "plus_q")
        b = "slots" if slots else 1
        inputs = []
        if slots:
            rows, cols = "m", ("plus_w" if staged else "plus_m")
            inputs += [
                helper.make_tensor_value_info("slot_rows", I64, ["slots", "m"]),
                helper.make_tensor_value_info("row_back", I64, [1, "q"]),
            ]
        inputs += [
            helper.make_tensor_value_info(f"mask_{k}", F, [b, 1, rows, f"past{k}_{cols}"]) for k in used_kinds
        ]
        if staged:
            inputs.append(helper.make_tensor_value_info("stage_index", I64, [b, "m" if slots else "q", 2]))
        return inputs

    def build(self):  # type: ignore[no-untyped-def]
        from onnx import TensorProto, helper

        cfg, g, opts = self.cfg, self.g, self.opts
        from edge.graph_opt.linear import resolve_lowering

        resolve_lowering(opts.lowering)  # an unknown one stops here, not at the first quantized linear
        kv_numpy_dtype(opts.kv_dtype)  # an unknown KV type stops here
        if cfg.rope_dim != cfg.head_dim:
            raise ModelFormatError(
                f"partial rotary embeddings ({cfg.rope_dim} of {cfg.head_dim}) are not supported"
            )
        last = cfg.n_layer if opts.last_layer is None else opts.last_layer
        if not 0 <= opts.first_layer < last <= cfg.n_layer:
            raise ValueError(f"layer range [{opts.first_layer}, {last}) is not within 0..{cfg.n_layer}")
        kinds = layer_kinds(cfg)
        F, I64 = TensorProto.FLOAT, TensorProto.INT64
        KV = TensorProto.FLOAT16 if opts.kv_dtype == "f16" else TensorProto.FLOAT
        kvh, hd = cfg.n_head_kv, cfg.head_dim
        inputs = [
            helper.make_tensor_value_info("hidden", F, [1, "q", cfg.n_embd]),
            helper.make_tensor_value_info("positions", I64, ["q"]),
        ]
        used_kinds = sorted({kinds[i] for i in range(opts.first_layer, last)})
        staged, slots = opts.staged, opts.slot_axis
        b = "slots" if slots else 1  # the attention's batch: one per slot (slot_axis), else the packed rows
        inputs += self._attention_inputs(used_kinds)
        outputs = []
        ropes: dict[float, dict[str, str]] = {}
        first_of = {k: next(i for i in range(opts.first_layer, last) if kinds[i] == k) for k in used_kinds}
        for k in used_kinds:  # [L_k, q or w] from the mask's shape, for splitting attention probabilities
            n_all = g.op("Shape", [f"mask_{k}"], start=3, end=4)
            if staged:  # the staging width w
                n_new = g.op("Shape", [f"stage_key_{first_of[k]}"], start=1, end=2)
            elif slots:  # each slot's rows
                n_new = g.op("Shape", ["slot_rows"], start=1, end=2)
            else:
                n_new = g.op("Shape", ["positions"])
            g.op("Concat", [g.op("Sub", [n_all, n_new]), n_new], axis=0, out=f"split_{k}")
        x = "hidden"
        for i in range(opts.first_layer, last):
            past = f"past{kinds[i]}"
            inputs += [
                helper.make_tensor_value_info(f"past_{n}_{i}", KV, [b, past, kvh, hd])
                for n in ("key", "value")
            ]
            if staged:
                inputs += [
                    helper.make_tensor_value_info(f"stage_{n}_{i}", KV, [b, "w", kvh, hd])
                    for n in ("key", "value")
                ]
            outputs += [
                helper.make_tensor_value_info(f"new_{n}_{i}", F, [1, "q", kvh, hd]) for n in ("key", "value")
            ]
            x = self.layer(i, x, "positions", ropes, kinds)
            g.spill()
            self.on_step()
        if opts.head:
            inputs.append(helper.make_tensor_value_info("logit_rows", I64, ["r"]))
            xn = self.rms_norm(x, GLOBAL_TENSORS["output_norm"])
            rows = g.op("Gather", [xn, "logit_rows"], axis=1)
            head = GLOBAL_TENSORS["embed" if cfg.tied_embeddings else "head"]
            g.op("Identity", [self.linear(rows, head, accuracy=opts.head_accuracy_level)], out="logits")
            outputs.insert(0, helper.make_tensor_value_info("logits", F, [1, "r", cfg.n_vocab]))
        else:
            g.op("Identity", [x], out="hidden_out")
            outputs.insert(0, helper.make_tensor_value_info("hidden_out", F, [1, "q", cfg.n_embd]))
        g.spill()
        if opts.head:
            self.on_step()
        graph = helper.make_graph(g.nodes, f"edge_{cfg.arch}", inputs, outputs, initializer=g.inits)
        opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)]
        if opts.kquant:
            opsets.append(helper.make_opsetid(kquant_op.DOMAIN, 1))
        model = helper.make_model(graph, opset_imports=opsets, producer_name="edge")
        model.ir_version = 10
        return model


def build_steps(cfg: ArchConfig, options: BuildOptions | None = None) -> int:
    """How many times `build_decoder` calls `on_step`: once per layer, once for the head."""
    opts = options or BuildOptions()
    last = cfg.n_layer if opts.last_layer is None else opts.last_layer
    return last - opts.first_layer + int(opts.head)


def build_decoder(  # type: ignore[no-untyped-def]
    gguf: GGUFFile,
    cfg: ArchConfig | None = None,
    options: BuildOptions | None = None,
    *,
    external: Path | None = None,
    on_step: Callable[[], None] | None = None,
):
    """The decoder (or a partition of it) as an onnx.ModelProto, weights imported from the GGUF blocks.

    `external`: the large initializers are written to this file as each layer is built and the proto refers to
    them by its name (save the proto beside it): the build then holds one layer's weights, not the model's.
    `on_step()` after each layer and after the head (`build_steps` of them), for a build's progress."""
    cfg = cfg or ArchConfig.from_gguf(gguf.metadata, set(gguf.tensors))
    opts = options or BuildOptions()
    if external is None:
        return _Builder(gguf, cfg, opts, on_step=on_step).build()
    with open(external, "wb") as fh:
        return _Builder(gguf, cfg, opts, fh, external.name, on_step).build()


class Embedder:
    """Token ids -> the graph's `hidden` input: rows of token_embd decoded from their own blocks (the embed
    partition runs in numpy; a 262k-row table is never dequantized whole)."""

    def __init__(self, gguf: GGUFFile, cfg: ArchConfig) -> None:
        self.gguf = gguf
        self.scale = np.float32(math.sqrt(cfg.n_embd)) if cfg.traits.embed_scale else None

    def __call__(self, ids: Sequence[int]) -> np.ndarray:
        rows = dequantize_rows(self.gguf, GLOBAL_TENSORS["embed"], np.asarray(ids, dtype=np.int64))
        if self.scale is not None:
            rows = rows * self.scale
        return rows[None].astype(np.float32, copy=False)  # [1, q, d]
