"""How fast the own ORT graph's prefill could be on this CPU with ONNX Runtime's kernels, against llama.cpp.

    python benchmarks/prefill_bound.py qwen2.5-coder-0.5b qwen2.5-coder-1.5b [--prompt 512 --threads 2]

For each model, every weight-bearing node of the graph `--backend ort` runs (`--precision fast`: MatMulNBits at
its bits, block and accuracy level; MatMul with a constant weight, the K-quants' block-bias term) is timed
alone at the prefill chunk's row count on one thread: the least process CPU time of 5 runs after a first one.
Summed over the prompt's chunks and divided by the threads (perfect scaling), plus the head on the prompt's last
row, that is a lower bound on the graph's prefill time: attention, norms and every other node are left out.

Three bounds:
- graph: each linear in the form the graph has.
- fp32: each linear as a plain fp32 MatMul (MLAS SGEMM, the ceiling of any form that dequantizes first, at 4
  bytes a weight); the block-bias MatMuls are dropped (dequantized weights hold their mins).
- best: each linear in the faster of its graph form and fp32, block-bias MatMuls dropped. No graph of these
  weights on these kernels prefills faster than this, whatever form it gives each linear.

llama.cpp and the graph prefill the same prompt in the same run (first prompt after load, then the best of 2
warm ones). A best bound under 2x llama.cpp's first prompt means #14's 2x prefill is out of reach here.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import platform
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import llama_cpp
import numpy as np
import onnx
import onnxruntime as ort
from matmulnbits_kernels import linear_session
from onnx import helper
from results_io import write_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edge.devices.registry import DecoderOptions, open_decoder  # noqa: E402
from edge.graph_opt._rules import ROLE_KEY  # noqa: E402
from edge.models.resolve import resolve_model  # noqa: E402

PROTO_LIMIT = 2**31 - 2**24  # an fp32 weight must fit one protobuf message (2 GiB), with room for the rest


class Form(NamedTuple):
    k: int
    n: int
    bits: int  # 0: an fp32 MatMul
    block: int
    level: int
    bias: bool  # the K-quants' block-bias MatMul (gone where weights are dequantized first)

    def name(self) -> str:
        if self.bits:
            return f"{self.bits}-bit/{self.block} level {self.level}"
        return "fp32 MatMul (block bias)" if self.bias else "fp32 MatMul"


class Prefill(NamedTuple):
    first: float  # tok/s, the first prompt after load
    warm: float  # tok/s, the best of 2 more
    chunk: int
    graph: Path | None


def graph_forms(path: Path) -> tuple[collections.Counter[Form], Form]:
    """The weight-bearing nodes of a graph counted by form, less the head, and the head's form (the node that
    writes "logits"). A node this script cannot time as it runs (zero points or a bias on a MatMulNBits, a
    constant-weight MatMul that no linear layer emitted) stops it: a bound that left it out would be wrong."""
    model = onnx.load(str(path), load_external_data=False)
    consts = {t.name: list(t.dims) for t in model.graph.initializer}
    forms: collections.Counter[Form] = collections.Counter()
    head: Form | None = None
    for node in model.graph.node:
        role = next((p.value for p in node.metadata_props if p.key == ROLE_KEY), None)
        if node.op_type == "MatMulNBits":
            if len([i for i in node.input if i]) != 3:
                raise SystemExit(
                    f"{path}: {node.name} has zero points, g_idx or a bias; only A, B, scales are timed"
                )
            a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
            form = Form(a["K"], a["N"], a["bits"], a["block_size"], a.get("accuracy_level", 0), False)
        elif node.op_type == "MatMul" and len(consts.get(node.input[1], [])) == 2:
            if role not in ("weight", "bias"):
                raise SystemExit(
                    f"{path}: {node.name} multiplies by a constant but is not part of a linear layer"
                )
            form = Form(*consts[node.input[1]], 0, 0, 0, role == "bias")
        else:
            continue
        if "logits" in node.output:
            head = form
        else:
            forms[form] += 1
    if head is None:
        raise SystemExit(f"{path}: no linear writes the graph's logits; the head could not be told apart")
    return forms, head


def kernel_seconds(form: Form, rows: int, fp32: bool, runs: int = 5) -> float:
    """Least one-thread CPU time of one run of this form (fp32: as an fp32 MatMul) at `rows` rows."""
    sess = linear_session(form.k, form.n, 0 if fp32 else form.bits, form.block, form.level)
    a = np.random.default_rng(1).standard_normal((1, rows, form.k), dtype=np.float32)
    sess.run(None, {"A": a})
    best = float("inf")
    for _ in range(runs):
        c0 = time.process_time()
        sess.run(None, {"A": a})
        best = min(best, time.process_time() - c0)
    return best


def prefill(backend: str, model: str, prompt: list[int], threads: int) -> Prefill:
    opts = DecoderOptions(n_ctx=len(prompt) + 64, n_threads=threads, precision="fast")
    dec = open_decoder(backend, resolve_model(model), "cpu", opts)
    try:
        chunk, graph = int(getattr(dec, "chunk", len(prompt))), getattr(dec, "graph_path", None)
        times = []
        for _ in range(3):
            dec.reset()
            t0 = time.perf_counter()
            dec.forward(prompt, last_only=True)
            times.append(time.perf_counter() - t0)
    finally:
        dec.close()
    return Prefill(len(prompt) / times[0], len(prompt) / min(times[1:]), chunk, graph)


def _row(name: str, form: Form, count: int, graph_s: float, fp32_s: float) -> dict[str, Any]:
    return {
        "form": name,
        "k": form.k,
        "n": form.n,
        "count": count,
        "ms": 1e3 * graph_s,
        "fp32_ms": 1e3 * fp32_s,
    }


def bound(model: str, args: argparse.Namespace) -> dict[str, Any]:
    prompt = [100 + (i * 7919) % 20000 for i in range(args.prompt)]
    own = prefill("ort", model, prompt, args.threads)
    if own.graph is None:
        raise SystemExit(f"{model}: the ORT decoder has no graph file to read the linears from")
    forms, head = graph_forms(own.graph)
    llama = prefill("llamacpp", model, prompt, args.threads)
    chunks = collections.Counter(min(own.chunk, args.prompt - i) for i in range(0, args.prompt, own.chunk))
    total = {"graph": 0.0, "fp32": 0.0, "best": 0.0}
    rows: list[dict[str, Any]] = []
    for form, count in sorted(forms.items(), key=lambda f: -f[0].k * f[0].n * f[1]):
        # every chunk of one size costs alike: time each size once, weight it by how often it occurs
        graph_s = sum(kernel_seconds(form, m, False) * c for m, c in chunks.items())
        fp32_s = (
            graph_s if not form.bits else sum(kernel_seconds(form, m, True) * c for m, c in chunks.items())
        )
        if form.bias:  # dequantized weights hold their mins: no block-bias term in the fp32 and best bounds
            fp32_s = 0.0
        for kind, s in (("graph", graph_s), ("fp32", fp32_s), ("best", min(graph_s, fp32_s))):
            total[kind] += count * s
        rows.append(_row(form.name(), form, count, graph_s, fp32_s))
    head_s = kernel_seconds(head, 1, False)
    fits = head.bits and head.k * head.n * 4 < PROTO_LIMIT  # else: fp32 already, or too large to time as fp32
    head_fp32 = kernel_seconds(head, 1, True) if fits else head_s
    for kind, s in (("graph", head_s), ("fp32", head_fp32), ("best", min(head_s, head_fp32))):
        total[kind] += s
    rows.append(_row(f"head: {head.name()}", head, 1, head_s, head_fp32))
    return {
        "chunk": own.chunk,
        "llamacpp": {"first": llama.first, "warm": llama.warm},
        "ort": {"first": own.first, "warm": own.warm},
        "bound_tok_s": {kind: args.prompt / (s / args.threads) for kind, s in total.items()},
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
    machine = {
        "cpu": platform.processor() or platform.machine(),
        "onnxruntime": ort.__version__,
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode(),
    }
    lines = [
        f"# Prefill bound of the own ORT graph on ONNX Runtime {ort.__version__}'s kernels ({day})",
        "",
        f"`python benchmarks/prefill_bound.py {' '.join(args.models)} --prompt {args.prompt} "
        f"--threads {args.threads}`: a {args.prompt}-token prompt, {args.threads} threads, `--precision fast`; "
        f"llama.cpp: {machine['llama_cpp_system_info'].strip()}. Bounds (see the script's docstring): the "
        "graph's weight-bearing nodes alone, each timed on one thread (least CPU time of 5 runs), summed over "
        "the chunks and divided by the threads (all other nodes free, perfect scaling), plus the head on the "
        "prompt's last row; graph = each linear in its graph form, fp32 = each as fp32 SGEMM (block-bias terms "
        "dropped), best = the faster of the two for each linear.",
        "",
        "| model | chunk | llama.cpp first / warm tok/s | ORT graph first / warm | bound: graph | fp32 | best | "
        "best x llama.cpp first |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, r in runs.items():
        lf, b = r["llamacpp"]["first"], r["bound_tok_s"]
        lines.append(
            f"| {m} | {r['chunk']} | {lf:.0f} / {r['llamacpp']['warm']:.0f} | {r['ort']['first']:.0f} / "
            f"{r['ort']['warm']:.0f} | {b['graph']:.0f} ({b['graph'] / lf:.2f}x) | {b['fp32']:.0f} "
            f"({b['fp32'] / lf:.2f}x) | {b['best']:.0f} | **{b['best'] / lf:.2f}x** |"
        )
    for m, r in runs.items():
        lines += ["", f"## {m}: one node of each form over the whole prompt, one thread", ""]
        lines += ["| form | K x N | nodes | ms a node | as fp32, ms a node |", "|---|---|---|---|---|"]
        for f in r["forms"]:
            lines.append(
                f"| {f['form']} | {f['k']} x {f['n']} | {f['count']} | {f['ms']:.1f} | {f['fp32_ms']:.1f} |"
            )
    stem = ROOT / "benchmarks" / "results" / f"prefill-bound-{day}{args.tag}"
    write_results(stem, {"args": vars(args), "machine": machine, "runs": runs}, lines)


if __name__ == "__main__":
    main()
