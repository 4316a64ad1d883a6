"""Weight quantization: INT8 per-channel, INT4 per-group, and the mixed-precision policy that picks them.

Quantizers (numpy, weight-only; activations stay float):
- `quantize_int4(w, group, symmetric)`: per group of 32 / 64 / 128 inputs. Asymmetric: code * scale + a
  float offset per group (GGUF Q4_1's form; an integer zero point would shift every weight of the group by
  up to half a step, an error that is the same for the whole group and so adds up along the dot product
  instead of averaging out), or symmetric (zero point 8, no offset: what NPUs want). Per group, scale and
  offset are searched over a few candidate grids and refitted by least squares (`_fit_blocks`); a group
  already on a 4-bit grid (re-quantizing Q4_1 / Q4_K blocks) comes back exactly.
- `quantize_int8(w, symmetric)`: per output channel (one block spanning the row), the same fit.

The policy (`QuantSpec`, `plan_precision`), for --quant int4: the lm_head at INT8, and the most sensitive
decoder layers at INT8, the rest INT4. Sensitivity is measured, not assumed: each layer alone is quantized to
INT4 and the KL divergence of the model's next-token distribution from the unquantized one is measured on
calibration inputs (`measure_sensitivity`, ONNX Runtime, exact fp32). The embeddings are not in the graph (the
embed partition runs in numpy); the caller stores them at INT8 (GGUF Q8_0 rows) under the same policy.

Re-quantizing a GGUF source (Q4_1, K-quants..) is on request only (--quant int4|int8): its blocks are decoded
to float and quantized again; --quant keep leaves every imported block as it is.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from edge.errors import ModelFormatError
from edge.graph_opt.linear import BlockWeight, emit_linear, linear_names, linears_in
from edge.graph_opt.lower import lowering_for
from edge.graph_opt.manager import PassContext, graph_pass

__all__ = [
    "QuantSpec",
    "layer_of",
    "measure_sensitivity",
    "plan_precision",
    "quantize",
    "quantize_int4",
    "quantize_int8",
    "quantize_weight",
]

_F32 = np.float32
_ROWS = 2048  # rows quantized at a time: bounds the search's temporaries (candidates x rows x k floats)


@dataclass(frozen=True)
class QuantSpec:
    mode: str = "keep"  # keep | int8 | int4
    group: int = 32  # INT4 group size: 32 | 64 | 128
    symmetric: bool = False  # NPUs want symmetric (no zero points); asymmetric is more accurate elsewhere
    head_int8: bool = True  # with int4: the lm_head at INT8 per-channel
    sensitive_layers: float = 0.1  # with int4: this share of decoder layers (the most sensitive) at INT8
    # with int4, instead of a share: as many of the most sensitive layers at INT8 as it takes for the summed
    # measured KL of the INT4 ones to fit this budget (nats)
    kl_budget: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("keep", "int8", "int4"):
            raise ValueError(f"--quant must be keep, int8 or int4, not {self.mode!r}")
        if self.group not in (32, 64, 128):
            raise ValueError(f"the INT4 group size must be 32, 64 or 128, not {self.group}")
        if not 0 <= self.sensitive_layers <= 1:
            raise ValueError("sensitive_layers is a share of layers in [0, 1]")
        if self.kl_budget is not None and self.kl_budget < 0:
            raise ValueError("the KL budget must be >= 0")

    def to_dict(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "group": self.group,
            "symmetric": self.symmetric,
            "head_int8": self.head_int8,
            "sensitive_layers": self.sensitive_layers,
            "kl_budget": self.kl_budget,
        }


# ---------------------------------------------------------------------------------------------------------
# Quantizers


def _fit_blocks(w: np.ndarray, levels: int, symmetric: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """w [r, nb, bs] -> codes uint8 [r, nb, bs], scales [r, nb], offsets [r, nb] with w ~ code * scale + offset.

    Symmetric: offset = -mid * scale (codes centred on mid = 2^(bits-1)). Asymmetric: a float offset (the
    block's minimum, as GGUF's Q4_1 / Q4_K store it), so no zero-point rounding shifts the whole block.
    Candidates per block: the min/max grid, that range shrunk (clipping outliers), and at 4 bits grids whose
    range spans 12..14 steps (a block already on such a grid, e.g. a Q4_K sub-block whose codes span 12, is
    recovered exactly); each is refitted by least squares (scale and offset jointly for asymmetric,
    twice: refit, re-round, refit) and the one with the least squared error kept."""
    wmin, wmax = w.min(-1), w.max(-1)
    mid = (levels + 1) // 2
    cands: list[tuple[np.ndarray, np.ndarray]] = []
    if symmetric:
        amax = np.where(-wmin > wmax, wmin, wmax)  # the signed extreme maps to -mid (the whole [-8, 7] range)
        for shrink in (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 1.05):
            s = (amax * shrink / -mid).astype(_F32)
            cands.append((s, -mid * s))
    else:
        span = wmax - wmin
        # the whole range on `steps` of the grid (4-bit: also 12..14 steps, recovering coarser grids)
        for steps in range(levels, levels - 4, -1) if levels < 16 else (levels,):
            cands.append(((span / steps).astype(_F32), wmin))
        for shrink in (0.95, 0.9, 0.85, 0.8):  # the range narrowed about its centre
            s = (span * shrink / levels).astype(_F32)
            cands.append((s, (wmin + span * (1 - shrink) / 2).astype(_F32)))
    best_err = np.full(w.shape[:2], np.inf)
    best = (np.zeros(w.shape, np.uint8), np.zeros(w.shape[:2], _F32), np.zeros(w.shape[:2], _F32))
    for s0, m0 in cands:
        s, m = s0, m0
        for _ in range(1 if symmetric else 2):
            safe = np.where(s == 0, 1, s)[..., None]
            c = np.clip(np.round((w - m[..., None]) / safe), 0, levels)
            s, m = _refit(w, c, s, m, mid if symmetric else None)
        err = ((c * s[..., None] + m[..., None] - w) ** 2).sum(-1)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best = (
            np.where(better[..., None], c, best[0]).astype(np.uint8),
            np.where(better, s, best[1]).astype(_F32),
            np.where(better, m, best[2]).astype(_F32),
        )
    return best


def _refit(
    w: np.ndarray, c: np.ndarray, s: np.ndarray, m: np.ndarray, mid: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares scale (and, without a fixed zero point `mid`, offset) for fixed codes c."""
    if mid is not None:
        d = c - mid
        den = (d * d).sum(-1)
        s = np.where(den > 0, (w * d).sum(-1) / np.where(den > 0, den, 1), s).astype(_F32)
        return s, (-mid * s).astype(_F32)
    n = w.shape[-1]
    sc, scc, sw, scw = c.sum(-1), (c * c).sum(-1), w.sum(-1), (c * w).sum(-1)
    det = n * scc - sc * sc
    ok = det > 0
    s_fit = np.where(ok, (n * scw - sc * sw) / np.where(ok, det, 1), s)
    s_fit = np.where(s_fit > 0, s_fit, s)  # a degenerate fit keeps the candidate's scale
    return s_fit.astype(_F32), ((sw - s_fit * sc) / n).astype(_F32)


