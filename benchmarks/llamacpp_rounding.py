"""Can an engine match llama.cpp by copying its roundings? A numpy forward with llama.cpp's roundings, against
llama.cpp's logits.

    python benchmarks/llamacpp_rounding.py --tiny Q8_0,Q4_0,Q5_0,Q4_1     # 2-layer random models
    python benchmarks/llamacpp_rounding.py --model smollm2-135m --tokens 512

llama.cpp's CPU matmuls quantize the activations per row to the weight type's "vec_dot" type: q8_0 (blocks
of 32, an fp16 scale, round half to even) for Q4_0 / Q5_0 / Q8_0; q8_1 (the same plus an fp16 block sum
that multiplies the weight block's min) for Q4_1 / Q5_1; q8_K (blocks of 256, an fp32 scale) for the
K-quants; f16 for F16. Its KV cache is f16, and without flash attention Q and the softmax probabilities are
rounded to f16 for their matmuls with K and V. tests/numpy_reference.py's float64 forward runs with exactly
those roundings hooked in ("llama"), or none ("exact"). On tiny models it prints the logit differences to
llama.cpp (median and largest); on a catalog model, KL and top-1 agreement over a text.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tests.numpy_reference as R  # noqa: E402
from edge.data import read_text  # noqa: E402
from edge.devices.registry import DecoderOptions, open_decoder  # noqa: E402
from edge.evaluate import text_ids  # noqa: E402
from edge.metrics import kl_divergence  # noqa: E402
from edge.models.gguf_file import open_gguf  # noqa: E402
from edge.models.resolve import resolve_model  # noqa: E402
from edge.models.tokenizer import load_tokenizer  # noqa: E402
from tests.tiny_models import TinySpec, write_tiny_model  # noqa: E402

F32 = np.float32
VEC_DOT = {"Q4_0": "q8_0", "Q5_0": "q8_0", "Q8_0": "q8_0", "Q4_1": "q8_1", "Q5_1": "q8_1", "F16": "f16"}
VEC_DOT |= dict.fromkeys(("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"), "q8_K")
MIN_OFFSET = {"Q4_1": 20, "Q5_1": 24}  # block bytes of the q8_1 types; the fp16 min sits at bytes 2..3


def _blocks(x: np.ndarray, size: int) -> np.ndarray:
    return x.astype(F32).reshape(x.shape[0], -1, size)


def q8(x: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray | None]:
    """x [n, k] as llama.cpp's activation blocks see it, and (q8_1) the fp16 block sums' rounding error."""
    if kind == "f16":
        return x.astype(np.float16).astype(np.float64), None
    if kind == "q8_K":  # quantize_row_q8_K: iscale = -127 / (the value of largest magnitude), d = 1 / iscale
        b = _blocks(x, 256)
        top = np.take_along_axis(b, np.abs(b).argmax(-1)[..., None], -1)
        with np.errstate(divide="ignore"):
            iscale = np.where(top != 0, F32(-127) / top, F32(0)).astype(F32)
            d = np.where(iscale != 0, F32(1) / iscale, F32(0)).astype(F32)
        q = np.minimum(127, np.rint(iscale * b))
        return (q * d).reshape(x.shape).astype(np.float64), None
    b = _blocks(x, 32)  # quantize_row_q8_0 / q8_1: d = amax / 127, codes round(x * 127 / amax)
    amax = np.abs(b).max(-1, keepdims=True)
    d = (amax / F32(127)).astype(F32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, F32(127) / amax, F32(0)).astype(F32)
    q = np.rint(b * inv)
    d16 = d.astype(np.float16).astype(F32)
    xq = (q * d16).reshape(x.shape).astype(np.float64)
    if kind != "q8_1":
        return xq, None
    sums = q.sum(-1)  # the block's fp16 sum s = fp16(d * sum(q)) multiplies the weight block's min
    s16 = (d[..., 0] * sums).astype(F32).astype(np.float16).astype(np.float64)
    return xq, s16 - d16[..., 0].astype(np.float64) * sums


def block_mins(path: Path) -> dict[str, np.ndarray]:
    """The fp16 min of every block of the q8_1-dotted tensors, [n_out, k / 32]."""
    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        size = MIN_OFFSET.get(t.tensor_type.name)
        if size is not None:
            raw = np.asarray(t.data).reshape(-1).view(np.uint8).reshape(int(t.shape[1]), -1, size)
            out[t.name] = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    return out


def llama_matmul(m: R.RefModel, path: Path) -> Callable[[np.ndarray, str], np.ndarray]:
    """x @ W^T as llama.cpp's CPU matmul rounds it: x quantized to the weight type's vec_dot type first."""
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    mins = block_mins(path)

    def matmul(x: np.ndarray, name: str) -> np.ndarray:
        key = name + ".weight"
        corr = None
        if types[key] in VEC_DOT:
            x, corr = q8(x, VEC_DOT[types[key]])
        y = x @ m.weights[key].T
        return y if corr is None else y + corr @ mins[key].T

    return matmul


def f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float64)


def llama_logits(path: Path, ids: list[int], chunk: int = 128) -> np.ndarray:
    dec = open_decoder("llamacpp", path, "cpu", DecoderOptions(n_ctx=max(256, len(ids))))
    try:
        return np.concatenate([dec.forward(ids[i : i + chunk]) for i in range(0, len(ids), chunk)])
    finally:
        dec.close()


def compare(path: Path, ids: list[int]) -> dict[str, np.ndarray]:
    model = R.load(path)
    return {
        "exact": R.forward(model, ids),
        "llama": R.forward(model, ids, matmul=llama_matmul(model, path), attn_round=f16),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", default=None, help="comma-separated GGUF types of 2-layer random llama models")
    ap.add_argument("--model", default=None, help="a catalog model or GGUF path")
    ap.add_argument("--tokens", type=int, default=512)
    args = ap.parse_args()
    if args.tiny:
        spec = TinySpec(n_embd=256, n_ff=512, head_dim=64, n_vocab=400)
        ids = [int(i) for i in np.random.default_rng(1).integers(3, 400, 40)]
        with tempfile.TemporaryDirectory() as tmp:
            for name in args.tiny.split(","):
                qtype = getattr(gguf.GGMLQuantizationType, name)
                path = write_tiny_model(Path(tmp) / f"{name}.gguf", replace(spec, weight_type=qtype))
                ref = llama_logits(path, ids).astype(np.float64)
                for mode, logits in compare(path, ids).items():
                    d = np.abs(logits - ref)
                    print(
                        f"{name:5} {mode:5} |dlogit| median {np.median(d):.2e}  max {d.max():.2e}", flush=True
                    )
    if args.model:
        path = resolve_model(args.model)
        ids = text_ids(load_tokenizer(open_gguf(path).metadata), read_text(None), args.tokens)
        ref = llama_logits(path, ids)
        for mode, logits in compare(path, ids).items():
            kl = kl_divergence(ref, logits).mean()
            top1 = (ref.argmax(-1) == logits.argmax(-1)).mean()
            print(f"{args.model} {mode:5} vs llama.cpp: KL {kl:.5f}  top-1 {100 * top1:.1f}%", flush=True)


if __name__ == "__main__":
    main()
