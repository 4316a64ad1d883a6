"""Continuous batching under load (issue #28): `edge serve --parallel N` against llama.cpp's own server
(`llama-server -np N`, continuous batching) on the same GGUF, same machine, one server after the other.

Per server, each its own process on 127.0.0.1 at a free port:
- load levels (`--clients 1,4,8`): C concurrent streaming clients, each sending `--requests` greedy chat
  requests in turn, its prompts alternating short and ~500 tokens, short first: every client of every level
  runs the one client's sequence, so each level carries the same mix and the ratio to 1 client compares like
  with like (deterministic, unique per request so no server reuses a cached prefix beyond the chat template);
  aggregate completion tok/s, its ratio to 1 client, p50/p99 time to first token and inter-token latency
  (gaps between streamed content chunks), errors;
- the long-prompt probe: while 3 clients stream, one `--long-tokens` prompt arrives; the largest gap between
  consecutive chunks of the other streams while it prefills, next to their median gap;
- peak RSS of the server process (and its children), sampled.
`--soak N` instead: N requests from 8 concurrent clients, some closing their stream after a random number of
chunks (seeded); every completed answer must equal its prompt's greedy answer alone, RSS growth after warm-up
< 5%.

Writes benchmarks/results/serve-load-<model>-<date>.json and .md (serve-soak-... for --soak), with the CPU
and the command line.

    python -m benchmarks.serve_load --model qwen2.5-coder-0.5b --servers edge:4,llama-server:4
    python -m benchmarks.serve_load --model smollm2-135m --servers edge:1,llama-server:4 --clients 1,4 \\
        --max-tokens 32 --long-tokens 3000
    python -m benchmarks.serve_load --model smollm2-135m --servers edge:4 --soak 1000

Servers: `edge:N[:BACKEND]` (`edge serve MODEL --parallel N [--backend BACKEND] --ctx-size C`, edge's default
threads unless --threads), `edge:N:plan` (the same with the phase plan given by --plan) and `llama-server:N`
(`llama-server -m FILE -np N -c C*N -t THREADS`; --llama-server PATH). Build llama-server from the llama.cpp that llama-cpp-python vendors (the reference engine's own code):
`pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`, then in its vendor/llama.cpp
`cmake -B build -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_SERVER=ON &&
cmake --build build --target llama-server`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import random
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_LLAMA_SERVER = "/work/build-llama/bin/llama-server"  # where this project's machines build it
SHORT_PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle works, step by step.",
    "Describe the water cycle to a child.",
    "List ten uses for a paperclip and explain each.",
    "Tell me about the history of the printing press.",
    "Why do cats purr? Give several theories.",
    "Write a poem about the autumn wind.",
    "How do airplanes stay in the air?",
]
ROOMS = ["kitchen", "attic", "garage", "cellar", "office", "hallway", "library", "workshop"]
THINGS = ["the heater", "a window", "the door", "the lamp", "the fan", "a shelf", "the clock", "the pump"]
STATES = ["was checked", "needed oil", "was replaced", "made a noise", "was cleaned", "stopped", "was fine"]


# -- pure parts ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ServerSpec:
    """One server to measure: `edge:N[:BACKEND]` or `llama-server:N`."""

    kind: str  # "edge" | "llama-server"
    slots: int
    backend: str | None = None

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.slots}" + (f":{self.backend}" if self.backend else "")


def parse_server(spec: str) -> ServerSpec:
    parts = spec.strip().split(":")
    kind = parts[0]
    if kind not in ("edge", "llama-server") or len(parts) > (3 if kind == "edge" else 2):
        raise ValueError(f"server {spec!r}: expected edge:N[:BACKEND] or llama-server:N")
    try:
        slots = int(parts[1]) if len(parts) > 1 else 1
    except ValueError:
        raise ValueError(f"server {spec!r}: N must be an integer") from None
    if slots < 1:
        raise ValueError(f"server {spec!r}: N must be at least 1")
    return ServerSpec(kind, slots, parts[2] if len(parts) > 2 else None)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def gaps(times: Sequence[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def largest_gap_during(times: Sequence[float], start: float, end: float) -> float | None:
    """The largest gap between consecutive chunks that overlaps [start, end] (a stall the window caused or
    shared); None when no gap does."""
    over = [b - a for a, b in itertools.pairwise(times) if b > start and a < end]
    return max(over) if over else None


def cpu_summary(lscpu: str) -> dict[str, Any]:
    """The CPU's model name and the matrix/vector extensions that decide CPU inference speed, from `lscpu`."""
    fields = {}
    for line in lscpu.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("Flags", "").split())
    has = {
        "AVX2": "avx2" in flags,
        "AVX-512": "avx512f" in flags,
        "VNNI": bool(flags & {"avx512_vnni", "avx_vnni"}),
        "BF16": bool(flags & {"avx512_bf16", "amx_bf16"}),
        "AMX": bool(flags & {"amx_tile", "amx_bf16", "amx_int8"}),
    }
    name = fields.get("Model name", "unknown")
    family, model = fields.get("CPU family"), fields.get("Model")
    # a virtual machine's model name can be the vendor's alone ("AMD EPYC"): family and model tell CPUs apart
    return {
        "model": name if family is None else f"{name} (CPU family {family} model {model})",
        "cpus": fields.get("CPU(s)"),
        "threads_per_core": fields.get("Thread(s) per core"),
        "flags": has,
        "summary": ", ".join(k for k, v in has.items() if v) or "none of AVX2/AVX-512/VNNI/BF16/AMX",
    }


