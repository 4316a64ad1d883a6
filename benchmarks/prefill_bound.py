"""How fast the own ORT graph's prefill could be on this CPU with ONNX Runtime's kernels, against llama.cpp.

    python benchmarks/prefill_bound.py qwen2.5-coder-0.5b qwen2.5-coder-1.5b [--prompt 512 --threads 2]

For each model: every weight-bearing node of the graph `--backend ort` runs (MatMulNBits at its bits, block
and accuracy level; MatMul with a constant weight) is timed alone at the prefill chunk's row count on one
thread, hot in cache, least CPU time of several runs. Their sum over a prompt's chunks, divided by the
threads (perfect scaling), is a lower bound on the graph's prefill time: attention, norms and every other node
are left out. A second bound runs every linear as a plain fp32 MatMul (MLAS SGEMM: the ceiling of any form that
dequantizes first, at 4 bytes a weight). llama.cpp and the graph prefill the same prompt in the same run
(first prompt after load, then the best of 2 warm ones), and the bounds are given as multiples of llama.cpp's
speed: a bound under 2 means no graph on these kernels reaches #14's 2x prefill on this machine.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from results_io import write_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edge.devices.registry import DecoderOptions, open_decoder  # noqa: E402
from edge.models.store import resolve_model  # noqa: E402

# (K, N, bits, block, accuracy level); bits 0 = fp32 MatMul
Form = tuple[int, int, int, int, int]


def graph_forms(path: Path) -> tuple[collections.Counter[Form], Form]:
    """The weight-bearing nodes of a graph counted by form, less the head, and the head's form (the node that
    writes "logits": a prefill runs it on the prompt's last row only)."""
    model = onnx.load(str(path), load_external_data=False)
    consts = {t.name: list(t.dims) for t in model.graph.initializer}
    forms: collections.Counter[Form] = collections.Counter()
    head: Form | None = None
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
            form = (a["K"], a["N"], a["bits"], a["block_size"], a.get("accuracy_level", 0))
        elif node.op_type == "MatMul" and node.input[1] in consts and len(consts[node.input[1]]) == 2:
            form = (*consts[node.input[1]], 0, 0, 0)
        else:
            continue
        if "logits" in node.output:
            head = form
        else:
            forms[form] += 1
    if head is None:
        raise SystemExit(f"{path}: no linear writes the graph's logits; the head could not be told apart")
    return forms, head


