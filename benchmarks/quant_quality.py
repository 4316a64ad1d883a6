"""How much edge's weight quantization costs, against llama.cpp's quantizer on the same float model.

The catalog models are quantized GGUFs; re-quantizing them says little (a 4-bit block comes back onto a 4-bit
grid). So a llama / qwen2 catalog model is written as an F32 GGUF with its residual stream rotated
(tests/rotated_model.py: the same function, every weight off any grid), and quantized two ways:
- edge: `edge convert --quant int8 | int4 [policy]` (INT8 per channel, INT4 g32 asym with GPTQ and the
  sensitivity policy);
- llama.cpp: llama_model_quantize (llama-cpp-python) to Q8_0, Q4_0, Q4_1 (also with the embedding and head at
  Q8_0, as edge's policy keeps them), Q4_K_M, then imported as they are.
Every variant runs on ONNX Runtime with fp32 activations (the weights' cost alone, not llama.cpp's activation
rounding) and is scored against the F32 graph by teacher forcing over the eval text (`edge eval` with an
artifact as reference): mean KL, top-1 agreement, perplexity. Size (MiB): llama.cpp's GGUF file, edge's
artifact (graph, weights, embedding table).

    python -m benchmarks.quant_quality [--model smollm2-135m] [--tokens 512] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from edge.evaluate import EvalConfig, evaluate
from edge.graph_opt import QuantSpec
from edge.models.convert import ConvertOptions, convert
from edge.models.resolve import resolve_model
from tests.rotated_model import llamacpp_quantize, write_rotated_f32

ROOT = Path(__file__).resolve().parents[1]

# (ftype, embedding and head at Q8_0 as edge's INT4 policy keeps them at INT8); otherwise llama.cpp's defaults
LLAMACPP = (("Q8_0", False), ("Q4_0", False), ("Q4_1", False), ("Q4_1", True), ("Q4_K_M", False))
EDGE = {
    "int8": QuantSpec("int8"),
    "int4 (head INT8, 10% layers INT8)": QuantSpec("int4"),
    "int4 (head INT8, all layers INT4)": QuantSpec("int4", sensitive_layers=0),
    "int4 (KL budget 0.02)": QuantSpec("int4", kl_budget=0.02),
}


def weight_mib(artifact: Path) -> float:
    """The artifact's weights: graph files, weight files and the embedding table (not metadata)."""
    skip = ("manifest.json", "metadata.gguf")
    return sum(p.stat().st_size for p in artifact.rglob("*") if p.is_file() and p.name not in skip) / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--work", type=Path, default=None, help="keep intermediate files here")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="edge-quant-"))
    work.mkdir(parents=True, exist_ok=True)
    src = resolve_model(args.model)
    f32 = work / "rotated-f32.gguf"
    if not f32.exists():
        write_rotated_f32(src, f32)
    exact = ConvertOptions(target="ort", accuracy_level=0)
    ref = convert(f32, work / "f32", exact, source_name=f"{args.model}-rotated-f32").path
    variants: list[tuple[str, str, Path, float]] = []
    sizes: dict[Path, float] = {}  # MiB as shipped: llama.cpp's GGUF, edge's artifact
    for ftype, q8 in LLAMACPP:
        t0 = time.perf_counter()
        tag = ftype + ("-q8" if q8 else "")
        gguf_q = llamacpp_quantize(f32, work / f"llamacpp-{tag}.gguf", ftype, embed_head_q8=q8)
        art = convert(gguf_q, work / f"llamacpp-{tag}", exact, source_name=tag).path
        name = ftype + (" (embd, head Q8_0)" if q8 else "")
        variants.append(("llama.cpp", name, art, time.perf_counter() - t0))
        sizes[art] = gguf_q.stat().st_size / 2**20  # the GGUF (imported, 5-bit types widen to 8-bit)
    for name, spec in EDGE.items():
        t0 = time.perf_counter()
        opts = ConvertOptions(target="ort", accuracy_level=0, quant=spec)
        art = convert(f32, work / f"edge-{spec.mode}-{len(variants)}", opts, source_name=name).path
        variants.append(("edge", name, art, time.perf_counter() - t0))
    rows = []
    print(
        f"{args.model}, residual stream rotated to F32; {args.tokens} tokens of edge/data/eval.txt, ORT fp32"
    )
    print(f"{'quantizer':10} {'variant':36} {'MiB':>6} {'KL':>8} {'top-1':>7} {'ppl':>8} {'convert s':>9}")
    f32_ppl = 0.0
    for who, name, art, secs in variants:
        m = evaluate(
            str(art), EvalConfig(backend="ort", reference=str(ref), tokens=args.tokens, threads=2)
        ).metrics
        if not rows:  # every evaluation scores the F32 graph as its reference: its row once, from the first
            f32_ppl = m.ppl_ref
            print(f"{'-':10} {'F32':36} {weight_mib(ref):6.1f} {0:8.4f} {100:6.1f}% {f32_ppl:8.3f}")
        row = {
            "quantizer": who,
            "variant": name,
            "mib": round(sizes.get(art) or weight_mib(art), 1),
            "kl_mean": m.kl_mean,
            "top1": m.top1_agree,
            "ppl": m.ppl,
            "convert_s": round(secs, 1),
        }
        rows.append(row)
        print(
            f"{who:10} {name:36} {row['mib']:6.1f} {m.kl_mean:8.4f} {100 * m.top1_agree:6.1f}% "
            f"{m.ppl:8.3f} {secs:9.1f}"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "model": args.model,
                    "tokens": args.tokens,
                    "f32_ppl": f32_ppl,
                    "rows": rows,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