def _agree(a: str, b: str) -> int:
    """The length of the common prefix."""
    return sum(1 for _ in itertools.takewhile(lambda xy: xy[0] == xy[1], zip(a, b, strict=False)))


def mixed_up(text: str, own: str, others: Sequence[str]) -> bool:
    """An answer that agrees longer with another prompt's answer than with its own went to the wrong stream
    (a numeric divergence of a batched step only shortens the agreement with its own)."""
    mine = _agree(text, own)
    return any(_agree(text, o) > mine for o in others)


def level_summary(clients: int, wall_s: float, results: Sequence[Request]) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    itls = [g for r in ok for g in gaps(r.chunk_times)]
    tokens = sum(r.tokens for r in ok)
    chunks = sum(len(r.chunk_times) for r in ok)

    def ms(x: float | None) -> float | None:
        return None if x is None else round(1000 * x, 1)

    return {
        "clients": clients,
        "requests": len(results),
        "completed": len(ok),
        "errors": len(results) - len(ok),
        "error_kinds": sorted({r.error for r in results if r.error})[:3],
        "completion_tokens": tokens,
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "tokens_per_chunk": round(tokens / chunks, 2) if chunks else None,
        "wall_s": round(wall_s, 2),
        "aggregate_tok_s": round(tokens / wall_s, 1) if wall_s > 0 else None,
        "ttft_p50_ms": ms(percentile(ttfts, 50)),
        "ttft_p99_ms": ms(percentile(ttfts, 99)),
        "itl_p50_ms": ms(percentile(itls, 50)),
        "itl_p99_ms": ms(percentile(itls, 99)),
    }


