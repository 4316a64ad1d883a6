"""Where a backend's resident memory goes, phase by phase: load, the first prefill, decode.

    python -m benchmarks.ov_memory                          # qwen2.5-coder-1.5b: llama.cpp, openvino fast, exact
    python -m benchmarks.ov_memory --rounds 3 --python /work/main/.venv/bin/python .venv/bin/python
    python -m benchmarks.ov_memory --backends openvino --cold     # the first load: no compiled blob cached yet

`--python`: the interpreters (so the checkouts) whose edge is measured, interleaved per round: before/after a
change in one run. `--cold`: each run gets a fresh cache folder (EDGE_CACHE_DIR) holding hard links to the
built graphs but not the backends' compiled forms, so OpenVINO compiles the ONNX graph and writes its blob.

One fresh process per (backend, precision) (peak RSS is a process property; the OS page cache is shared and
warm). Each phase reports the RSS at its end, split into anonymous memory (heap: copies the runtime made) and
file-backed pages (mmapped files: the GGUF, ONNX external data, OpenVINO's cached blob), and the peak RSS during
the phase (the kernel's VmHWM, reset before each phase through /proc/self/clear_refs). The greedy tokens of the
decode are compared across runs, so a change to memory can be checked not to change them. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def cache_root() -> Path:
    from edge.models.store import cache_dir

    return cache_dir()


def _status() -> dict[str, int]:
    """VmRSS / VmHWM / RssAnon / RssFile in MB, from /proc/self/status."""
    out: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) // 1024
    return out


def _graph_pages() -> int:
    """MB of the built graphs and compiled blobs (edge's cache) resident in this process."""
    graphs, total, counting = str(cache_root() / "graphs") + "/", 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if parts and ":" not in parts[0]:  # a mapping's header line
            counting = len(parts) == 6 and parts[5].startswith(graphs)
        elif counting and parts[0] == "Rss:":
            total += int(parts[1])
    return total // 1024


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # 5: reset VmHWM to the current RSS


def child(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    import edge
    import edge.api
    from edge.bench import bench_prompt

    phases: list[dict[str, Any]] = []

    def phase(name: str, t0: float) -> None:
        use = resource.getrusage(resource.RUSAGE_SELF)
        cpu = use.ru_utime + use.ru_stime
        phases.append(
            {
                "phase": name,
                "s": time.perf_counter() - t0,
                "cpu_s": cpu - (phases[-1]["cpu_total"] if phases else cpu),
                "cpu_total": cpu,
                **_status(),
                "graph": _graph_pages(),
            }
        )
        _reset_peak()

    _reset_peak()
    phase("start", time.perf_counter())
    t0 = time.perf_counter()
    model = edge.api.load(
        args.model,
        backend=args.backend,
        precision=args.precision,
        n_ctx=args.n_ctx,
        n_threads=args.threads,
        draft="none",
    )
    phase("load", t0)
    dec = model.decoder
    prompt = bench_prompt(model.tokenizer, args.prompt_tokens)
    t0 = time.perf_counter()
    token = int(np.argmax(dec.forward(prompt, last_only=True)[-1]))
    phase("prefill", t0)
    tokens = [token]
    t0 = time.perf_counter()
    for _ in range(args.gen_tokens - 1):
        token = int(np.argmax(dec.forward([token], last_only=True)[-1]))
        tokens.append(token)
    phase("decode", t0)
    model.close()
    return {
        "code": str(Path(edge.__file__).resolve().parents[1]),  # which checkout's edge ran
        "backend": args.backend,
        "precision": args.precision,
        "phases": phases,
        "peak_mb": max(p["VmHWM"] for p in phases),
        "tokens": tokens,
    }


def _key(r: dict[str, Any]) -> tuple[str, str, str]:
    return r["code"], r["backend"], r["precision"]


def _median(runs: list[dict[str, Any]], phase: int, key: str) -> float:
    return statistics.median(r["phases"][phase].get(key, float("nan")) for r in runs)


def table(runs: list[dict[str, Any]]) -> str:
    """Phases of each entry's first round, then per entry: the median peak over rounds, its ratio to
    llama.cpp's, the median load and first-prefill times (wall and the process's CPU time: a
    busy machine stretches the first, much less the second), and whether every run of that backend and precision (any code, any round)
    produced the same greedy tokens (the before/after check)."""
    lines = [
        "| code | backend | precision | phase | s | RSS MB | anon MB | file MB | of it graph/blob MB | "
        "phase peak MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    seen: set[tuple[str, str, str]] = set()
    for r in runs:
        if _key(r) in seen:
            continue
        seen.add(_key(r))
        for p in r["phases"][1:]:
            lines.append(
                f"| {r['code']} | {r['backend']} | {r['precision']} | {p['phase']} | {p['s']:.1f} | "
                f"{p['VmRSS']} | {p['RssAnon']} | {p['RssFile']} | {p['graph']} | {p['VmHWM']} |"
            )
    lines += [
        "",
        "| code | backend | precision | peak RSS MB (rounds) | x llama.cpp | load s (CPU s) | "
        "first prefill s (CPU s) | same greedy tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ref = [r["peak_mb"] for r in runs if r["backend"] == "llamacpp"]
    ref_mb = statistics.median(ref) if ref else None
    for key in dict.fromkeys(_key(r) for r in runs):
        rs = [r for r in runs if _key(r) == key]
        peak = statistics.median(r["peak_mb"] for r in rs)
        ratio = f"{peak / ref_mb:.2f}" if ref_mb else "-"
        load, prefill = (
            (_median(rs, 1, k) for k in ("s", "cpu_s")),
            (_median(rs, 2, k) for k in ("s", "cpu_s")),
        )
        load_s, prefill_s = "{:.2f} ({:.2f})".format(*load), "{:.2f} ({:.2f})".format(*prefill)
        # the same backend and precision in any code, any round: one greedy sequence
        same = all(
            x["tokens"] == rs[0]["tokens"]
            for x in runs
            if x["backend"] == key[1] and x["precision"] == key[2]
        )
        peaks = ", ".join(str(r["peak_mb"]) for r in rs)
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {peak:.0f} ({peaks}) | {ratio} | {load_s} | {prefill_s} | "
            f"{same} |"
        )
    return "\n".join(lines)


def _cold_cache(root: Path) -> dict[str, str]:
    """An EDGE_CACHE_DIR at `root` with the models and built graphs (hard links) but no compiled blobs."""
    real = cache_root()
    (root / "models").symlink_to(real / "models")
    for entry in (real / "graphs").iterdir():
        if not (entry / "DONE").is_file():
            continue
        (root / "graphs" / entry.name).mkdir(parents=True)
        for f in entry.iterdir():
            if f.is_file() and (f.name in ("DONE", "model.onnx") or f.name.endswith(".data")):
                os.link(f, root / "graphs" / entry.name / f.name)
    return {**os.environ, "EDGE_CACHE_DIR": str(root)}


def _run(cmd: list[str], cold: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=cache_root()) as tmp:  # beside the cache: hard links work
        env = _cold_cache(Path(tmp)) if cold else None
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "cold": cold}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--backends", nargs="+", default=["llamacpp", "openvino"])
    ap.add_argument("--precisions", nargs="+", default=["fast", "exact"])
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds (every entry once per round)")
    ap.add_argument(
        "--python",
        nargs="+",
        default=[sys.executable],
        help="interpreters whose edge to measure (llama.cpp with the first): before/after in one run",
    )
    ap.add_argument("--cold", action="store_true", help="no compiled blob cached: the first load")
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--table", type=Path, help="print the tables of a --json file written before, run nothing"
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    ap.add_argument("--precision", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    if args.table:
        saved = json.loads(args.table.read_text())
        print(table(saved["runs"]))
        print(f"\nload average 1 min: {saved['load_avg_1m'][0]:.2f} -> {saved['load_avg_1m'][1]:.2f}")
        return
    runs: list[dict[str, Any]] = []
    load_avg = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for n, python in enumerate(args.python):
            for backend in args.backends if n == 0 else [b for b in args.backends if b != "llamacpp"]:
                for precision in args.precisions if backend != "llamacpp" else ["fast"]:
                    cmd = [
                        python,
                        "-m",
                        "benchmarks.ov_memory",
                        "--child",
                        "--backend",
                        backend,
                        "--precision",
                        precision,
                    ]
                    cmd += ["--model", args.model, "--n-ctx", str(args.n_ctx), "--threads", str(args.threads)]
                    cmd += ["--prompt-tokens", str(args.prompt_tokens), "--gen-tokens", str(args.gen_tokens)]
                    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
                    runs.append(_run(cmd, args.cold))
    load_avg.append(os.getloadavg()[0])
    print(table(runs))
    print(f"\nload average 1 min: {load_avg[0]:.2f} -> {load_avg[1]:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"load_avg_1m": load_avg, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
