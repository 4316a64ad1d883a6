"""Bytes of weights a decode step reads: the own ORT graph (`--precision fast`) against the GGUF file.

    python -m benchmarks.weight_bytes qwen2.5-coder-1.5b smollm2-135m

A one-token decode step reads every linear weight once, so on a CPU that decodes at its memory bandwidth (as
llama.cpp and edge's own graphs both do here: `benchmarks/results/fast-graphs-*.md` against the probe in
`edge devices --probe`) the decode rate is bandwidth / bytes. This counts each initializer of the graph's
MatMulNBits / MatMul nodes by role (codes, scales, zero points, the block-bias term) and the GGUF's tensors
that a step reads (all but a token embedding that is only gathered: with tied embeddings it is the head and
read in full), and prints the ratio: the decode speed the graph can reach relative to llama.cpp at equal
bandwidth. Writes benchmarks/results/weight-bytes-<date>.md.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
from pathlib import Path

import onnx
from gguf import GGMLQuantizationType
from onnx import helper

from edge.devices.graph_decoder import GraphDecoder, GraphOptions
from edge.models.gguf_file import open_gguf
from edge.models.resolve import resolve_model

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"
ELEMENT_BYTES = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.UINT8: 1, onnx.TensorProto.FLOAT16: 2}
ROLES = {"MatMulNBits": ("input", "codes", "scales", "zero points"), "MatMul": ("input", "float matrix")}


def graph_bytes(model_path: Path) -> collections.Counter[str]:
    m = onnx.load(str(model_path), load_external_data=False)
    size = {}
    for t in m.graph.initializer:
        n = 1
        for d in t.dims:
            n *= d
        size[t.name] = n * ELEMENT_BYTES.get(t.data_type, 4)
    out: collections.Counter[str] = collections.Counter()
    for node in m.graph.node:
        roles = ROLES.get(node.op_type)
        if roles is None:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        for i, name in enumerate(node.input):
            if name in size and i < len(roles):
                form = (
                    f"{attrs['bits']}-bit block {attrs['block_size']}"
                    if node.op_type == "MatMulNBits"
                    else ""
                )
                role = roles[i] if node.op_type == "MatMulNBits" else "block-bias term (fp32 MatMul)"
                out[f"{form} {role}".strip()] += size.pop(name)
    return out


def gguf_bytes(path: Path) -> tuple[int, collections.Counter[str]]:
    gguf = open_gguf(path)
    tied = "output.weight" not in gguf.tensors
    by_type: collections.Counter[str] = collections.Counter()
    for name, t in gguf.tensors.items():
        if name == "token_embd.weight" and not tied:
            continue  # only gathered, a row per token
        if len(t.shape) >= 2:  # norms and biases are read too, but are tiny and fp32 on both sides
            by_type[GGMLQuantizationType(t.ggml_type).name] += t.nbytes
    return sum(by_type.values()), by_type


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    args = ap.parse_args()
    lines = [f"# Weight bytes a decode step reads ({dt.date.today().isoformat()})", "",
             f"`python -m benchmarks.weight_bytes {' '.join(args.models)}`", ""]  # fmt: skip
    for model in args.models:
        path = resolve_model(model)
        dec = GraphDecoder(open_gguf(path), GraphOptions(backend="ort", capacity=256, precision="fast"))
        try:
            graph = graph_bytes(dec.graph_path)
        finally:
            dec.close()
        total_gguf, by_type = gguf_bytes(path)
        total_graph = sum(graph.values())
        lines += [f"## {model}", "", "| GGUF type | MB |", "|---|---|"]
        lines += [f"| {k} | {v / 1e6:.1f} |" for k, v in by_type.most_common()]
        lines += [
            f"| **total** | **{total_gguf / 1e6:.1f}** |",
            "",
            "| own ORT graph (fast) | MB |",
            "|---|---|",
        ]
        lines += [f"| {k} | {v / 1e6:.1f} |" for k, v in graph.most_common()]
        lines += [
            f"| **total** | **{total_graph / 1e6:.1f}** |",
            "",
            f"Graph / GGUF bytes: {total_graph / total_gguf:.3f}; at equal bandwidth the own graph decodes at "
            f"most {total_gguf / total_graph:.2f}x llama.cpp.",
            "",
        ]
    text = "\n".join(lines)
    (RESULTS / f"weight-bytes-{dt.date.today().isoformat()}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