def with_ratios(levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each level's aggregate tok/s over the 1-client level's (None without one)."""
    base = next((lv["aggregate_tok_s"] for lv in levels if lv["clients"] == 1), None)
    for lv in levels:
        agg = lv["aggregate_tok_s"]
        lv["vs_1_client"] = round(agg / base, 2) if base and agg is not None else None
    return levels


def _cell(x: Any) -> str:
    return "-" if x is None else str(x)


def load_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The markdown table of every server's load levels."""
    lines = [
        "| server | clients | requests | errors | tok/s | vs 1 client | TTFT p50 / p99 ms | ITL p50 / p99 ms |"
        " tok/chunk |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        for lv in row.get("levels", []):
            lines.append(
                f"| {row['server']} | {lv['clients']} | {lv['requests']} | {lv['errors']} | "
                f"{_cell(lv['aggregate_tok_s'])} | {_cell(lv['vs_1_client'])}x | "
                f"{_cell(lv['ttft_p50_ms'])} / {_cell(lv['ttft_p99_ms'])} | "
                f"{_cell(lv['itl_p50_ms'])} / {_cell(lv['itl_p99_ms'])} | {_cell(lv['tokens_per_chunk'])} |"
            )
    return lines


# -- prompts ---------------------------------------------------------------------------------------
def notes(n_lines: int, seed: int) -> str:
    """Deterministic maintenance notes, a long prompt's body."""
    rng = random.Random(seed)
    return "\n".join(
        f"{i + 1}. In the {rng.choice(ROOMS)}, {rng.choice(THINGS)} {rng.choice(STATES)} "
        f"at {rng.randrange(6, 22)}:{rng.randrange(60):02d} (ticket {rng.randrange(1000, 9999)})."
        for i in range(n_lines)
    )


def sized_prompt(tokenizer: Any, n_tokens: int, seed: int) -> str:
    """A user message of about n_tokens tokens (the body cut at n_tokens by the model's own tokenizer)."""
    head = "Summarize the following maintenance notes in three sentences.\n\n"
    body = notes(max(8, n_tokens // 10), seed)
    while len(tokenizer.encode(head + body)) < n_tokens:
        body += "\n" + notes(max(8, n_tokens // 20), seed + len(body))
    ids = tokenizer.encode(head + body)[:n_tokens]
    return tokenizer.decode(ids)


def is_long(j: int) -> bool:
    """Whether a client's j-th request of a load level is a long prompt: its odd ones, whichever the client."""
    return j % 2 == 1


class Prompts:
    """The load's prompts. A client's j-th request is short or ~`long_tokens` by j alone (`is_long`), so every
    client of every level runs the one client's sequence of kinds: each level carries the same mix (a kind
    chosen by client + j gave 4 clients of 3 requests 6 long of 12, the one client 1 of 3). The client shifts
    which body; a leading tag makes each prompt unique."""

    def __init__(self, long: Sequence[str]) -> None:
        self.long = list(long)

    @classmethod
    def sized(cls, tokenizer: Any, long_tokens: int) -> Prompts:
        """Four long bodies of ~`long_tokens` tokens of the model's own tokenizer."""
        return cls([sized_prompt(tokenizer, long_tokens, seed) for seed in range(4)])

    def __call__(self, client: int, j: int, tag: str) -> str:
        k = client + j // 2
        body = self.long[k % len(self.long)] if is_long(j) else SHORT_PROMPTS[k % len(SHORT_PROMPTS)]
        return f"[{tag}] {body}"


# -- the client ------------------------------------------------------------------------------------
@dataclass
class Request:
    prompt: str = ""
    ok: bool = False
    error: str | None = None
    sent: float = 0.0
    ttft_s: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    tokens: int = 0
    prompt_tokens: int = 0
    text: str = ""
    closed_early: bool = False
    stats: dict[str, Any] | None = (
        None  # the server's own figures: edge's `edge` field, llama-server's timings
    )


def stream_chat(
    url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    *,
    stop_after: int | None = None,
    stop_when: Callable[[Request], bool] | None = None,
) -> Request:
    """One streamed greedy chat request; the arrival time of each content chunk. `stop_after` chunks, or
    once `stop_when(request so far)` holds, the client closes the stream (a disconnect; not an error)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r = Request(prompt=prompt, sent=time.perf_counter())
    pieces: list[str] = []
    usage: dict[str, Any] | None = None
    done = False
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=900) as resp:
            if resp.status_code != 200:
                r.error = f"HTTP {resp.status_code}"
                return r
            for line in resp.iter_lines():
                if line == "data: [DONE]":
                    done = True
                    break
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    r.error = f"error event: {str(event['error'])[:80]}"
                    return r
                usage = event.get("usage") or usage
                r.stats = event.get("edge") or event.get("timings") or r.stats
                for choice in event.get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        now = time.perf_counter()
                        r.chunk_times.append(now)
                        r.ttft_s = r.ttft_s if r.ttft_s is not None else now - r.sent
                        pieces.append(content)
                if (stop_after is not None and len(r.chunk_times) >= stop_after) or (
                    stop_when is not None and stop_when(r)
                ):
                    r.closed_early = True
                    break
    except (httpx.HTTPError, ValueError) as exc:
        r.error = f"{type(exc).__name__}: {str(exc)[:80]}"
        return r
    r.text = "".join(pieces)
    if r.closed_early:
        return r
    if not done:
        r.error = "the stream ended without [DONE]"
        return r
    r.ok = True
    r.tokens = usage["completion_tokens"] if usage else len(r.chunk_times)
    r.prompt_tokens = usage["prompt_tokens"] if usage else 0
    return r


def run_clients(n: int, work: Callable[[int], list[Request]]) -> tuple[float, list[Request]]:
    """n client threads, each running work(i); the wall time and every request."""
    out: list[Request] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        got = work(i)
        with lock:
            out.extend(got)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, out


# -- the servers -----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(spec: ServerSpec, args: argparse.Namespace, path: Path, port: int) -> list[str]:
    if spec.kind == "edge":
        cmd = [sys.executable, "-m", "edge.cli", "serve", args.model, "--host", "127.0.0.1"]
        cmd += ["--port", str(port), "--parallel", str(spec.slots), "--ctx-size", str(args.ctx_size)]
        if spec.backend == "plan":  # edge:N:plan: the model split by phase as --plan says
            if not args.plan:
                raise ValueError("edge:N:plan needs --plan prefill=...,decode=...")
            cmd += ["--plan", args.plan]
        elif spec.backend:
            cmd += ["--backend", spec.backend]
        cmd += ["--precision", args.precision] if args.precision else []
        return cmd + (["--threads", str(args.threads)] if args.threads else [])
    threads = args.threads or psutil.cpu_count(logical=False) or 1
    return [
        args.llama_server, "-m", str(path), "--host", "127.0.0.1", "--port", str(port),
        "-np", str(spec.slots), "-c", str(args.ctx_size * spec.slots), "-t", str(threads),
    ]  # fmt: skip


class Server:
    """A server process started and ready, its RSS sampled (with its children) until stopped."""

    def __init__(self, cmd: list[str], log: Path) -> None:
        self.cmd = cmd
        self.port = int(cmd[cmd.index("--port") + 1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log.open("wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        self.peak_rss = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        try:
            self.model_id = self._wait_ready()
        except BaseException:  # not ready (or interrupted): leave no server behind
            self.stop()
            raise

    def rss(self) -> int:
        try:
            p = psutil.Process(self.proc.pid)
            return sum(q.memory_info().rss for q in [p, *p.children(recursive=True)])
        except psutil.Error:
            return 0

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            self.peak_rss = max(self.peak_rss, self.rss())

    def _wait_ready(self) -> str:
        deadline = time.monotonic() + 900  # a first load may build and compile graphs
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"exited with {self.proc.returncode} (log {self._log.name}): {shlex.join(self.cmd)}"
                )
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    models = httpx.get(self.url + "/v1/models", timeout=5).json()["data"]
                    return str(models[0]["id"])
            except (httpx.HTTPError, ValueError, KeyError, IndexError):
                pass
            time.sleep(0.25)
        raise RuntimeError(f"not ready after 900 s: {shlex.join(self.cmd)}")

    def stop(self) -> None:
        self._stop.set()
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


# -- the measurements ------------------------------------------------------------------------------
def load_level(srv: Server, prompts: Prompts, clients: int, args: argparse.Namespace) -> dict[str, Any]:
    def work(i: int) -> list[Request]:
        return [
            stream_chat(srv.url, srv.model_id, prompts(i, j, f"c{clients}-{i}-{j}"), args.max_tokens)
            for j in range(args.requests)
        ]

    wall, results = run_clients(clients, work)
    return level_summary(clients, wall, results)


def long_prompt_probe(srv: Server, long_prompt: str, args: argparse.Namespace) -> dict[str, Any]:
    """3 clients stream answers back to back; once they stream, the long prompt arrives. Each client's chunks
    form one timeline across its requests (time queued for a slot counts as a gap): its largest gap while
    the long prompt prefills (sent -> first token) vs its median gap before."""
    streaming, probe_done = threading.Event(), threading.Event()
    window: list[float] = []

    def keep_streaming(r: Request) -> bool:
        if r.chunk_times:
            streaming.set()
        return probe_done.is_set()

    def background(i: int) -> list[Request]:
        out: list[Request] = []
        while not probe_done.is_set():
            prompt = f"[probe-{i}-{len(out)}] {SHORT_PROMPTS[i]}"
            out.append(stream_chat(srv.url, srv.model_id, prompt, args.max_tokens, stop_when=keep_streaming))
        return out

    def prober() -> None:
        streaming.wait(600)
        time.sleep(2.0)  # every stream under way, in its decode steps
        r = stream_chat(srv.url, srv.model_id, long_prompt, 8)
        window[:] = [r.sent, r.sent + (r.ttft_s or 0.0), r.prompt_tokens, r.ok]
        probe_done.set()

    clients: list[list[Request]] = [[] for _ in range(3)]

    def client(i: int) -> None:
        clients[i] = background(i)

    threads = [threading.Thread(target=prober)] + [
        threading.Thread(target=client, args=(i,)) for i in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    start, first_token, n_prompt, ok = window
    timelines = [[t for r in reqs for t in r.chunk_times] for reqs in clients]
    stalls = [g for tl in timelines if (g := largest_gap_during(tl, start, first_token)) is not None]
    before = [g for tl in timelines for g in gaps([t for t in tl if t <= start])]
    return {
        "probe_ok": bool(ok),
        "probe_prompt_tokens": int(n_prompt),
        "probe_ttft_ms": round(1000 * (first_token - start), 1),
        "others_median_gap_ms": round(1000 * statistics.median(before), 1) if before else None,
        "others_largest_gap_during_prefill_ms": round(1000 * max(stalls), 1) if stalls else None,
        "background_requests": sum(len(c) for c in clients),
        "background_errors": sum(1 for c in clients for r in c if r.error),
    }


SOAK_PROMPTS = [
    *SHORT_PROMPTS,
    "Name three rivers in Africa.",
    "What is the boiling point of water in Fahrenheit?",
    "Give me a recipe for pancakes.",
    "Translate 'good morning' into French and Spanish.",
    "What does a compiler do?",
    "Suggest a name for a black dog.",
    "Count from one to ten in words.",
    "What is the capital of Japan?",
]


def deepest(refs: dict[str, Request], k: int) -> list[str]:
    """The k prompts whose answers alone went deepest in the KV: prompt + completion tokens as the server
    counted them (its usage figures), since depth in the KV is tokens, not characters."""
    return sorted(refs, key=lambda p: refs[p].prompt_tokens + refs[p].tokens)[-k:]


def soak(srv: Server, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """N requests from 8 clients, a third of them closing the stream after a random number of chunks;
    completed answers checked against each prompt's answer alone; RSS after warm-up vs at the end.

    The warm-up: every prompt's answer alone, one request at a time, then a round of 8 clients on the 4
    prompts that go deepest (prompt + answer tokens, as the server counted them), so every slot has run
    batched shapes and written its KV as deep as the soak's requests go: edge's ring KV is resident only where
    written (kvcache/pages.py), so without that round the soak's growth would count each slot's first deep
    request, not what stays behind. The growth from after the sequential references is reported too."""
    refs: dict[str, Request] = {}
    for p in SOAK_PROMPTS:
        r = stream_chat(srv.url, srv.model_id, p, args.max_tokens)
        if not r.ok:
            raise RuntimeError(f"soak reference for {p!r} failed: {r.error}")
        refs[p] = r
    alone = {p: r.text for p, r in refs.items()}
    rss_sequential = srv.rss()
    deep = deepest(refs, 4)
    _, warm = run_clients(8, lambda i: [stream_chat(srv.url, srv.model_id, p, args.max_tokens) for p in deep])
    if not all(r.ok for r in warm):
        raise RuntimeError(f"soak warm round failed: {next(r.error for r in warm if not r.ok)}")
    rss_warm = srv.rss()
    rng = random.Random(args.seed)
    plan = [(rng.choice(SOAK_PROMPTS), rng.randrange(1, args.max_tokens) if rng.random() < 1 / 3 else None)
            for _ in range(n)]  # fmt: skip
    lock = threading.Lock()

    def work(_: int) -> list[Request]:
        out: list[Request] = []
        while True:
            with lock:
                if not plan:
                    return out
                prompt, stop_after = plan.pop()
            out.append(stream_chat(srv.url, srv.model_id, prompt, args.max_tokens, stop_after=stop_after))

    wall, results = run_clients(8, work)
    rss_end = srv.rss()
    completed = [r for r in results if r.ok]
    differ = [r for r in completed if r.text != alone[r.prompt]]
    swapped = [
        r for r in differ if mixed_up(r.text, alone[r.prompt], [alone[p] for p in alone if p != r.prompt])
    ]
    return {
        "requests": n,
        "completed": len(completed),
        "disconnected": sum(r.closed_early for r in results),
        "errors": sum(1 for r in results if r.error),
        "error_kinds": sorted({r.error for r in results if r.error})[:3],
        "differ_from_alone": len(differ),
        "mixed_up": len(swapped),
        "wall_s": round(wall, 1),
        "rss_after_warmup_mib": rss_warm >> 20,
        "rss_end_mib": rss_end >> 20,
        "rss_growth_pct": round(100 * (rss_end - rss_warm) / rss_warm, 2) if rss_warm else None,
        "rss_after_references_mib": rss_sequential >> 20,
    }


# -- the run ---------------------------------------------------------------------------------------
def lscpu() -> str:
    try:
        return subprocess.run(
            ["lscpu"], capture_output=True, text=True, check=True, env={"LC_ALL": "C"}
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""


def llama_server_version(path: str) -> str | None:
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.startswith(("version", "built"))]
    return "; ".join(lines) or None


def health(srv: Server) -> Any:
    """What the server says of itself after the load (edge: slots, queue and batch sizes per model)."""
    try:
        return httpx.get(srv.url + "/health", timeout=10).json()
    except (httpx.HTTPError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


def measure(spec: ServerSpec, args: argparse.Namespace, path: Path, prompts: Prompts, long_prompt: str | None,
            log_dir: Path) -> dict[str, Any]:  # fmt: skip
    cmd = server_command(spec, args, path, free_port())
    t0 = time.perf_counter()
    srv = Server(cmd, log_dir / f"{spec.label.replace(':', '-')}.log")
    row: dict[str, Any] = {"server": spec.label, "command": shlex.join(cmd)}
    try:
        row["ready_s"] = round(time.perf_counter() - t0, 1)
        row["load_average_start"] = round(os.getloadavg()[0], 1)  # others' work on the machine skews it all
        print(f"{spec.label}: ready in {row['ready_s']} s", file=sys.stderr, flush=True)
        if args.soak:
            row["soak"] = soak(srv, args.soak, args)
        else:
            for i in range(2):  # warm-up: a short and a long prompt (first-run compiles, caches)
                warm = stream_chat(srv.url, srv.model_id, prompts(0, i, f"warm-{i}"), 8)
            row["warmup_stats"] = warm.stats  # edge: which backend and device answered
            row["levels"] = with_ratios([load_level(srv, prompts, c, args) for c in args.clients])
            if long_prompt is not None:
                row["probe"] = long_prompt_probe(srv, long_prompt, args)
        row["health"] = health(srv)
        row["load_average_end"] = round(os.getloadavg()[0], 1)
    finally:
        srv.stop()
    row["peak_rss_mib"] = srv.peak_rss >> 20
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def report(out: dict[str, Any]) -> list[str]:
    a = out["settings"]
    lines = [
        f"# Serving under load: {out['model']} ({out['date']})",
        "",
        f"CPU: {out['cpu']['model']} ({out['cpu']['summary']}); load average at the end "
        f"{out['load_average_at_end'][0]:.1f} (other work on the machine skews every figure).",
        *([f"llama-server: {out['llama_server_version']}.", ""] if out["llama_server_version"] else [""]),
        f"Command: `{out['command']}`",
        "",
        *([out["note"], ""] if out.get("note") else []),
    ]
    rows = out["rows"]
    if any(r["server"].startswith("llama-server") for r in rows):
        lines += [
            "llama-server runs with its defaults: continuous batching, one KV buffer of -c = context x N, and a "
            "prompt cache in host RAM (--cache-ram, 8 GiB at most) that its RSS includes.",
            "",
        ]
    if any("levels" in r for r in rows):
        lines += [
            f"Greedy, max_tokens {a['max_tokens']}, {a['requests']} requests per client, each client's prompts "
            f"alternating short and ~{a['prompt_tokens']} tokens (every level the same mix); context "
            f"{a['ctx_size']} per slot. tok/s: completion tokens of the level / its wall time. ITL: gaps between "
            "streamed content chunks.",
            "",
            *load_table(rows),
            "",
        ]
    probes = [r for r in rows if "probe" in r]
    if probes:
        lines += [
            "Long prompt mid-load (3 other streams): their largest chunk gap while it prefills vs their median.",
            "",
            "| server | probe tokens | probe TTFT ms | others' median gap ms | largest gap during prefill ms |",
            "|---|---|---|---|---|",
        ]
        for r in probes:
            p = r["probe"]
            lines.append(
                f"| {r['server']} | {p['probe_prompt_tokens']} | {p['probe_ttft_ms']} | "
                f"{_cell(p['others_median_gap_ms'])} | {_cell(p['others_largest_gap_during_prefill_ms'])} |"
            )
        lines.append("")
    soaks = [r for r in rows if "soak" in r]
    if soaks:
        lines += [
            f"Soak: 8 clients, a third closing their stream early (seed {a['seed']}); completed answers "
            "checked against each prompt's answer alone. RSS: after the answers alone (one request at a "
            "time), after a warm round of 8 clients on the deepest prompts, and at the end; growth from the "
            "warm round.",
            "",
            "| server | requests | completed | disconnected | errors | differ from alone | mixed up |"
            " RSS after answers alone / warm round -> end MiB | growth |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in soaks:
            s = r["soak"]
            lines.append(
                f"| {r['server']} | {s['requests']} | {s['completed']} | {s['disconnected']} | {s['errors']} | "
                f"{s['differ_from_alone']} | {s['mixed_up']} | "
                f"{_cell(s.get('rss_after_references_mib'))} / {s['rss_after_warmup_mib']} -> {s['rss_end_mib']}"
                f" | {_cell(s['rss_growth_pct'])}% |"
            )
        lines.append("")
    lines += ["| server | peak RSS MiB | ready s | load average start / end |", "|---|---|---|---|"]
    lines += [
        f"| {r['server']} | {r['peak_rss_mib']} | {r['ready_s']} | "
        f"{_cell(r.get('load_average_start'))} / {_cell(r.get('load_average_end'))} |"
        for r in rows
    ]
    lines += ["", "Server commands:", "", *[f"- `{r['command']}`" for r in rows]]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b", help="catalog name (pulled if missing) or .gguf")
    ap.add_argument(
        "--servers",
        default="edge:4,llama-server:4",
        help="edge:N[:BACKEND], edge:N:plan (with --plan), llama-server:N, ...",
    )
    ap.add_argument("--clients", default="1,4,8", help="load levels: concurrent streaming clients")
    ap.add_argument("--requests", type=int, default=2, help="requests per client per level (default 2)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument(
        "--prompt-tokens", type=int, default=500, help="the long prompts of the mix (default 500)"
    )
    ap.add_argument("--long-tokens", type=int, default=4000, help="the mid-load probe's prompt (0: no probe)")
    ap.add_argument("--ctx-size", type=int, default=6144, help="context per slot (llama-server: -c this x N)")
    ap.add_argument(
        "--plan", default=None, help="edge:N:plan servers: the phase plan (prefill=...,decode=...)"
    )
    ap.add_argument(
        "--threads", type=int, default=None, help="edge: its default; llama-server: physical cores"
    )
    ap.add_argument(
        "--precision",
        choices=("fast", "exact"),
        default=None,
        help="edge's --precision (default its own: fast); exact makes a soak's 'differ from alone' a bug check",
    )
    ap.add_argument("--llama-server", default=shutil.which("llama-server") or DEFAULT_LLAMA_SERVER)
    ap.add_argument("--soak", type=int, default=0, metavar="N", help="instead: N requests, 8 clients, drops")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--note", default=None, help="a line for the report (what the run is, the machine's state)"
    )
    ap.add_argument("--out", default=None, help="results stem (default benchmarks/results/serve-...)")
    args = ap.parse_args(argv)
    args.clients = [int(c) for c in args.clients.split(",")]
    specs = [parse_server(s) for s in args.servers.split(",")]
    if args.long_tokens and args.long_tokens + 64 > args.ctx_size:
        ap.error(f"--long-tokens {args.long_tokens} needs --ctx-size >= {args.long_tokens + 64}")
    if any(s.kind == "llama-server" for s in specs) and not Path(args.llama_server).is_file():
        ap.error(f"no llama-server at {args.llama_server} (--llama-server PATH; how to build it: --help)")

    from edge.models.checked import check_model

    checked = check_model(args.model)
    prompts = Prompts.sized(checked.tokenizer, args.prompt_tokens)
    long_prompt = sized_prompt(checked.tokenizer, args.long_tokens, 99) if args.long_tokens else None
    date = dt.date.today().isoformat()
    name = checked.name if args.model == checked.name else checked.path.stem
    stem = Path(args.out) if args.out else RESULTS / f"serve-{'soak' if args.soak else 'load'}-{name}-{date}"
    stem.parent.mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="serve-load-"))  # the servers' own output, kept for a failure
    print(f"server logs: {log_dir}", file=sys.stderr)
    try:
        rows = [measure(s, args, checked.path, prompts, long_prompt, log_dir) for s in specs]
    except RuntimeError as exc:  # a server that did not start: its command and log say why
        print(f"serve_load: {exc}", file=sys.stderr)
        return 1
    out = {
        "date": date,
        "model": name,
        "file": str(checked.path),
        "command": shlex.join(
            ["python", Path(sys.argv[0]).as_posix(), *(sys.argv[1:] if argv is None else argv)]
        ),
        "cpu": cpu_summary(lscpu()),
        "llama_server_version": llama_server_version(args.llama_server)
        if any(s.kind == "llama-server" for s in specs)
        else None,
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "note")},
        "note": args.note,
        "load_average_at_end": os.getloadavg(),
        "rows": rows,
    }
    stem.parent.joinpath(stem.name + ".json").write_text(json.dumps(out, indent=1) + "\n")
    lines = report(out)
    stem.parent.joinpath(stem.name + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
