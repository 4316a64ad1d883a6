"""Whether an fp16 ring KV pays on this CPU: a decode step's attention over L past slots with the past in f32 and
in fp16, in the forms the runtimes offer (issue #32, benchmarks/results/bench-depth-*-2026-12-05.md).

    python -m benchmarks.kv_dtype ops --length 4096
    python -m benchmarks.kv_dtype graphs --model qwen2.5-coder-0.5b --lengths 64,4096

`ops`: 24 layers of qwen2.5-coder-0.5b's geometry (14 query heads, 2 K/V heads, head 64), one decode row, each
layer its own past buffers, on ONNX Runtime's CPU provider: f32 / f16 (the opset-23 Attention as edge's attention
pass emits it, past ++ new concatenated; f16 = the whole op in fp16), f16cast (fp16 past Cast to f32 first),
split32 / split16 (the builder's unfused attention, no concat), gqa32 / gqa16 (com.microsoft GroupQueryAttention,
BNSH past), gqa32s / gqa16s (the same writing the new K/V in place into the past buffer: its shared buffer).
`graphs`: edge's own built fast graphs of MODEL (`--backend ort` / `openvino` must have built them), one decode
step with L random past slots bound, as built and with fp16 past inputs Cast to f32 at the graph's entry.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as oh

H, KVH, HD, LAYERS = 14, 2, 64, 24
GRP = H // KVH
F32_FORMS = ("f32", "split32", "gqa32", "gqa32s")


def _const(name: str, values: list[int]) -> onnx.NodeProto:
    arr = np.array(values, np.int64)
    return oh.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(arr, name))


def _fused_layer(i: int, form: str) -> list[onnx.NodeProto]:
    """graph_opt/attention.py's form: Concat(past, new) per K and V, one Attention of kvh heads of grp rows."""
    n: list[onnx.NodeProto] = []
    flat = []
    for past, new in ((f"pk{i}", f"nk{i}"), (f"pv{i}", f"nv{i}")):
        if form == "f16cast":
            n.append(oh.make_node("Cast", [past], [f"{past}_c"], to=TP.FLOAT))
            past = f"{past}_c"
        if form == "f16":
            n.append(oh.make_node("Cast", [new], [f"{new}_c"], to=TP.FLOAT16))
            new = f"{new}_c"
        n.append(oh.make_node("Concat", [past, new], [f"{past}_cat"], axis=1))
        n.append(oh.make_node("Reshape", [f"{past}_cat", "shp_flat"], [f"{past}_3d"]))
        flat.append(f"{past}_3d")
    q, mask = ("rows16", "mask16") if form == "f16" else ("rows", "mask_t")
    attn = oh.make_node(
        "Attention", [q, *flat, mask], [f"o{i}_x"], q_num_heads=KVH, kv_num_heads=KVH, scale=1.0
    )
    return [*n, attn, oh.make_node("Cast", [f"o{i}_x"], [f"o{i}"], to=TP.FLOAT)]


def _split_layer(i: int, form: str) -> list[onnx.NodeProto]:
    """models/transformer.py's unfused attention: past and new never concatenated, joined at the softmax."""
    n: list[onnx.NodeProto] = []
    pk, pv = f"pk{i}", f"pv{i}"
    if form == "split16":
        n += [oh.make_node("Cast", [x], [f"{x}_c"], to=TP.FLOAT) for x in (pk, pv)]
        pk, pv = f"{pk}_c", f"{pv}_c"
    for src, perm, dst in (
        (pk, [0, 2, 3, 1], "kt"),
        (f"nk{i}", [0, 2, 3, 1], "nkt"),
        (pv, [0, 2, 1, 3], "vh"),
    ):
        n.append(oh.make_node("Transpose", [src], [f"{dst}{i}_t"], perm=perm))
        n.append(oh.make_node("Unsqueeze", [f"{dst}{i}_t", "ax2"], [f"{dst}{i}"]))
    n.append(oh.make_node("Transpose", [f"nv{i}"], [f"nvh{i}_t"], perm=[0, 2, 1, 3]))
    n.append(oh.make_node("Unsqueeze", [f"nvh{i}_t", "ax2"], [f"nvh{i}"]))
    n += [
        oh.make_node("MatMul", ["qs", f"kt{i}"], [f"sp{i}"]),
        oh.make_node("MatMul", ["qs", f"nkt{i}"], [f"sn{i}"]),
    ]
    n.append(oh.make_node("Concat", [f"sp{i}", f"sn{i}"], [f"sc{i}"], axis=-1))
    n.append(oh.make_node("Add", [f"sc{i}", "mask5"], [f"sm{i}"]))
    n.append(oh.make_node("Softmax", [f"sm{i}"], [f"pr{i}"], axis=-1))
    n.append(oh.make_node("Split", [f"pr{i}", "split"], [f"pp{i}", f"pn{i}"], axis=-1))
    n += [
        oh.make_node("MatMul", [f"pp{i}", f"vh{i}"], [f"cp{i}"]),
        oh.make_node("MatMul", [f"pn{i}", f"nvh{i}"], [f"cn{i}"]),
    ]
    return [*n, oh.make_node("Add", [f"cp{i}", f"cn{i}"], [f"o{i}"])]


