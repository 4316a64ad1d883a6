"""Load on `edge serve` (and on llama-cpp-python's own OpenAI server, same model, same machine): one
streaming client, then C concurrent streaming clients; aggregate completion tok/s, TTFT, none dropped.
With --rss N: N sequential requests and the server process's RSS before and after.
Writes results/serve-load-<model>-<date>.json and .md.

    python -m benchmarks.serve_load                               # smollm2-135m; edge --parallel 1 and 2, llama_cpp.server
    python -m benchmarks.serve_load --servers edge:2 --rss 1000   # also 1,000 sequential requests, RSS growth

Each server runs as its own process on 127.0.0.1 (a free port), loads the model with the same threads and
context, answers greedy requests with the same prompts and max_tokens; the servers run one after the other.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from edge.bench import machine_info

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"
PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle works, step by step.",
    "Describe the water cycle to a child.",
    "List ten uses for a paperclip and explain each.",
    "Tell me about the history of the printing press.",
    "Why do cats purr? Give several theories.",
    "Write a poem about the autumn wind.",
    "How do airplanes stay in the air?",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(kind: str, model: str, threads: int, n_ctx: int, port: int) -> subprocess.Popen[bytes]:
    if kind.startswith("edge"):
        parallel = kind.split(":")[1] if ":" in kind else "1"
        cmd = [sys.executable, "-m", "edge.cli", "serve", model, "--port", str(port), "--parallel", parallel]
        cmd += ["--ctx-size", str(n_ctx)] + ([] if parallel != "1" else ["--threads", str(threads)])
    else:  # llama-cpp-python's server on the same GGUF
        from edge.models.catalog import CATALOG
        from edge.models.store import model_path

        path = model_path(CATALOG[model]) if model in CATALOG else Path(model)
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(path), "--port", str(port)]
        cmd += [
            "--host",
            "127.0.0.1",
            "--n_threads",
            str(threads),
            "--n_ctx",
            str(n_ctx),
            "--model_alias",
            model,
        ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} exited with {proc.returncode}: {' '.join(cmd)}")
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{kind} did not start")


def one_request(url: str, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """A streamed greedy chat request: its completion tokens (usage, else content chunks) and TTFT."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    ttft, chunks, usage, done = None, 0, None, False
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
            if r.status_code != 200:
                return {"ok": False, "error": f"HTTP {r.status_code}"}
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    done = True
                if not line.startswith("data: ") or done:
                    continue
                event = json.loads(line[6:])
                if event.get("usage"):
                    usage = event["usage"]
                for choice in event.get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        chunks += 1
                        ttft = ttft if ttft is not None else time.perf_counter() - t0
    except httpx.HTTPError as exc:  # e.g. llama_cpp.server interrupts a stream when another request comes
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    if not done:
        return {"ok": False, "error": "the stream ended without [DONE]"}
    tokens = usage["completion_tokens"] if usage else chunks
    return {"ok": True, "tokens": tokens, "ttft_s": ttft or 0.0, "s": time.perf_counter() - t0}


