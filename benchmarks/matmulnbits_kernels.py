"""ORT MatMulNBits at accuracy level 4 (int8 activations) by weight bits and block: 4-bit block 32 (Q4_K, Q4_0),
8-bit block 32 (Q5_0, Q8_0) and 8-bit block 16 (Q6_K), at prefill row counts, on one thread.

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


def _session(bits: int, block: int, k: int, n: int) -> ort.InferenceSession:
    rng = np.random.default_rng(0)
    blocks = k // block
    codes = rng.integers(0, 256, (n, blocks, block * bits // 8), dtype=np.uint8)
    scales = (rng.random(n * blocks, dtype=np.float32) * 0.01).astype(np.float32)
    node = helper.make_node(
        "MatMulNBits",
        ["A", "B", "S"],
        ["Y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=bits,
        block_size=block,
        accuracy_level=4,
    )
    graph = helper.make_graph(
        [node],
        "mm",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, "M", k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, "M", n])],
        [numpy_helper.from_array(codes, "B"), numpy_helper.from_array(scales, "S")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    model = helper.make_model(graph, opset_imports=opsets).SerializeToString()
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="128,256,512")
    ap.add_argument("--shapes", default="1024x640,2048x640,640x4096,4864x896")
    ap.add_argument("--forms", default="4/32,8/32,8/16", help="bits/block, comma-separated (2/32: 2-bit)")
    args = ap.parse_args()
    forms = [tuple(int(x) for x in f.split("/")) for f in args.forms.split(",")]
    rows = [int(m) for m in args.rows.split(",")]
    for shape in args.shapes.split(","):
        k, n = (int(d) for d in shape.split("x"))
        sessions = {form: _session(*form, k, n) for form in forms}
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