def _gqa_layer(i: int, kv_t: int) -> list[onnx.NodeProto]:
    """com.microsoft GroupQueryAttention over a BNSH past (returns present = past ++ new, or in place)."""
    n: list[onnx.NodeProto] = []
    q = "q"
    if kv_t == TP.FLOAT16:
        n.append(oh.make_node("Cast", ["q"], [f"q16_{i}"], to=kv_t))
        q = f"q16_{i}"
    for src in (f"nk{i}", f"nv{i}"):
        n.append(oh.make_node("Reshape", [src, "shp_flat"], [f"{src}_f"]))
        n.append(oh.make_node("Cast", [f"{src}_f"], [f"{src}_3d"], to=kv_t))
    ins = [q, f"nk{i}_3d", f"nv{i}_3d", f"pk{i}", f"pv{i}", "seqlens_k", "total_len"]
    n.append(
        oh.make_node(
            "GroupQueryAttention",
            ins,
            [f"o{i}_x", f"prk{i}", f"prv{i}"],
            domain="com.microsoft",
            num_heads=H,
            kv_num_heads=KVH,
            scale=1.0,
        )
    )
    return [*n, oh.make_node("Cast", [f"o{i}_x"], [f"o{i}"], to=TP.FLOAT)]


def _prologue(form: str) -> tuple[list[onnx.NodeProto], list[onnx.ValueInfoProto]]:
    """The query as the layers take it (grouped rows, or [1, kvh, grp, q, hd]) and the masks."""
    nodes = [_const("shp_rows", [0, 0, KVH, GRP, HD]), _const("shp_flat", [0, -1, KVH * HD])]
    inputs = [oh.make_tensor_value_info("q", TP.FLOAT, [1, 1, H * HD])]
    if form.startswith("gqa"):
        inputs += [oh.make_tensor_value_info("seqlens_k", TP.INT32, [1])]
        return nodes, [*inputs, oh.make_tensor_value_info("total_len", TP.INT32, [])]
    inputs.append(oh.make_tensor_value_info("mask", TP.FLOAT, [1, 1, 1, "L1"]))
    nodes.append(oh.make_node("Reshape", ["q", "shp_rows"], ["q5"]))
    if form.startswith("split"):
        nodes += [_const("ax2", [2]), oh.make_node("Transpose", ["q5"], ["qs"], perm=[0, 2, 3, 1, 4])]
        inputs.append(oh.make_tensor_value_info("split", TP.INT64, [2]))
        return [*nodes, oh.make_node("Unsqueeze", ["mask", "ax2"], ["mask5"])], inputs
    nodes += [
        oh.make_node("Transpose", ["q5"], ["q5t"], perm=[0, 3, 1, 2, 4]),
        _const("tile", [1, 1, GRP, 1]),
    ]
    nodes += [oh.make_node("Reshape", ["q5t", "shp_flat"], ["rows"])]
    nodes += [oh.make_node("Tile", ["mask", "tile"], ["mask_t"])]
    if form == "f16":
        nodes += [oh.make_node("Cast", ["rows"], ["rows16"], to=TP.FLOAT16)]
        nodes += [oh.make_node("Cast", ["mask_t"], ["mask16"], to=TP.FLOAT16)]
    return nodes, inputs