def load(url: str, model: str, clients: int, per_client: int, max_tokens: int) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        for j in range(per_client):
            r = one_request(url, model, PROMPTS[(i * per_client + j) % len(PROMPTS)], max_tokens)
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = [r for r in results if r["ok"]]
    errors = sorted({r["error"] for r in results if not r["ok"]})
    tokens = sum(r["tokens"] for r in ok)
    ttfts = sorted(r["ttft_s"] for r in ok)
    return {
        "clients": clients,
        "requests": len(results),
        "completed": len(ok),
        "dropped": len(results) - len(ok),
        "errors": errors[:3],
        "tokens": tokens,
        "wall_s": round(wall, 2),
        "aggregate_tok_s": round(tokens / wall, 1),
        "ttft_median_s": round(ttfts[len(ttfts) // 2], 3) if ttfts else None,
        "ttft_max_s": round(ttfts[-1], 3) if ttfts else None,
    }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median aggregate tok/s, with every run's figure and all drops summed."""
    ordered = sorted(runs, key=lambda r: r["aggregate_tok_s"])
    mid = dict(ordered[len(ordered) // 2])
    mid["rounds_tok_s"] = [r["aggregate_tok_s"] for r in runs]
    mid["dropped"] = sum(r["dropped"] for r in runs)
    mid["requests"] = sum(r["requests"] for r in runs)
    mid["completed"] = sum(r["completed"] for r in runs)
    mid["errors"] = sorted({e for r in runs for e in r["errors"]})[:3]
    return mid


def rss_run(url: str, model: str, pid: int, n: int) -> dict[str, Any]:
    proc = psutil.Process(pid)
    rss = lambda: sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])  # noqa: E731
    with httpx.Client(base_url=url, timeout=120) as http:
        for i in range(20):  # warm-up
            http.post("/v1/chat/completions", json=_small(model, i))
        before = rss()
        for i in range(n):
            assert http.post("/v1/chat/completions", json=_small(model, i)).status_code == 200
        after = rss()
    return {"requests": n, "rss_before_mib": before >> 20, "rss_after_mib": after >> 20,
            "growth_pct": round(100 * (after - before) / before, 2)}  # fmt: skip


def _small(model: str, i: int) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": f"Say a number: {i}"}], "max_tokens": 4}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--servers", default="edge:1,edge:2,llama_cpp", help="edge:PARALLEL and/or llama_cpp")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=2, help="requests per client")
    ap.add_argument("--rounds", type=int, default=3, help="single/concurrent rounds per server (median kept)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx-size", type=int, default=2048)
    ap.add_argument("--rss", type=int, default=0, help="also N sequential requests on each edge server: RSS")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    rows = []
    for kind in args.servers.split(","):
        port = free_port()
        proc = start(kind, args.model, args.threads, args.ctx_size, port)
        url = f"http://127.0.0.1:{port}"
        try:
            one_request(url, args.model, "Hi", 8)  # warm-up
            singles, manys = [], []
            for _ in range(args.rounds):  # alternated, so drifting machine load hits both alike
                singles.append(load(url, args.model, 1, args.requests, args.max_tokens))
                manys.append(load(url, args.model, args.clients, args.requests, args.max_tokens))
            single, many = median_run(singles), median_run(manys)
            row = {"server": kind, "single": single, "concurrent": many,
                   "speedup": round(many["aggregate_tok_s"] / single["aggregate_tok_s"], 2)}  # fmt: skip
            if args.rss and kind.startswith("edge"):
                row["rss"] = rss_run(url, args.model, proc.pid, args.rss)
            rows.append(row)
            print(json.dumps(row), flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
    machine = machine_info(args.threads)
    out = {
        "date": dt.date.today().isoformat(),
        "model": args.model,
        "threads": args.threads,
        "max_tokens": args.max_tokens,
        "machine": machine,
        "load_average_at_end": os.getloadavg(),  # other work on the machine skews every figure
        "rows": rows,
    }
    name = args.out or f"serve-load-{args.model}-{out['date']}"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=1) + "\n")
    lines = [
        f"# edge serve under load: {args.model}, {args.clients} streaming clients x {args.requests} requests, "
        f"max_tokens {args.max_tokens}, greedy",
        "",
        f"Machine: {machine}; load average at the end {os.getloadavg()[0]:.1f} (other work on it).",
        "Aggregate tok/s = completion tokens of all requests / wall time; median of "
        f"{args.rounds} alternated rounds (every round's figure in the .json).",
        "",
        f"| server | 1 client tok/s | {args.clients} clients tok/s | speedup | dropped | TTFT median / max ({args.clients} clients) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        s, m = r["single"], r["concurrent"]
        lines.append(
            f"| {r['server']} | {s['aggregate_tok_s']} | {m['aggregate_tok_s']} | {r['speedup']}x | "
            f"{m['dropped']} | {m['ttft_median_s']} / {m['ttft_max_s']} s |"
        )
    for r in rows:
        if r["concurrent"]["errors"]:
            lines.append(f"\n{r['server']} errors under {args.clients} clients: {r['concurrent']['errors']}")
    for r in rows:
        if "rss" in r:
            x = r["rss"]
            lines.append(
                f"\n{r['server']}: {x['requests']} sequential requests, RSS {x['rss_before_mib']} -> "
                f"{x['rss_after_mib']} MiB ({x['growth_pct']:+.2f}%)"
            )
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