def _quantize_rows(w: np.ndarray, bits: int, block: int, symmetric: bool) -> BlockWeight:
    n, k = w.shape
    nb = -(-k // block)
    pad = nb * block - k  # a last partial block is padded with zeros (MatMulNBits' and DQ's rule)
    codes = np.empty((n, k), np.uint8)
    scales = np.empty((n, nb), _F32)
    offsets = np.empty((n, nb), _F32)
    for start in range(0, n, _ROWS):
        rows = w[start : start + _ROWS].astype(_F32)
        if pad:
            rows = np.pad(rows, ((0, 0), (0, pad)))
        c, s, m = _fit_blocks(rows.reshape(-1, nb, block), (1 << bits) - 1, symmetric)
        codes[start : start + _ROWS] = c.reshape(-1, nb * block)[:, :k]
        scales[start : start + _ROWS] = s
        offsets[start : start + _ROWS] = m
    return _block_weight(bits, block, k, n, codes, scales, offsets, symmetric)


def _block_weight(
    bits: int,
    block: int,
    k: int,
    n: int,
    codes: np.ndarray,
    scales: np.ndarray,
    offsets: np.ndarray,
    symmetric: bool,
) -> BlockWeight:
    """code * scale + offset as a BlockWeight: the default zero point 2^(bits-1) and, when asymmetric, the
    offset as the block bias (the form GGUF's Q4_1 imports to; ORT's fast path runs it, OpenVINO too)."""
    if symmetric:
        return BlockWeight(bits, block, k, n, codes, scales, None)
    bias = (offsets + _F32(1 << (bits - 1)) * scales).astype(_F32)
    return BlockWeight(bits, block, k, n, codes, scales, None, bias)


def quantize_int4(
    w: np.ndarray, group: int = 32, *, symmetric: bool = False, hessian: np.ndarray | None = None
) -> BlockWeight:
    """W [n, k] float -> INT4 per group of `group` inputs along k; with the input's Hessian (X^T X over
    calibration tokens), GPTQ: each column's rounding error is compensated on the columns not yet quantized."""
    if hessian is not None:
        return gptq(w, hessian, 4, group, symmetric)
    return _quantize_rows(w, 4, group, symmetric)


def gptq(
    w: np.ndarray,
    hessian: np.ndarray,
    bits: int,
    group: int,
    symmetric: bool,
    *,
    damp: float = 0.1,
    block: int = 128,
) -> BlockWeight:
    """GPTQ (Frantar et al. 2022) with per-group scales and offsets fitted as `_fit_blocks` does, at the
    start of each group on the error-compensated weights. hessian: X^T X [k, k] of the layer's inputs.

    damp: added to H's diagonal as a share of its mean. NOTE: the paper's 0.01 assumes far more calibration
    tokens than inputs; edge calibrates on ~500 tokens, fewer than the 576..4864 inputs of many linears, so H
    is rank-deficient and 0.01 fits the calibration text too closely. Measured on F32 smollm2 (rotated),
    every layer INT4, KL to F32 on the eval text: damp 0.01 0.107, 0.1 0.081, 0.3 0.082, 1.0 0.090."""
    n, k = w.shape
    nb = -(-k // group)
    W = np.zeros((n, nb * group), np.float64)
    W[:, :k] = w
    H = np.zeros((nb * group, nb * group), np.float64)
    H[:k, :k] = hessian
    dead = np.diag(H) == 0  # inputs never active (and the padding): no information, quantize as is
    H[dead, dead] = 1.0
    W[:, dead] = 0.0 if k == nb * group else W[:, dead]
    H += damp * float(np.mean(np.diag(H))) * np.eye(H.shape[0])
    try:
        U = np.linalg.cholesky(np.linalg.inv(H)).T  # upper Cholesky factor of H^-1
    except np.linalg.LinAlgError:
        return _quantize_rows(w, bits, group, symmetric)
    levels = (1 << bits) - 1
    codes = np.zeros((n, nb * group), np.uint8)
    scales = np.zeros((n, nb), _F32)
    offsets = np.zeros((n, nb), _F32)
    block = max(group, block - block % group)
    for i1 in range(0, nb * group, block):
        i2 = min(i1 + block, nb * group)
        W1 = W[:, i1:i2].copy()
        err1 = np.zeros_like(W1)
        U1 = U[i1:i2, i1:i2]
        s = m = None
        for i in range(i2 - i1):
            col = i1 + i
            if col % group == 0:
                _c, s_g, m_g = _fit_blocks(W1[:, None, i : i + group].astype(_F32), levels, symmetric)
                g = col // group
                scales[:, g], offsets[:, g] = s_g[:, 0], m_g[:, 0]
                s = np.where(s_g[:, 0] == 0, 1, s_g[:, 0]).astype(np.float64)
                m = m_g[:, 0].astype(np.float64)
            x = W1[:, i]
            q = np.clip(np.round((x - m) / s), 0, levels)
            codes[:, col] = q
            e = (x - (q * scales[:, col // group] + m)) / U1[i, i]
            W1[:, i:] -= np.outer(e, U1[i, i:])
            err1[:, i] = e
        W[:, i2:] -= err1 @ U[i1:i2, i2:]
    return _block_weight(bits, group, k, n, codes[:, :k], scales, offsets, symmetric)


def quantize_int8(w: np.ndarray, *, symmetric: bool = False) -> BlockWeight:
    """W [n, k] float -> INT8 per output channel (one scale, and zero point, per row)."""
    return _quantize_rows(w, 8, w.shape[1], symmetric)


def quantize_weight(
    w: np.ndarray, precision: str, spec: QuantSpec, hessian: np.ndarray | None = None
) -> BlockWeight:
    if precision == "int8":
        return quantize_int8(w, symmetric=spec.symmetric)
    return quantize_int4(w, spec.group, symmetric=spec.symmetric, hessian=hessian)


# ---------------------------------------------------------------------------------------------------------
# Policy

_LAYER = re.compile(r"(?:^|\.)blk\.(\d+)\.")
Feeds = Mapping[str, np.ndarray]


def layer_of(name: str) -> int | None:
    """Decoder layer index of a weight name ('blk.<i>.'), None for the head and other weights."""
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def _is_head(name: str) -> bool:
    return name.startswith(("output.", "token_embd.")) or name in ("output", "token_embd")


def plan_precision(
    names: list[str], spec: QuantSpec, sensitivity: Mapping[int, float] | None = None
) -> dict[str, str]:
    """Precision per linear name: 'int8' | 'int4' | 'keep'. With int4: the head at INT8 (head_int8), and the
    ceil(sensitive_layers * n_layers) decoder layers of highest measured sensitivity at INT8 (with kl_budget:
    as many as it takes for the summed sensitivity of the INT4 layers to fit it)."""
    if spec.mode == "keep":
        return dict.fromkeys(names, "keep")
    if spec.mode == "int8":
        return dict.fromkeys(names, "int8")
    layers = sorted({i for n in names if (i := layer_of(n)) is not None})
    sens = sensitivity or {}
    ranked = sorted(layers, key=lambda i: (-sens.get(i, 0.0), i))
    if not sens:
        n_int8 = 0
    elif spec.kl_budget is not None:
        # NOTE: per-layer KLs add up closely (smollm2: their sum predicts the whole model's within ~10%)
        left = sum(sens.get(i, 0.0) for i in layers)
        n_int8 = 0
        while n_int8 < len(ranked) and left > spec.kl_budget:
            left -= sens.get(ranked[n_int8], 0.0)
            n_int8 += 1
    else:
        n_int8 = math.ceil(spec.sensitive_layers * len(layers))
    int8_layers = set(ranked[:n_int8])
    plan = {}
    for n in names:
        layer = layer_of(n)
        if layer is None:
            plan[n] = "int8" if (spec.head_int8 and _is_head(n)) else "int4"
        else:
            plan[n] = "int8" if layer in int8_layers else "int4"
    return plan


@dataclass
class QuantReport:
    """The quantization decided for a model: precision per linear, the measured sensitivity, and the
    quantized weights (applied by the quantize pass to the whole graph or to each of its partitions)."""

    spec: QuantSpec
    precision: dict[str, str] = field(default_factory=dict)
    sensitivity: dict[int, float] = field(default_factory=dict)
    weights: dict[str, BlockWeight] = field(default_factory=dict, repr=False)
    method: str = "rtn"  # rtn | gptq (INT4 weights)
    calibration_tokens: int = 0

    def to_dict(self) -> dict[str, object]:
        counts: dict[str, int] = {}
        for p in self.precision.values():
            counts[p] = counts.get(p, 0) + 1
        int8_layers = sorted(
            {i for n, p in self.precision.items() if p == "int8" and (i := layer_of(n)) is not None}
        )
        return {
            **self.spec.to_dict(),
            "method": self.method,
            "calibration_tokens": self.calibration_tokens,
            "linears": dict(sorted(counts.items())),
            "int8_layers": int8_layers,
            "sensitivity_kl": {str(k): round(v, 6) for k, v in sorted(self.sensitivity.items())},
        }


def _session(model: ir.Model, extra_outputs: Sequence[str] = ()):  # type: ignore[no-untyped-def]
    """An exact, single-threaded (deterministic) ORT session on the model, optionally exposing values."""
    import onnx
    import onnxruntime as ort

    proto = ir.serde.serialize_model(model)
    for name in extra_outputs:
        proto.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1  # deterministic: equal inputs give an equal plan (byte-equal artifacts)
    so.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _run(sess, feeds: Feeds, outputs: Sequence[str]) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    names = {i.name for i in sess.get_inputs()}
    return sess.run(list(outputs), {k: v for k, v in feeds.items() if k in names})


def collect_hessians(model: ir.Model, calibration: Sequence[Feeds]) -> dict[str, np.ndarray]:
    """Per linear name, X^T X (float64 [k, k]) of its input over every calibration step; linears reading the
    same input share one array."""
    linears = linears_in(model)
    by_input: dict[str, list[str]] = {}
    for lin in linears:
        if lin.x.name is None:
            continue
        by_input.setdefault(lin.x.name, []).append(lin.name)
    sess = _session(model, list(by_input))
    sums: dict[str, np.ndarray] = {}
    for feeds in calibration:
        for name, x in zip(by_input, _run(sess, feeds, list(by_input)), strict=True):
            x2 = x.reshape(-1, x.shape[-1]).astype(np.float64)
            sums[name] = sums.get(name, 0) + x2.T @ x2
    return {lin: sums[x] for x, lins in by_input.items() if x in sums for lin in lins}


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def measure_sensitivity(
    model: ir.Model,
    spec: QuantSpec,
    feeds: Feeds,
    *,
    int4: Mapping[str, BlockWeight] | None = None,
    output: str = "logits",
    progress: Callable[[int, int], None] | None = None,
) -> dict[int, float]:
    """Per decoder layer: mean KL(unquantized || this layer alone at INT4) of the softmax of `output` over the
    calibration feeds (ONNX Runtime, fp32-exact, one thread). int4: the INT4 weights to try (default RTN)."""
    ref = _log_softmax(_run(_session(model), feeds, [output])[0])
    linears = linears_in(model)
    layers = sorted({i for lin in linears if (i := layer_of(lin.name)) is not None})
    out: dict[int, float] = {}
    for j, layer in enumerate(layers):
        trial = ir.serde.deserialize_model(ir.serde.serialize_model(model))
        for lin in linears_in(trial):
            if layer_of(lin.name) == layer:
                w = (int4 or {}).get(lin.name) or quantize_int4(
                    lin.float_weight(), spec.group, symmetric=spec.symmetric
                )
                emit_linear(trial, lin, w, lowering="nbits", accuracy_level=0)
        test = _log_softmax(_run(_session(trial), feeds, [output])[0])
        out[layer] = float((np.exp(ref) * (ref - test)).sum(-1).mean())
        if progress is not None:
            progress(j + 1, len(layers))
    return out


def plan_quantization(
    model: ir.Model,
    spec: QuantSpec,
    calibration: Sequence[Feeds] | None = None,
    *,
    gptq_int4: bool = True,
    log: Callable[[str], None] | None = None,
) -> QuantReport:
    """Decide and compute every linear's quantized weight for `spec` on the whole model: INT4 weights by GPTQ
    over calibration steps 1.. (none given: round-to-nearest with a scale search), each layer's sensitivity at
    INT4 measured on step 0 (held out), the precision plan, INT8 per-channel where planned."""
    say = log or (lambda _m: None)
    linears = linears_in(model)
    names = [lin.name for lin in linears]
    report = QuantReport(spec)
    if spec.mode == "keep":
        report.precision = dict.fromkeys(names, "keep")
        return report
    if not linears:  # never report a quantization that did nothing
        raise ModelFormatError(
            f"--quant {spec.mode}: the graph has no linear layers tagged by edge's emitter",
            hint="quantize graphs built by edge's builder (edge convert on a GGUF)",
        )
    int4: dict[str, BlockWeight] = {}
    if spec.mode == "int4":
        hessians: dict[str, np.ndarray] = {}
        # NOTE: calibration step 0 is held out of GPTQ's statistics and ranks the layers: measured on the data
        # GPTQ fitted, every layer looks several times less sensitive than it is on new text
        fit = list(calibration[1:]) if calibration and len(calibration) > 1 else list(calibration or [])
        if fit and gptq_int4:
            say(f"collecting input statistics of {len(linears)} linears over {len(fit)} calibration steps")
            hessians = collect_hessians(model, fit)
            report.method = "gptq"
            report.calibration_tokens = sum(int(f["hidden"].shape[1]) for f in fit)
        say("quantizing to INT4" + (" (GPTQ)" if hessians else ""))
        for lin in linears:
            if spec.head_int8 and layer_of(lin.name) is None and _is_head(lin.name):
                continue
            int4[lin.name] = quantize_int4(
                lin.float_weight(), spec.group, symmetric=spec.symmetric, hessian=hessians.get(lin.name)
            )
        if calibration and (spec.sensitive_layers > 0 or spec.kl_budget is not None):
            say("measuring each layer's sensitivity to INT4 (KL of the next-token distribution)")
            report.sensitivity = measure_sensitivity(model, spec, calibration[0], int4=int4)
    report.precision = plan_precision(names, spec, report.sensitivity)
    for lin in linears:
        p = report.precision[lin.name]
        if p == "int4":
            report.weights[lin.name] = int4.get(lin.name) or quantize_int4(
                lin.float_weight(), spec.group, symmetric=spec.symmetric
            )
        elif p == "int8":
            report.weights[lin.name] = quantize_int8(lin.float_weight(), symmetric=spec.symmetric)
    return report


# ---------------------------------------------------------------------------------------------------------
# The pass


@graph_pass("quantize")
def quantize(model: ir.Model, ctx: PassContext) -> int:
    """Every linear (whatever its form) -> INT8
    per-channel / INT4 per-group weights, by the QuantReport in ctx.options['quant_report'] when it holds
    weights (decided on the whole model), else planned here from ctx.options['quant'] (a QuantSpec) and
    ctx.options['calibration'] (a list of graph feeds); mode 'keep' changes nothing."""
    report: QuantReport | None = ctx.options.get("quant_report")
    spec: QuantSpec = ctx.options.get("quant") or (report.spec if report else QuantSpec())
    if spec.mode == "keep":
        if report is not None:
            report.precision = dict.fromkeys(linear_names(model), "keep")
        return 0
    if report is None or not report.weights:
        planned = plan_quantization(model, spec, ctx.options.get("calibration"))
        if report is None:
            report = planned
        else:
            report.__dict__.update(planned.__dict__)
    lowering = lowering_for(ctx.target)
    n = 0
    for lin in linears_in(model):
        w = report.weights.get(lin.name)
        if w is None:
            continue
        emit_linear(model, lin, w, lowering=lowering)
        n += 1
    return n
