"""Peak RSS and time of building edge's own graph for a GGUF, alone (no runner opened), in a fresh graph cache.

    python benchmarks/build_memory.py MODEL.gguf [--backend ort|openvino] [--precision fast|exact]
    python benchmarks/build_memory.py MODEL.gguf --synthetic-7b   # first writes a Qwen2-7B-shaped file there

The build runs in this process with EDGE_CACHE_DIR pointed at a temporary folder (the model file stays where it
is); a thread samples the RSS every 20 ms; each build step (devices/graph_decoder.ensure_graph's progress) is
printed with the RSS at that moment and the peak so far. The peak is compared with the file's size + 1 GiB
(issue 30's bound). `--synthetic-7b` writes a qwen2 GGUF with Qwen2-7B's shapes (hidden 3584, 28 layers, ffn
18944, 28 heads / 4 KV heads; `--vocab` rows, reduced from 152064 to keep it practical) and random Q4_0 codes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

GIB = 1 << 30


def _rss_split() -> str:
    """Anonymous and file-backed resident memory (Linux /proc), the two parts of the RSS."""
    try:
        fields = dict(
            line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line
        )
        anon, file = (int(fields[k].split()[0]) << 10 for k in ("RssAnon", "RssFile"))
    except (OSError, KeyError, ValueError):
        return ""
    return f" (anon {anon / GIB:.2f}, file {file / GIB:.2f})"


class _Sampler:
    def __init__(self, every_s: float = 0.02) -> None:
        self.proc = psutil.Process()
        self.peak = 0
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.every_s)

    def now(self) -> int:
        rss = self.proc.memory_info().rss
        self.peak = max(self.peak, rss)
        return rss

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def write_synthetic_7b(path: Path, vocab: int, seed: int = 0) -> Path:
    """A qwen2 GGUF with Qwen2-7B's shapes and random Q4_0 codes (scales kept small so activations stay finite),
    written tensor by tensor (the writer holds one tensor's bytes at a time)."""
    import gguf

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tiny_models import _vocab  # the tiny models' SentencePiece-style vocabulary, any size

    d, n_layer, ff, h, kvh = 3584, 28, 18944, 28, 4
    hd = d // h
    rng = np.random.default_rng(seed)
    q4 = gguf.GGMLQuantizationType.Q4_0
    f32 = gguf.GGMLQuantizationType.F32

    def q4_0(rows: int, cols: int) -> np.ndarray:  # [rows, cols/32 blocks of 18 bytes]
        blocks = np.empty((rows, cols // 32, 18), np.uint8)
        scale = np.full((rows, cols // 32), 0.02 / np.sqrt(cols / 1024), np.float16)
        blocks[..., :2] = scale.view(np.uint8).reshape(rows, cols // 32, 2)
        blocks[..., 2:] = rng.integers(0, 256, (rows, cols // 32, 16), dtype=np.uint8)
        return blocks.reshape(rows, -1)

    shapes: list[tuple[str, tuple[int, ...], gguf.GGMLQuantizationType]] = [
        ("token_embd.weight", (vocab, d), q4),
        ("output_norm.weight", (d,), f32),
        ("output.weight", (vocab, d), q4),
    ]
    for i in range(n_layer):
        p = f"blk.{i}."
        shapes += [
            (p + "attn_norm.weight", (d,), f32),
            (p + "attn_q.weight", (d, d), q4),
            (p + "attn_q.bias", (d,), f32),
            (p + "attn_k.weight", (kvh * hd, d), q4),
            (p + "attn_k.bias", (kvh * hd,), f32),
            (p + "attn_v.weight", (kvh * hd, d), q4),
            (p + "attn_v.bias", (kvh * hd,), f32),
            (p + "attn_output.weight", (d, d), q4),
            (p + "ffn_norm.weight", (d,), f32),
            (p + "ffn_gate.weight", (ff, d), q4),
            (p + "ffn_up.weight", (ff, d), q4),
            (p + "ffn_down.weight", (d, ff), q4),
        ]
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(n_layer)
    w.add_context_length(32768)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(h)
    w.add_head_count_kv(kvh)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    tokens, scores, types = _vocab(vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for name, shape, qtype in shapes:  # the header first: every tensor's info, then the data one by one
        nbytes = int(np.prod(shape)) * 4 if qtype == f32 else shape[0] * (shape[1] // 32) * 18
        byte_shape = shape if qtype == f32 else (shape[0], nbytes // shape[0])
        dtype = np.dtype(np.float32 if qtype == f32 else np.uint8)
        w.add_tensor_info(name, byte_shape, dtype, nbytes, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, qtype in shapes:
        if qtype == f32:
            arr = (
                (1.0 + 0.01 * rng.standard_normal(shape)).astype(np.float32)
                if "norm" in name
                else (0.01 * rng.standard_normal(shape)).astype(np.float32)
            )
        else:
            arr = q4_0(*shape)
        w.write_tensor_data(arr)
    w.close()
    return path


def measure(model: Path, backend: str, precision: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="edge-build-memory-") as cache:
        os.environ["EDGE_CACHE_DIR"] = cache
        from edge.devices.graph_decoder import GraphOptions, build_options, ensure_graph
        from edge.models.arch import ArchConfig
        from edge.models.build_progress import reporting
        from edge.models.gguf_file import open_gguf

        steps: list[dict[str, float]] = []
        with _Sampler() as sampler:
            t0 = time.monotonic()

            def on_progress(done: int, total: int, phase: str) -> None:
                rss = sampler.now()
                steps.append({"t": time.monotonic() - t0, "done": done, "total": total, "rss": rss})
                print(
                    f"{time.monotonic() - t0:6.1f} s  {phase} {done}/{total}  rss {rss / GIB:.2f} GiB{_rss_split()}"
                    f"  peak {sampler.peak / GIB:.2f} GiB",
                    flush=True,
                )

            gguf = open_gguf(model)
            cfg = ArchConfig.from_gguf(gguf.metadata, set(gguf.tensors))
            opts = GraphOptions(backend=backend, precision=precision)
            with reporting(on_progress):  # the build alone: no runner is opened on it
                ensure_graph(
                    gguf, cfg, build_options(cfg, opts), backend, fuse=opts.fuse, precision=precision
                )
            seconds = time.monotonic() - t0
        size = model.stat().st_size
        return {
            "model": str(model),
            "file_bytes": size,
            "backend": backend,
            "precision": precision,
            "build_s": round(seconds, 1),
            "peak_rss_bytes": sampler.peak,
            "ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "bound_bytes": size + GIB,
            "within_bound": sampler.peak <= size + GIB,
            "steps": steps,
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--backend", default="ort", choices=["ort", "openvino"])
    ap.add_argument("--precision", default="fast", choices=["fast", "exact"])
    ap.add_argument(
        "--synthetic-7b", action="store_true", help="write the Qwen2-7B-shaped file to MODEL first"
    )
    ap.add_argument("--vocab", type=int, default=32000, help="the synthetic file's vocabulary rows")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    if args.synthetic_7b:
        t0 = time.monotonic()
        write_synthetic_7b(args.model, args.vocab)
        print(
            f"wrote {args.model} ({args.model.stat().st_size / 1e9:.2f} GB) in {time.monotonic() - t0:.0f} s"
        )
    out = measure(args.model, args.backend, args.precision)
    print(
        f"build {out['build_s']} s, peak RSS {out['peak_rss_bytes'] / GIB:.2f} GiB (ru_maxrss "  # type: ignore[operator]
        f"{out['ru_maxrss_bytes'] / GIB:.2f}), bound file + 1 GiB = {out['bound_bytes'] / GIB:.2f} GiB"  # type: ignore[operator]
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
