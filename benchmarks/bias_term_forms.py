"""The block-bias term of K-quant linears (GGUF Q4_K / Q5_K: bias = -dmin * m per 32-element block) in each
ONNX form edge can emit, timed alone on ORT at one decode token, with qwen2.5-coder-1.5b's shapes.

    python benchmarks/bias_term_forms.py [--threads 2] [--runs 30] [--rounds 5]

One graph per form holds the bias terms of every K-quant linear of the 1.5b (28 layers: fused QKV 2048 x
1536, attn_output 1536 x 1536, fused gate+up 17920 x 1536, and ffn_down 1536 x 8960 in half the layers), so
the weights (~140 MB as fp32) overflow the caches as in a real decode step. Random codes m (6-bit) and dmin
(fp16); the forms:

    sums            the block sums alone (what every form pays before its matmul)
    fp32            MatMul(blocksum(x), bias^T), bias float32 [n, k / 32] (what edge emits)
    nbits8_half     MatMulNBits 8-bit, block 16 over half-block sums (k / 16 of them): each block's code m
                    twice, one group (scale -dmin) per 256-element superblock; accuracy level 0
    nbits8_half_l4  the same at accuracy level 4 (ORT quantizes the sums to int8)
    nbits8_pad      MatMulNBits 8-bit, block 16 over block sums padded 8 -> 16 per superblock; level 0
    nibbles         nbits8_half as two 4-bit MatMulNBits (m = 16 hi + lo), exact at accuracy level 0

Prints the median ms per token of each form (interleaved rounds) and its weight bytes.

    python benchmarks/bias_term_forms.py --decode qwen2.5-coder-1.5b --precision exact

The same forms inside the model's own ORT graph: every block-bias MatMul of the graph `--backend ort` runs
is replaced by the form (random codes of the true shapes: this times the forms, its logits are noise), and
single-token decode steps are timed, the forms' sessions taking turns. fp32 is the graph as built.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edge.graph_opt.weight import pack_codes  # noqa: E402

HIDDEN, FFN, LAYERS = 1536, 8960, 28


def shapes() -> list[tuple[int, int]]:
    """(n, k) of every K-quant linear of qwen2.5-coder-1.5b Q4_K_M."""
    out = []
    for layer in range(LAYERS):
        out += [(2048, HIDDEN), (HIDDEN, HIDDEN), (2 * FFN, HIDDEN)]
        if layer % 2:
            out.append((HIDDEN, FFN))
    return out


class Graph:
    """A graph under construction: inputs x_<k> [1, 1, k], every term an output."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.n = 0

    def name(self, base: str) -> str:
        self.n += 1
        return f"{base}_{self.n}"

    def init(self, array: np.ndarray) -> str:
        name = self.name("w")
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def op(self, op_type: str, inputs: list[str], domain: str = "", **attrs: object) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], domain=domain or None, **attrs))
        return out

    def sums(self, x: str, groups: int, size: int) -> str:
        shape = self.init(np.array([0, 0, groups, size], np.int64))
        axis = self.init(np.array([-1], np.int64))
        return self.op("ReduceSum", [self.op("Reshape", [x, shape]), axis], keepdims=0)

    def nbits(self, s: str, codes: np.ndarray, scales: np.ndarray, bits: int, level: int, zp=None) -> str:
        n, k = codes.shape
        ins = [s, self.init(pack_codes(codes, bits).reshape(n, k // 16, 16 * bits // 8)), self.init(scales)]
        if zp is not None:
            ins.append(self.init(pack_codes(zp, bits)))
        attrs = {"K": k, "N": n, "bits": bits, "block_size": 16}
        if level:
            attrs["accuracy_level"] = level
        return self.op("MatMulNBits", ins, "com.microsoft", **attrs)

    def model(self, outputs: list[str]) -> bytes:
        ks = sorted({k for _, k in shapes()})
        graph = helper.make_graph(
            self.nodes,
            "bias_terms",
            [helper.make_tensor_value_info(f"x_{k}", TensorProto.FLOAT, [1, 1, k]) for k in ks],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
            self.inits,
        )
        opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
        return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def term(g: Graph, form: str, k: int, m: np.ndarray, dmin: np.ndarray) -> str:
    """One bias term on x_<k>: m uint8 [n, k / 32], dmin float32 [n, k / 256]."""
    x, n = f"x_{k}", m.shape[0]
    neg = (-dmin).astype(np.float32)
    if form == "sums":
        return g.sums(x, k // 32, 32)
    if form == "fp32":
        bias = (neg.repeat(8, axis=1) * m.astype(np.float32)).astype(np.float32)
        return g.op("MatMul", [g.sums(x, k // 32, 32), g.init(bias.T)])
    if form == "nbits8_pad":  # [.., k/256, 8] block sums padded to 16 per superblock, codes 128 (0) there
        codes = np.full((n, k // 256, 16), 128, np.uint8)
        codes[..., :8] = m.reshape(n, -1, 8) + np.uint8(128)
        s8 = g.op("Reshape", [g.sums(x, k // 32, 32), g.init(np.array([0, 0, k // 256, 8], np.int64))])
        pads = g.init(np.array([0, 0, 0, 0, 0, 0, 0, 8], np.int64))
        s16 = g.op("Reshape", [g.op("Pad", [s8, pads]), g.init(np.array([0, 0, k // 16], np.int64))])
        return g.nbits(s16, codes.reshape(n, -1), neg, 8, 0)
    half = np.repeat(m, 2, axis=1)  # [n, k / 16]
    s = g.sums(x, k // 16, 16)
    if form.startswith("nbits8_half"):
        level = 4 if form.endswith("l4") else 0
        return g.nbits(s, half + np.uint8(128), neg, 8, level)
    if form == "nibbles":
        hi = g.nbits(s, (half >> 4) + np.uint8(8), neg * np.float32(16), 4, 0)
        lo = g.nbits(s, half & 15, neg, 4, 0, zp=np.zeros((n, k // 256), np.uint8))
        return g.op("Add", [hi, lo])
    raise ValueError(form)


FORMS_TIMED = ["sums", "fp32", "nbits8_half", "nbits8_half_l4", "nbits8_pad", "nibbles"]


def rewrite_bias_terms(model_path: Path, form: str, out: Path) -> int:
    """The graph at model_path with each block-bias MatMul computed by `form` on random codes; saved to
    out/model.onnx. The number of terms replaced."""
    import onnx_ir as ir

    from edge.graph_opt._rules import ROLE_KEY, const_array

    model = ir.load(model_path)
    graph, rng, n = model.graph, np.random.default_rng(0), 0
    for mm in [
        node for node in graph if node.op_type == "MatMul" and node.metadata_props.get(ROLE_KEY) == "bias"
    ]:
        bias_t = const_array(mm.inputs[1])
        sums = mm.inputs[0].producer()
        x = sums.inputs[0].producer().inputs[0]  # ReduceSum <- Reshape <- x
        kb, nn = bias_t.shape
        k = kb * 32
        m = rng.integers(0, 64, (nn, kb), dtype=np.uint8)
        dmin = (rng.random((nn, k // 256), np.float32) * 1e-3).astype(np.float32)
        g = Graph()
        xs = f"x_{k}"
        y = term(g, form, k, m, dmin)
        values: dict[str, ir.Value] = {xs: x}
        for t in g.inits:
            arr = numpy_helper.to_array(t)
            v = ir.Value(name=f"{mm.name}.{t.name}", const_value=ir.tensor(arr, name=f"{mm.name}.{t.name}"))
            v.shape, v.type = ir.Shape(arr.shape), ir.TensorType(ir.DataType.from_numpy(arr.dtype))
            graph.register_initializer(v)
            values[t.name] = v
        new_nodes = []
        for proto in g.nodes:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in proto.attribute}
            node = ir.node(
                proto.op_type, [values[i] for i in proto.input], attributes=attrs, domain=proto.domain
            )
            values[proto.output[0]] = node.outputs[0]
            new_nodes.append(node)
        graph.insert_after(mm, new_nodes)
        ir.convenience.replace_all_uses_with(mm.outputs[0], values[y])
        graph.remove(mm, safe=True)
        n += 1
    model.opset_imports.setdefault("com.microsoft", 1)
    out.mkdir(parents=True, exist_ok=True)
    ir.save(model, out / "model.onnx", external_data="model.onnx.data")
    return n


def decode(model: str, precision: str, forms: list[str], threads: int, steps: int, rounds: int) -> None:
    import tempfile

    from edge.devices.graph_decoder import GraphDecoder, GraphOptions
    from edge.devices.runners import OrtRunner, RunnerOptions
    from edge.models.gguf_file import open_gguf
    from edge.models.resolve import resolve_model

    dec = GraphDecoder(
        open_gguf(resolve_model(model)),
        GraphOptions(backend="ort", capacity=512, precision=precision, threads=threads, spin=False),
    )
    # NOTE: no spinning: a session's threads spinning after its turn would slow the next form's
    opts = RunnerOptions("cpu", threads, precision, spin=False)
    runners = {"fp32": dec.runner}
    tmp = Path(tempfile.mkdtemp(prefix="bias_term_forms."))
    try:
        for form in forms:
            if form != "fp32":
                n = rewrite_bias_terms(dec.graph_path, form, tmp / form)
                print(f"{form}: {n} block-bias terms replaced", flush=True)
                runners[form] = OrtRunner(tmp / form / "model.onnx", opts)
        # NOTE: the forms take turns token by token (one KV cache, written by each in turn: timing only), so
        # the load of a shared machine falls on all of them alike
        secs: dict[str, list[float]] = {f: [] for f in forms}
        for _ in range(rounds):
            dec.reset()
            dec.forward(list(range(100, 132)), last_only=True)
            for i in range(steps):
                for form in forms:
                    dec.runner = runners[form]
                    t0 = time.perf_counter()
                    dec.forward([1000 + i], last_only=True)
                    secs[form].append(time.perf_counter() - t0)
        tok_s = {f: [1 / t for t in ts] for f, ts in secs.items()}
        print(
            f"{model} --precision {precision}, ORT, {threads} threads, {rounds} rounds of {steps} decode steps per form"
        )
        print("| form of the block-bias term | decode tok/s (median) | x fp32 |")
        print("|---|---|---|")
        base = statistics.median(tok_s[forms[0]])
        for form in forms:
            med = statistics.median(tok_s[form])
            print(f"| {form} | {med:.2f} | {med / base:.3f} |")
    finally:
        dec.runner = runners["fp32"]
        for form, r in runners.items():
            if form != "fp32":
                r.close()
        dec.close()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    import onnxruntime as ort

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=30, help="runs per block (its median counts)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved blocks per form (median of medians)")
    ap.add_argument("--forms", default=",".join(FORMS_TIMED))
    ap.add_argument("--decode", metavar="MODEL", help="time the forms inside this model's ORT graph")
    ap.add_argument("--precision", default="exact", choices=["exact", "fast"])
    ap.add_argument("--steps", type=int, default=32, help="--decode: decode steps per round")
    args = ap.parse_args()
    if args.decode:
        forms = [f for f in args.forms.split(",") if f != "sums"]
        decode(args.decode, args.precision, forms, args.threads, args.steps, args.rounds)
        return
    rng = np.random.default_rng(0)
    weights = [
        (k, rng.integers(0, 64, (n, k // 32), dtype=np.uint8), rng.random((n, k // 256), np.float32) * 1e-2)
        for n, k in shapes()
    ]
    feeds = {f"x_{k}": rng.standard_normal((1, 1, k)).astype(np.float32) for k in {k for _, k in shapes()}}
    forms = args.forms.split(",")
    sessions, results, nbytes = {}, {}, {}
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    for form in forms:
        g = Graph()
        outs = [term(g, form, k, m, d) for k, m, d in weights]
        nbytes[form] = sum(t.ByteSize() for t in g.inits if t.ByteSize() > 1024)
        sessions[form] = ort.InferenceSession(g.model(outs), so, providers=["CPUExecutionProvider"])
        results[form] = np.concatenate([o.reshape(-1) for o in sessions[form].run(None, feeds)])
    ref = results.get("fp32")
    # NOTE: blocks of runs per session, rounds interleaved: a session's first runs after another's are slower
    # (its threads wake, its weights come back from memory), as they would not be inside one decode graph
    times: dict[str, list[float]] = {f: [] for f in forms}
    for _ in range(args.rounds):
        for form in forms:
            block = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                sessions[form].run(None, feeds)
                block.append(time.perf_counter() - t0)
            times[form].append(statistics.median(block))
    print(f"ORT {ort.__version__}, {args.threads} threads, {args.rounds} rounds of {args.runs} runs per form")
    print("| form | weight MB | ms / token (median) | max abs diff to fp32 / max abs fp32 |")
    print("|---|---|---|---|")
    for form in forms:
        diff = ""
        if ref is not None and form != "sums":
            diff = f"{float(np.abs(results[form] - ref).max() / np.abs(ref).max()):.1e}"
        print(f"| {form} | {nbytes[form] / 1e6:.1f} | {1e3 * statistics.median(times[form]):.3f} | {diff} |")


if __name__ == "__main__":
    main()
