"""Which part of the --precision fast graph costs fidelity: KL of graph variants to the exact graph, on the
decode path, and what each variant's decode step costs.

    python benchmarks/fidelity_variants.py                               # smollm2-135m, the default variants
    python benchmarks/fidelity_variants.py --variants fast head0 --timing 0
    python benchmarks/fidelity_variants.py --models gemma3-270m --variants fast --llamacpp

Fidelity is what `edge eval M --backend ort --reference ort --reference-precision exact --test-chunk 1
--tokens 512` measures: the reference is ORT's exact graph, batched in 128-token chunks; each variant is fed
one token per forward. A variant is GraphOptions overrides plus, optionally, accuracy levels set per linear on
the built graph (a name filter -> level; 8-bit weights at level 0 as ORT's exact two-nibble form).
Timing: per round and variant, a --context token prompt then 48 one-token decode steps (ms each), the variants
in rotating order, ORT threads not spinning between runs; medians over --timing rounds, ratios to "fast".
Writes benchmarks/results/fidelity-<models>-<date>.json and .md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edge.data import read_text  # noqa: E402
from edge.devices import runners  # noqa: E402
from edge.devices.graph_decoder import GraphDecoder, GraphOptions  # noqa: E402
from edge.devices.registry import graph_runner  # noqa: E402
from edge.devices.runners import RunnerOptions  # noqa: E402
from edge.evaluate import text_ids  # noqa: E402
from edge.graph_opt.linear import BlockWeight, emit_linear, linears_in  # noqa: E402
from edge.metrics import compare_rows, summarize  # noqa: E402
from edge.models.catalog import CATALOG  # noqa: E402
from edge.models.gguf_file import GGUFFile, open_gguf  # noqa: E402
from edge.models.pull import pull  # noqa: E402
from edge.models.tokenizer import load_tokenizer  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
CHUNK = 128  # the reference's forward, as `edge eval` does


@dataclass(frozen=True)
class Variant:
    doc: str
    options: dict[str, Any] = field(default_factory=dict)  # GraphOptions overrides of the fast graph's
    levels: dict[str, int] = field(default_factory=dict)  # regex on linear names -> MatMulNBits level
    ov_group: int | None = None  # OpenVINO's DYNAMIC_QUANTIZATION_GROUP_SIZE (None: edge's)
    blocks: dict[str, int] = field(default_factory=dict)  # regex on linear names -> smaller block size


_LAYERS = "blk\\.({})\\."
_QKV = r"\.attn_(q|k|v|qkv)(\.weight|_fused)$"
VARIANTS: dict[str, Variant] = {
    "fast": Variant("the current fast graph"),
    "qkv32": Variant(
        "Q/K/V in 32-element blocks (ORT's fast graph before fine_qkv_blocks)", blocks={_QKV: 32}
    ),
    "dq32": Variant("OpenVINO: DYNAMIC_QUANTIZATION_GROUP_SIZE 32 (before)", ov_group=32),
    "head0": Variant("lm_head at level 0 (fp32 activations)", {"head_accuracy_level": 0}),
    "body0": Variant(
        "every layer linear at level 0, head at 4", {"accuracy_level": 0, "head_accuracy_level": 4}
    ),
    "all0": Variant(
        "every linear at level 0 (what else fast changes: staging, centred codes)", {"accuracy_level": 0}
    ),
    "unstaged": Variant("unstaged attention", {"staged": False}),
    "attn0": Variant("attention linears (q k v o) at level 0", levels={r"\.attn_": 0}),
    "ffn0": Variant("FFN linears (gate up down) at level 0", levels={r"\.ffn_": 0}),
    "down0": Variant("ffn_down at level 0", levels={r"\.ffn_down\.": 0}),
    "gateup0": Variant("ffn_gate and ffn_up at level 0", levels={r"\.ffn_gate": 0}),
    "qkv0": Variant("attn q k v at level 0", levels={r"\.attn_q": 0}),
    "o0": Variant("attn_output at level 0", levels={r"\.attn_output\.": 0}),
    "body16": Variant("layer linears in 16-element blocks (x quantized per 16)", blocks={r"^blk\.": 16}),
    "head16": Variant("lm_head in 16-element blocks", blocks={r"^(output|token_embd)": 16}),
    "qkv16": Variant("attn q k v in 16-element blocks", blocks={r"\.attn_q": 16}),
    "o16": Variant("attn_output in 16-element blocks", blocks={r"\.attn_output\.": 16}),
    "gateup16": Variant("ffn_gate and ffn_up in 16-element blocks", blocks={r"\.ffn_gate": 16}),
    "down16": Variant("ffn_down in 16-element blocks", blocks={r"\.ffn_down\.": 16}),
    "qkv16head16": Variant(
        "attn q k v and lm_head in 16-element blocks", blocks={r"\.attn_q": 16, r"^(output|token_embd)": 16}
    ),
    "dq16": Variant(
        "OpenVINO: activations quantized per 16 (DYNAMIC_QUANTIZATION_GROUP_SIZE 16)", ov_group=16
    ),
    "all16": Variant("every linear in 16-element blocks", blocks={".": 16}),
    "first0": Variant("layers 0-3 at level 0", levels={_LAYERS.format("0|1|2|3"): 0}),
    "last0": Variant("the last 4 layers at level 0", levels={"LAST4": 0}),
}


def combine(v: Variant, base: Variant) -> Variant:
    """`v` on top of `base`'s changes (v's own win where both set one)."""
    return Variant(
        v.doc,
        {**base.options, **v.options},
        {**v.levels, **base.levels} | v.levels,
        v.ov_group if v.ov_group is not None else base.ov_group,
        {**v.blocks, **base.blocks} | v.blocks,
    )


def _last_layers(gguf: GGUFFile, n: int) -> str:
    count = 1 + max(int(m.group(1)) for t in gguf.tensors if (m := re.match(r"blk\.(\d+)\.", t)))
    return _LAYERS.format("|".join(str(i) for i in range(count - n, count)))


def _resize(w: BlockWeight, size: int) -> BlockWeight:
    """`w` in blocks of `size`: split, or merged where the blocks merged have equal scales, zero points, bias."""
    if size <= w.block_size:
        return w.split_blocks(size)
    r = size // w.block_size

    def take(a: np.ndarray | None) -> np.ndarray | None:
        if a is None:
            return None
        if not np.array_equal(np.repeat(a[:, ::r], r, axis=1), a):
            raise SystemExit(f"blocks of {w.block_size} do not merge into {size}")
        return np.ascontiguousarray(a[:, ::r])

    return replace(
        w, block_size=size, scales=take(w.scales), zero_points=take(w.zero_points), bias=take(w.bias)
    )


def _relevel(dec: GraphDecoder, levels: dict[str, int], blocks: dict[str, int], work: Path) -> None:
    """Rewrite the decoder's graph with the levels and block sizes asked, and run it instead (same runner
    options)."""
    import onnx_ir as ir

    model = ir.load(str(dec.graph_path))
    changed = 0
    for lin in linears_in(model):
        level = next((v for k, v in levels.items() if re.search(k, lin.name)), None)
        size = next((v for k, v in blocks.items() if re.search(k, lin.name)), None)
        w = lin.weight
        if not isinstance(w, BlockWeight) or (level in (None, lin.accuracy_level) and size is None):
            continue
        if size is not None and size > w.block_size and w.bits != 4:
            size = None  # merging undoes fine_qkv_blocks (4-bit only); Q6_K's own 16-blocks stay
        if level in (None, lin.accuracy_level) and size is None:
            continue
        level = lin.accuracy_level if level is None else level
        new = w if size is None else _resize(w, size)
        nibbles = lin.form == "nibbles" or (w.bits == 8 and level == 0)
        emit_linear(model, lin, new, lowering="nibbles" if nibbles else "nbits", accuracy_level=level)
        changed += 1
    if not changed:
        raise SystemExit(f"no linear matched {levels} {blocks}")
    out = work / f"g{len(list(work.iterdir()))}"
    out.mkdir()
    ir.save(model, str(out / "model.onnx"), external_data="model.onnx.data")
    o = dec.options
    dec.runner.close()
    dec.runner = graph_runner(o.backend)(
        out / "model.onnx", RunnerOptions(o.device, o.threads, o.precision, out, o.spin)
    )


def open_variant(gguf: GGUFFile, backend: str, v: Variant, capacity: int, work: Path) -> GraphDecoder:
    levels = {(_last_layers(gguf, 4) if k == "LAST4" else k): x for k, x in v.levels.items()}
    saved = runners.OV_DQ_GROUP
    if v.ov_group is not None:
        runners.OV_DQ_GROUP = v.ov_group  # read when the OpenVINO runner compiles
    try:
        opts = GraphOptions(backend=backend, precision="fast", capacity=capacity, threads=2, spin=False)
        dec = GraphDecoder(gguf, replace(opts, **v.options))
        if levels or v.blocks:
            _relevel(dec, levels, v.blocks, work)
    finally:
        runners.OV_DQ_GROUP = saved
    return dec


def reference_blocks(gguf: GGUFFile, backend: str, ids: list[int], capacity: int) -> list[np.ndarray]:
    ref = GraphDecoder(gguf, GraphOptions(backend=backend, precision="exact", capacity=capacity, threads=2))
    try:
        return [ref.forward(ids[s : min(s + CHUNK, len(ids) - 1)]) for s in range(0, len(ids) - 1, CHUNK)]
    finally:
        ref.close()


def fidelity(
    forward: Callable[[list[int]], np.ndarray], ids: list[int], refs: list[np.ndarray]
) -> dict[str, float]:
    rows = []
    for b, s in enumerate(range(0, len(ids) - 1, CHUNK)):
        block = ids[s : min(s + CHUNK, len(ids) - 1)]
        test = np.concatenate([forward([t]) for t in block])
        rows.append(compare_rows(refs[b], test, np.array(ids[s + 1 : s + 1 + len(block)])))
    m = summarize(rows)
    return {"kl_mean": m.kl_mean, "kl_p99": m.kl_p99, "top1": m.top1_agree}


def llamacpp_fidelity(path: Path, ids: list[int], refs: list[np.ndarray], capacity: int) -> dict[str, float]:
    from edge.devices.llamacpp import LlamaCppDecoder, LlamaCppOptions

    dec = LlamaCppDecoder(path, LlamaCppOptions(n_ctx=capacity, n_threads=2))
    try:
        dec.reset()
        return fidelity(dec.forward, ids, refs)
    finally:
        dec.close()


def step_ms(dec: GraphDecoder, prompt: list[int], token: int) -> tuple[float, float]:
    """(prefill of the prompt, one decode step after it), in ms."""
    dec.reset()
    t = time.perf_counter()
    dec.forward(prompt, last_only=True)
    prefill = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    for _ in range(48):
        dec.forward([token])
    return prefill, (time.perf_counter() - t) / 48 * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m"])
    ap.add_argument("--backend", default="ort")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--timing", type=int, default=5, help="timed rounds (0: fidelity only)")
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--llamacpp", action="store_true", help="also llama.cpp's KL to the same reference")
    ap.add_argument(
        "--on",
        choices=list(VARIANTS),
        help="every variant on top of this one (--on qkv32: the ORT graph before fine_qkv_blocks)",
    )
    ap.add_argument("--baseline", default="fast", help="the variant the timings are ratios to")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    loads = [os.getloadavg()[0]]
    work = Path(tempfile.mkdtemp(prefix="edge-fidelity-"))
    try:
        for model in args.models:
            path = pull(CATALOG[model]) if model in CATALOG else Path(model)
            gguf = open_gguf(path)
            ids = text_ids(load_tokenizer(gguf.metadata), read_text(None), args.tokens)
            refs = reference_blocks(gguf, args.backend, ids, len(ids))
            if args.llamacpp:
                got = llamacpp_fidelity(path, ids, refs, len(ids))
                rows.append({"model": model, "variant": "llama.cpp", "doc": "llama.cpp decode path", **got})
                print(rows[-1], flush=True)
            decs = {}
            for name in args.variants:
                v = VARIANTS[name] if args.on is None else combine(VARIANTS[name], VARIANTS[args.on])
                dec = open_variant(gguf, args.backend, v, len(ids), work)
                dec.reset()
                got = fidelity(dec.forward, ids, refs)
                rows.append(
                    {
                        "model": model,
                        "variant": name,
                        "backend": args.backend,
                        "doc": VARIANTS[name].doc,
                        **got,
                    }
                )
                print(rows[-1], flush=True)
                if args.timing:
                    decs[name] = dec
                else:
                    dec.close()
            if decs:
                prompt = ids[: args.context]
                times: dict[str, list[tuple[float, float]]] = {n: [] for n in decs}
                names = list(decs)
                for r in range(args.timing):
                    for n in names[r % len(names) :] + names[: r % len(names)]:
                        times[n].append(step_ms(decs[n], prompt, ids[args.context]))
                med = {
                    n: (statistics.median(p for p, _ in t), statistics.median(d for _, d in t))
                    for n, t in times.items()
                }
                base = med.get(args.baseline, med[names[0]])
                for row in rows:
                    if row["model"] == model and row["variant"] in med:
                        prefill, step = med[row["variant"]]
                        row["step_ms"], row["step_ratio"] = round(step, 3), round(step / base[1], 3)
                        row["prefill_ms"], row["prefill_ratio"] = (
                            round(prefill, 2),
                            round(prefill / base[0], 3),
                        )
                for d in decs.values():
                    d.close()
            loads.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write(rows, args, loads)


def write(rows: list[dict[str, Any]], args: argparse.Namespace, loads: list[float]) -> None:
    day = dt.date.today().isoformat()
    stem = RESULTS / f"fidelity-variants-{'-'.join(args.models)}-{args.backend}{args.tag}-{day}"
    stem.with_name(stem.name + ".json").write_text(
        json.dumps({"rows": rows, "load_avg_1min": loads}, indent=1)
    )
    cmd = " ".join(sys.argv[1:])
    lines = [
        f"`python benchmarks/fidelity_variants.py {cmd}`: KL to the exact {args.backend} graph on the decode path "
        f"({args.tokens} tokens of eval.txt); a {args.context}-token prefill and a decode step after it (2 threads, "
        f"medians of {args.timing} rotating rounds). Load average 1 min: {' -> '.join(f'{x:.2f}' for x in loads)}.",
        "",
        f"| model | variant | what | KL mean | KL p99 | top-1 | decode step ms | x {args.baseline} | "
        f"prefill ms | x {args.baseline} |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {r['model']} | {r['variant']} | {r['doc']} | {r['kl_mean']:.5f} | {r['kl_p99']:.4f} | "
            f"{100 * r['top1']:.1f}% | {r.get('step_ms', '-')} | {r.get('step_ratio', '-')} | "
            f"{r.get('prefill_ms', '-')} | {r.get('prefill_ratio', '-')} |"
            for r in rows
        ),
    ]
    stem.with_name(stem.name + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
