"""Who is closer to the exact math: edge's graph or llama.cpp? Both against a float64 numpy forward.

    python -m benchmarks.exactness                  # smollm2-135m, gemma3-270m, qwen2.5-coder-0.5b
    python -m benchmarks.exactness --models smollm2-135m --tokens 128

The reference (tests/numpy_reference.py) dequantizes every GGUF weight with gguf-py and runs the decoder in
float64, teacher-forced over the same token sequence (three chat prompts and llama.cpp's greedy answers).
Reports per engine the mean KL(fp64 || engine), top-1 agreement and the largest logit difference. Writes
benchmarks/results/exactness-<date>.json and .md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

import numpy as np

import tests.numpy_reference as reference
from benchmarks.greedy_agreement import PROMPTS, greedy
from edge.api import load
from edge.devices.registry import DecoderOptions, open_decoder

ROOT = Path(__file__).resolve().parents[1]


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m,qwen2.5-coder-0.5b")
    ap.add_argument("--backends", default="ort,openvino")
    ap.add_argument("--tokens", type=int, default=192)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    rows = []
    for name in args.models.split(","):
        with load(name, backend="llamacpp", n_ctx=1024) as m:
            seq: list[int] = []
            for prompt in PROMPTS[:3]:
                ids = m.prompt_ids(prompt)
                seq += ids + greedy(m.decoder, ids, 48)
            seq = seq[: args.tokens]
            m.decoder.reset()
            engines = {"llamacpp": m.decoder.forward(seq).astype(np.float64)}
            path = m.path
        for backend in args.backends.split(","):
            dec = open_decoder(backend, path, "cpu", DecoderOptions(n_ctx=1024))
            engines[backend] = dec.forward(seq).astype(np.float64)
            dec.close()
        exact = reference.forward(reference.load(path), seq)
        lp = log_softmax(exact)
        p = np.exp(lp)
        for engine, logits in engines.items():
            kl = (p * (lp - log_softmax(logits))).sum(-1)
            row = {
                "model": name,
                "engine": engine,
                "tokens": len(seq),
                "kl_mean": float(kl.mean()),
                "kl_max": float(kl.max()),
                "top1_agree": float((logits.argmax(-1) == exact.argmax(-1)).mean()),
                "max_abs_dlogit": float(np.abs(logits - exact).max()),
            }
            rows.append(row)
            print(
                f"{name:20} {engine:9} KL {row['kl_mean']:.6f} (max {row['kl_max']:.5f})  top-1 "
                f"{row['top1_agree']:.3f}  max|dlogit| {row['max_abs_dlogit']:.4f}",
                flush=True,
            )
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"exactness-{dt.date.today().isoformat()}"
    stem.with_suffix(".json").write_text(json.dumps({"rows": rows}, indent=1))
    lines = [
        "| model | engine | KL mean vs fp64 | top-1 vs fp64 | max abs logit diff |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['model']} | {r['engine']} | {r['kl_mean']:.6f} | {r['top1_agree']:.3f} | {r['max_abs_dlogit']:.4f} |"
        for r in rows
    ]
    stem.with_suffix(".md").write_text(
        "Engines vs a float64 numpy forward of the same GGUF (`python -m benchmarks.exactness`)\n\n"
        + "\n".join(lines)
        + "\n"
    )


if __name__ == "__main__":
    main()
