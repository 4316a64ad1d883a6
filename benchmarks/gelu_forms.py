"""The tanh GELU on ONNX Runtime in three forms: the builder's nine elementwise nodes, ONNX Gelu(approximate=
"tanh") (opset 20) and com.microsoft FastGelu (what graph_opt's gelu pass emits at --precision fast).

    python benchmarks/gelu_forms.py --rows 512 --width 2048 --threads 2

Times one run over an activation [1, rows, width] (gemma3-270m's FFN is 2048 wide), forms interleaved, and
reports the min and median ms and each form's largest difference to the nodes.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import NodeProto, TensorProto, helper


def _model(form: str, width: int) -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "rows", width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "rows", width])
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    if form == "gelu":
        nodes = [helper.make_node("Gelu", ["x"], ["y"], approximate="tanh")]
    elif form == "fastgelu":
        nodes = [helper.make_node("FastGelu", ["x"], ["y"], domain="com.microsoft")]
    else:  # the builder's form (models/transformer.py, activation "gelu_tanh")

        def const(name: str, v: float) -> NodeProto:
            return helper.make_node(
                "Constant", [], [name], value=helper.make_tensor(name, TensorProto.FLOAT, [], [v])
            )

        nodes = [
            const("cube", 0.044715),
            const("s2p", math.sqrt(2 / math.pi)),
            const("half", 0.5),
            const("one", 1.0),
            helper.make_node("Mul", ["x", "x"], ["xx"]),
            helper.make_node("Mul", ["xx", "x"], ["x3"]),
            helper.make_node("Mul", ["x3", "cube"], ["a"]),
            helper.make_node("Add", ["x", "a"], ["b"]),
            helper.make_node("Mul", ["b", "s2p"], ["inner"]),
            helper.make_node("Tanh", ["inner"], ["t"]),
            helper.make_node("Add", ["t", "one"], ["t1"]),
            helper.make_node("Mul", ["x", "half"], ["h"]),
            helper.make_node("Mul", ["h", "t1"], ["y"]),
        ]
    return helper.make_model(
        helper.make_graph(nodes, form, [x], [y]), opset_imports=opsets
    ).SerializeToString()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    forms = ["nodes", "gelu", "fastgelu"]
    sessions = {
        f: ort.InferenceSession(_model(f, args.width), so, providers=["CPUExecutionProvider"]) for f in forms
    }
    x = np.random.default_rng(0).standard_normal((1, args.rows, args.width), dtype=np.float32) * 3
    outs = {f: s.run(None, {"x": x})[0] for f, s in sessions.items()}
    times: dict[str, list[float]] = {f: [] for f in forms}
    for _ in range(args.runs):
        for f, s in sessions.items():
            t0 = time.perf_counter()
            s.run(None, {"x": x})
            times[f].append(time.perf_counter() - t0)
    print(f"tanh GELU over [1, {args.rows}, {args.width}], {args.threads} threads, {args.runs} runs each")
    for f in forms:
        diff = float(np.abs(outs[f] - outs["nodes"]).max())
        print(
            f"  {f:9} min {min(times[f]) * 1e3:6.3f} ms  median {statistics.median(times[f]) * 1e3:6.3f} ms  "
            f"max |diff| to the nodes {diff:.1e}"
        )


if __name__ == "__main__":
    main()