def build(form: str) -> onnx.ModelProto:
    kv_t = TP.FLOAT if form in F32_FORMS else TP.FLOAT16
    nodes, inputs = _prologue(form)
    layout = [1, KVH, "L", HD] if form.startswith("gqa") else [1, "L", KVH, HD]
    for i in range(LAYERS):
        inputs += [oh.make_tensor_value_info(n, kv_t, layout) for n in (f"pk{i}", f"pv{i}")]
        inputs += [oh.make_tensor_value_info(n, TP.FLOAT, [1, 1, KVH, HD]) for n in (f"nk{i}", f"nv{i}")]
        if form.startswith("gqa"):
            nodes += _gqa_layer(i, kv_t)
        elif form.startswith("split"):
            nodes += _split_layer(i, form)
        else:
            nodes += _fused_layer(i, form)
    nodes.append(oh.make_node("Sum", [f"o{i}" for i in range(LAYERS)], ["y"]))
    outputs = [oh.make_tensor_value_info("y", TP.FLOAT, None)]
    if form.endswith("s"):  # the presents, bound to the past buffers
        outputs += [oh.make_tensor_value_info(f"pr{x}{i}", kv_t, None) for i in range(LAYERS) for x in "kv"]
    graph = oh.make_graph(nodes, form, inputs, outputs)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 23), oh.make_opsetid("com.microsoft", 1)])


def op_feeds(form: str, length: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    dt = np.float32 if form in F32_FORMS else np.float16
    f = {"q": rng.standard_normal((1, 1, H * HD), np.float32) * 0.1}
    if form.startswith("gqa"):
        f |= {"seqlens_k": np.array([length], np.int32), "total_len": np.array(length + 1, np.int32)}
    else:
        f["mask"] = np.zeros((1, 1, 1, length + 1), np.float32)
    if form.startswith("split"):
        f["split"] = np.array([length, 1], np.int64)
    shape = (1, KVH, length, HD) if form.startswith("gqa") else (1, length, KVH, HD)
    if form.endswith("s"):
        shape = (1, KVH, length + 64, HD)  # a capacity beyond the filled slots
    for i in range(LAYERS):
        f[f"pk{i}"] = rng.standard_normal(shape, np.float32).astype(dt)
        f[f"pv{i}"] = rng.standard_normal(shape, np.float32).astype(dt)
        f[f"nk{i}"] = rng.standard_normal((1, 1, KVH, HD), np.float32)
        f[f"nv{i}"] = rng.standard_normal((1, 1, KVH, HD), np.float32)
    return f


def clock(run: Callable[[], object], steps: int) -> float:
    """Median ms of `steps` runs after 3 unmeasured ones."""
    for _ in range(3):
        run()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def time_op_form(form: str, length: int, threads: int, steps: int) -> float:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.log_severity_level = threads, 3
    sess = ort.InferenceSession(build(form).SerializeToString(), so, providers=["CPUExecutionProvider"])
    f = op_feeds(form, length)
    binding = sess.io_binding()
    for name, value in f.items():
        binding.bind_cpu_input(name, value)
    binding.bind_output("y")
    for i in range(LAYERS if form.endswith("s") else 0):  # present written in place into the past buffer
        for src, out in ((f"pk{i}", f"prk{i}"), (f"pv{i}", f"prv{i}")):
            a = f[src]
            binding.bind_output(out, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)
    return clock(lambda: sess.run_with_iobinding(binding), steps)


def built_graph(model: str, target: str) -> Path:
    """The folder of MODEL's fast graph for `target` in edge's cache (the DONE record names its source)."""
    from edge.models.resolve import resolve_model

    source = resolve_model(model).name
    root = Path(os.environ.get("EDGE_CACHE_DIR", Path.home() / ".cache/edge")) / "graphs"
    for done in sorted(root.glob("*/DONE")):
        rec = json.loads(done.read_text())
        if (rec.get("source"), rec.get("target"), rec.get("precision")) == (source, target, "fast"):
            return done.parent
    raise SystemExit(f"no fast {target} graph of {model} built: run `edge run {model} hi --backend {target}`")


def fp16_variant(src: Path, fp16: bool, out: Path) -> Path:
    """The graph with its past_* inputs fp16, each Cast to f32 first (fp16=False: the graph as built); the weights
    hard-linked (the runtimes refuse external data outside the model's folder)."""
    m = onnx.load(str(src / "model.onnx"), load_external_data=False)
    casts = []
    for inp in m.graph.input if fp16 else []:
        if inp.name.startswith("past_"):
            name, inp.name = inp.name, inp.name + "_f16"
            inp.type.tensor_type.elem_type = TP.FLOAT16
            casts.append(oh.make_node("Cast", [inp.name], [name], to=TP.FLOAT, name=name + "_cast"))
    nodes = casts + list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "model.onnx.data").exists():
        os.link(src / "model.onnx.data", out / "model.onnx.data")
    onnx.save(m, str(out / "model.onnx"))
    return out / "model.onnx"


