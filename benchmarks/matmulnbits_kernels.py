"""ORT MatMulNBits at accuracy level 4 (int8 activations) by weight bits and block (`--forms`, default 4-bit
block 32 (Q4_K, Q4_0), 8-bit block 32 (Q5_0, Q8_0) and 8-bit block 16 (Q6_K); 2/32 times the 2-bit kernel),
at prefill row counts, on one thread.

    python benchmarks/matmulnbits_kernels.py --rows 128,256,512 --shapes 1024x640,2048x640,640x4096,4864x896

Each shape is K x N (gemma3-270m: attn_output 1024x640, ffn_down 2048x640, gate+up 640x4096; the 0.5b's ffn_down
4864x896). Random codes and scales (the kernels' speed does not depend on the values). Reports the least
process CPU time over the runs (one intra-op thread, so CPU time is the kernel's work even on a shared machine)
and GFLOP/s (2 M K N per run).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def linear_session(k: int, n: int, bits: int, block: int, level: int = 4) -> ort.InferenceSession:
    """One linear [1, M, k] -> [1, M, n] on one intra-op thread: MatMulNBits at `bits` / `block` / `level`
    (no zero points, as edge's graphs emit them), or with bits 0 an fp32 MatMul. Random codes and scales."""
    rng = np.random.default_rng(0)
    if bits == 0:
        node = helper.make_node("MatMul", ["A", "W"], ["Y"])
        inits = [numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32), "W")]
    else:
        blocks = k // block
        codes = rng.integers(0, 256, (n, blocks, block * bits // 8), dtype=np.uint8)
        scales = rng.random(n * blocks, dtype=np.float32) * np.float32(0.01)
        node = helper.make_node(
            "MatMulNBits", ["A", "B", "S"], ["Y"], domain="com.microsoft",
            K=k, N=n, bits=bits, block_size=block, accuracy_level=level,
        )  # fmt: skip
        inits = [numpy_helper.from_array(codes, "B"), numpy_helper.from_array(scales, "S")]
    graph = helper.make_graph(
        [node],
        "linear",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, "M", k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, "M", n])],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    model = helper.make_model(graph, opset_imports=opsets).SerializeToString()
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def _form(text: str) -> tuple[int, int]:
    bits, _, block = text.partition("/")
    if not (bits.isdigit() and block.isdigit() and int(bits) > 0 and int(block) > 0):
        raise SystemExit(f"--forms: {text!r} is not bits/block (e.g. 4/32)")
    return int(bits), int(block)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="128,256,512")
    ap.add_argument("--shapes", default="1024x640,2048x640,640x4096,4864x896")
    ap.add_argument("--forms", default="4/32,8/32,8/16", help="bits/block, comma-separated (2/32: 2-bit)")
    args = ap.parse_args()
    forms = [_form(f) for f in args.forms.split(",")]
    rows = [int(m) for m in args.rows.split(",")]
    for shape in args.shapes.split(","):
        k, n = (int(d) for d in shape.split("x"))
        sessions = {form: linear_session(k, n, *form) for form in forms}
        for m in rows:
            a = np.random.default_rng(1).standard_normal((1, m, k), dtype=np.float32)
            best = dict.fromkeys(sessions, float("inf"))
            for _ in range(max(5, 2000 // m)):
                for form, s in sessions.items():  # forms interleaved
                    c0 = time.process_time()
                    s.run(None, {"A": a})
                    best[form] = min(best[form], time.process_time() - c0)
            cells = [
                f"{bits}-bit/{block}: {t * 1e3:.3f} ms ({2 * m * k * n / t / 1e9:.0f} GFLOP/s)"
                for (bits, block), t in best.items()
            ]
            print(f"K={k} N={n} M={m}: " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
