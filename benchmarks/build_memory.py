"""Peak RSS and time of building edge's own graph for a GGUF, alone (no runner opened), in a fresh graph cache.

    python -m benchmarks.build_memory MODEL.gguf [--backend ort|openvino] [--precision fast|exact]
    python -m benchmarks.build_memory MODEL.gguf --synthetic-7b   # first writes a Qwen2-7B-shaped file there

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
import tempfile
import threading
import time
from pathlib import Path

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
    """A qwen2 GGUF with Qwen2-7B's shapes (vocab reduced) and random Q4_0 codes."""
    from tests.tiny_models import write_qwen2_q4_0

    return write_qwen2_q4_0(
        path, d=3584, n_layer=28, ff=18944, n_head=28, n_head_kv=4, vocab=vocab, seed=seed
    )


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