def graph_feeds(inputs: list[tuple[str, bool]], length: int, staged: bool) -> dict[str, np.ndarray]:
    """One decode step's inputs with `length` random past slots ((name, fp16) per input); staged: a 32-slot
    staging window and the padding query row (kvcache/staging.py)."""
    rng, w = np.random.default_rng(0), 32
    f: dict[str, np.ndarray] = {}
    for name, fp16 in inputs:
        if name == "hidden":
            f[name] = rng.standard_normal((1, 1, H * HD), np.float32) * 0.1
        elif name == "positions":
            f[name] = np.array([length], np.int64)
        elif name.startswith("mask_"):
            f[name] = np.zeros((1, 1, 2 if staged else 1, length + (w if staged else 1)), np.float32)
        elif name == "stage_index":
            f[name] = np.array([[[0, 0]]], np.int64)
        elif name.startswith("stage_"):
            f[name] = np.zeros((1, w, KVH, HD), np.float32)
        elif name.startswith("past_"):
            past = rng.standard_normal((1, length, KVH, HD), np.float32) * 0.5
            f[name] = past.astype(np.float16 if fp16 else np.float32)
        elif name.startswith("split_"):
            f[name] = np.array([length, w if staged else 1], np.int64)
        elif name == "logit_rows":
            f[name] = np.array([0], np.int64)
        else:
            raise SystemExit(f"unknown graph input {name}")
    return f


def time_ort_graph(path: Path, length: int, threads: int, steps: int) -> float:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = threads, 1, 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as devices/runners.py
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    f = graph_feeds([(i.name, "float16" in i.type) for i in sess.get_inputs()], length, staged=True)
    binding = sess.io_binding()
    for name, value in f.items():
        binding.bind_cpu_input(name, value)
    for out in sess.get_outputs():
        binding.bind_output(out.name)
    return clock(lambda: sess.run_with_iobinding(binding), steps)


def time_ov_graph(path: Path, length: int, threads: int, steps: int) -> float:
    import openvino as ov

    core = ov.Core()
    config = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1, "INFERENCE_NUM_THREADS": threads}
    config |= {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 32}  # --precision fast
    compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
    req = compiled.create_infer_request()
    ins = [(i.get_any_name(), i.get_element_type() == ov.Type.f16) for i in compiled.inputs]
    for name, value in graph_feeds(ins, length, staged=False).items():
        req.set_tensor(name, ov.Tensor(value, shared_memory=True))
    return clock(req.infer, steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("ops", "graphs"))
    ap.add_argument("--model", default="qwen2.5-coder-0.5b", help="graphs: whose built fast graphs")
    ap.add_argument(
        "--length", "--lengths", dest="lengths", default="4096", help="past slots, comma-separated"
    )
    ap.add_argument("--forms", default="f32,f16,f16cast,split32,split16,gqa32,gqa16,gqa32s,gqa16s")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3, help="rounds, variants interleaved")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    cases: dict[str, Callable[[int], float]] = {}
    if args.what == "ops":
        for form in args.forms.split(","):
            cases[form] = lambda n, f=form: time_op_form(f, n, args.threads, args.steps)
    else:
        tmp = Path(os.environ.get("TMPDIR", "/tmp")) / "edge-kv-dtype"
        for target, timer in (("ort", time_ort_graph), ("openvino", time_ov_graph)):
            src = built_graph(args.model, target)
            for fp16 in (False, True):
                path = fp16_variant(src, fp16, tmp / f"{target}-{'f16' if fp16 else 'f32'}")
                cases[f"{target} past {'f16' if fp16 else 'f32'}"] = lambda n, p=path, t=timer: t(
                    p, n, args.threads, args.steps
                )
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for n in lengths:
            for name, run in cases.items():
                times.setdefault((name, n), []).append(run(n))
    for (name, n), ms in times.items():
        print(
            f"{name:18s} L={n:5d}: {statistics.median(ms):7.2f} ms/step (rounds: {', '.join(f'{x:.2f}' for x in ms)})"
        )


if __name__ == "__main__":
    main()
