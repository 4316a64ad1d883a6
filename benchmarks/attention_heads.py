"""ONNX Runtime's CPU Attention (opset 23) with grouped query heads as h heads of q rows (what edge's attention
pass emitted up to GRAPH_FORMAT 16) vs kvh heads of grp * q rows (what it emits now), alone, over many layers.

    python benchmarks/attention_heads.py                          # smollm2-135m's heads: 9 / 3, head size 64
    python benchmarks/attention_heads.py --heads 14 --kv-heads 2  # qwen2.5-coder-0.5b's

One graph per form holds --layers attention blocks as the own ORT graph runs them at decode: the past K/V
[1, L, kvh*hd] and a --stage-slot staging window concatenated, 2 query rows (the token and the staging padding
row), an additive mask. Random inputs (masked columns included); checks that both forms give bit-identical
outputs, then times runs of the two sessions in turn (medians of --runs) for each --past length.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def _graph(grouped: bool, h: int, kvh: int, hd: int, rows: int, past: int, stage: int, layers: int) -> bytes:
    grp = h // kvh
    total = past + stage

    def value(name: str, shape: list[int] | None) -> object:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    def ints(name: str, vals: list[int]) -> object:
        return numpy_helper.from_array(np.array(vals, np.int64), name)

    inputs = [value("q", [1, rows, h * hd]), value("mask", [1, 1, rows, total])]
    inits = [
        ints("shape_q5", [0, 0, kvh, grp, hd]),
        ints("shape_rows", [0, -1, kvh * hd]),
        ints("shape_tiles", [1, 1, grp, 1]),
        ints("shape_y5", [0, grp, -1, kvh, hd]),
        ints("shape_y3", [0, -1, h * hd]),
    ]
    nodes, outputs = [], []
    if grouped:
        nodes.append(helper.make_node("Tile", ["mask", "shape_tiles"], ["mask_g"]))
    for i in range(layers):
        for kv in ("k", "v"):
            inputs += [
                value(f"past_{kv}{i}", [1, past, kvh * hd]),
                value(f"stage_{kv}{i}", [1, stage, kvh * hd]),
            ]
            nodes.append(
                helper.make_node("Concat", [f"past_{kv}{i}", f"stage_{kv}{i}"], [f"{kv}{i}"], axis=1)
            )
        if grouped:
            nodes += [
                helper.make_node("Reshape", ["q", "shape_q5"], [f"q5_{i}"]),
                helper.make_node("Transpose", [f"q5_{i}"], [f"qt_{i}"], perm=[0, 3, 1, 2, 4]),
                helper.make_node("Reshape", [f"qt_{i}", "shape_rows"], [f"qg_{i}"]),
                helper.make_node(
                    "Attention",
                    [f"qg_{i}", f"k{i}", f"v{i}", "mask_g"],
                    [f"y{i}"],
                    q_num_heads=kvh,
                    kv_num_heads=kvh,
                    scale=1.0,
                ),
                helper.make_node("Reshape", [f"y{i}", "shape_y5"], [f"y5_{i}"]),
                helper.make_node("Transpose", [f"y5_{i}"], [f"yt_{i}"], perm=[0, 2, 3, 1, 4]),
                helper.make_node("Reshape", [f"yt_{i}", "shape_y3"], [f"out{i}"]),
            ]
        else:
            nodes.append(
                helper.make_node(
                    "Attention",
                    ["q", f"k{i}", f"v{i}", "mask"],
                    [f"out{i}"],
                    q_num_heads=h,
                    kv_num_heads=kvh,
                    scale=1.0,
                )
            )
        outputs.append(value(f"out{i}", None))
    graph = helper.make_graph(nodes, "attention", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]).SerializeToString()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-size", type=int, default=64)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--stage-slots", type=int, default=16)
    ap.add_argument("--past", default="256,512,1024")
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    h, kvh, hd = args.heads, args.kv_heads, args.head_size
    if h % kvh:
        ap.error("--heads must be a multiple of --kv-heads")
    rng = np.random.default_rng(0)
    print(f"{args.layers} layers, {h} / {kvh} heads of {hd}, {args.rows} query rows, {args.threads} threads")
    for past in (int(p) for p in args.past.split(",")):
        total = past + args.stage_slots
        mask = np.where(rng.random((1, 1, args.rows, total)) < 0.1, np.float32(-1e30), np.float32(0))
        feeds = {"q": rng.standard_normal((1, args.rows, h * hd), np.float32), "mask": mask}
        for i in range(args.layers):
            for kv in ("k", "v"):
                feeds[f"past_{kv}{i}"] = rng.standard_normal((1, past, kvh * hd), np.float32)
                feeds[f"stage_{kv}{i}"] = rng.standard_normal((1, args.stage_slots, kvh * hd), np.float32)
        sessions = {}
        for name, grouped in (("h heads", False), ("kvh heads", True)):
            so = ort.SessionOptions()
            so.intra_op_num_threads = args.threads
            so.log_severity_level = 3
            model = _graph(grouped, h, kvh, hd, args.rows, past, args.stage_slots, args.layers)
            sessions[name] = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        a, b = (s.run(None, feeds) for s in sessions.values())
        same = all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
        times: dict[str, list[float]] = {n: [] for n in sessions}
        for _ in range(args.runs):
            for n, s in sessions.items():
                t = time.perf_counter()
                s.run(None, feeds)
                times[n].append(time.perf_counter() - t)
        cells = ", ".join(f"{n} {statistics.median(v) * 1e3:.2f} ms" for n, v in times.items())
        print(f"past {past}: {cells}; outputs bit-identical: {same}")


if __name__ == "__main__":
    main()