def _session(form: Form, fp32: bool) -> ort.InferenceSession:
    k, n, bits, block, level = form
    rng = np.random.default_rng(0)
    if fp32 or bits == 0:
        node = helper.make_node("MatMul", ["A", "W"], ["Y"])
        inits = [numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32), "W")]
    else:
        codes = rng.integers(0, 256, (n, k // block, block * bits // 8), dtype=np.uint8)
        scales = rng.random(n * (k // block), dtype=np.float32) * 0.01
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


def kernel_seconds(form: Form, rows: int, fp32: bool, runs: int = 5) -> float:
    """Least one-thread CPU time of one run of this form at `rows` rows."""
    sess = _session(form, fp32)
    a = np.random.default_rng(1).standard_normal((1, rows, form[0]), dtype=np.float32)
    sess.run(None, {"A": a})
    best = float("inf")
    for _ in range(runs):
        c0 = time.process_time()
        sess.run(None, {"A": a})
        best = min(best, time.process_time() - c0)
    return best


def prefill_tok_s(backend: str, model: str, prompt: list[int], threads: int) -> tuple[float, float, Any]:
    """(first prompt after load, best warm) tokens/s, and the decoder (closed: its chunk and graph_path)."""
    opts = DecoderOptions(n_ctx=len(prompt) + 64, n_threads=threads)
    dec = open_decoder(backend, resolve_model(model), "cpu", opts)
    try:
        times = []
        for _ in range(3):
            dec.reset()
            t0 = time.perf_counter()
            dec.forward(prompt, last_only=True)
            times.append(time.perf_counter() - t0)
    finally:
        dec.close()
    return len(prompt) / times[0], len(prompt) / min(times[1:]), dec


def bound(model: str, args: argparse.Namespace) -> dict[str, Any]:
    prompt = [100 + (i * 7919) % 20000 for i in range(args.prompt)]
    llama_first, llama_warm, _ = prefill_tok_s("llamacpp", model, prompt, args.threads)
    ort_first, ort_warm, dec = prefill_tok_s("ort", model, prompt, args.threads)
    chunk = dec.chunk
    forms, head = graph_forms(dec.graph_path)
    chunks = [min(chunk, args.prompt - i) for i in range(0, args.prompt, chunk)]
    cost = {"kernels": 0.0, "fp32": 0.0}
    rows: list[dict[str, Any]] = []
    for form, count in sorted(forms.items(), key=lambda f: -f[0][0] * f[0][1] * f[1]):
        # every chunk of one size costs alike: time each size once, weight by how often it occurs
        per = {
            kind: sum(kernel_seconds(form, m, kind == "fp32") * chunks.count(m) for m in set(chunks))
            for kind in cost
        }
        for kind in cost:
            cost[kind] += count * per[kind]
        k, n, bits, block, level = form
        name = f"{bits}-bit/{block} level {level}" if bits else "fp32 MatMul"
        rows.append(
            {"form": name, "k": k, "n": n, "count": count, "ms": {x: 1e3 * v for x, v in per.items()}}
        )
    for kind in cost:
        cost[kind] += kernel_seconds(head, 1, kind == "fp32")
    bound_tok_s = {kind: args.prompt / (s / args.threads) for kind, s in cost.items()}
    return {
        "chunk": chunk,
        "llamacpp": {"first": llama_first, "warm": llama_warm},
        "ort": {"first": ort_first, "warm": ort_warm},
        "bound_tok_s": bound_tok_s,
        "forms": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    runs = {m: bound(m, args) for m in args.models}
    day = dt.date.today().isoformat()
    lines = [
        f"# Prefill bound of the own ORT graph on ONNX Runtime {ort.__version__}'s kernels ({day})",
        "",
        f"`python benchmarks/prefill_bound.py {' '.join(args.models)} --prompt {args.prompt} "
        f"--threads {args.threads}`: a {args.prompt}-token prompt, {args.threads} threads. Bound = the graph's "
        "weight-bearing nodes alone, each timed on one thread hot in cache, summed over the chunks and divided "
        "by the threads (all other nodes free, perfect scaling), plus the head on the prompt's last row. "
        "fp32 bound = the same linears as fp32 SGEMM.",
        "",
        "| model | chunk | llama.cpp first / warm tok/s | ORT graph first / warm | bound (ORT kernels) | "
        "x llama.cpp first | fp32 SGEMM bound | x llama.cpp first |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, r in runs.items():
        lf, b = r["llamacpp"]["first"], r["bound_tok_s"]
        lines.append(
            f"| {m} | {r['chunk']} | {lf:.0f} / {r['llamacpp']['warm']:.0f} | {r['ort']['first']:.0f} / "
            f"{r['ort']['warm']:.0f} | {b['kernels']:.0f} | {b['kernels'] / lf:.2f} | {b['fp32']:.0f} | "
            f"{b['fp32'] / lf:.2f} |"
        )
    for m, r in runs.items():
        lines += [
            "",
            f"## {m}: the forms, one prompt, one thread",
            "",
            "| form | K x N | nodes | ms | fp32 ms |",
        ]
        lines.append("|---|---|---|---|---|")
        for f in r["forms"]:
            lines.append(
                f"| {f['form']} | {f['k']} x {f['n']} | {f['count']} | {f['ms']['kernels']:.1f} | "
                f"{f['ms']['fp32']:.1f} |"
            )
    stem = ROOT / "benchmarks" / "results" / f"prefill-bound-{day}{args.tag}"
    write_results(stem, {"args": vars(args), "runs": runs}, lines)


if __name__ == "__main__":
    main()
