"""Several clients at once: all served, none dropped, a full queue is a 429, a client that leaves cancels its
generation within one decode step, stopping the server ends what runs and waits the OpenAI way, and memory
stays flat."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from edge.server import Limits, Server
from edge.server.scheduler import JobRecord, Scheduler
from tests.server.conftest import LONG_CTX

LONG_LIMITS = Limits(max_tokens=LONG_CTX)  # generations of seconds even on the tiny model
LONG = {
    "model": "tiny.gguf",
    "messages": [{"role": "user", "content": "w1"}],
    "max_tokens": 30_000,
    "temperature": 0,
}


def scheduler(server: Server) -> Scheduler:
    return server.registry.loaded()["tiny.gguf"]


def wait_idle(sched: Scheduler, timeout: float = 10.0) -> float:
    t0 = time.monotonic()
    while sched.busy:
        assert time.monotonic() - t0 < timeout, "the model stayed busy"
        time.sleep(0.01)
    return time.monotonic() - t0


def last_record(sched: Scheduler) -> JobRecord:
    return sched.records[-1]


@pytest.mark.parametrize("parallel, backend", [(1, "llamacpp"), (2, "ort")])
def test_four_streaming_clients_all_complete_with_their_own_answers(
    start_server: Callable[..., Server], parallel: int, backend: str
) -> None:
    # NOTE: ORT's slots at exact are batch-invariant, so answers equal alone's token for token; llama.cpp's
    # rows round with the batch (tests/edge/test_llamacpp_slots.py compares those up to near-ties)
    s = start_server(parallel=parallel, backend=backend, precision="exact")
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
    prompts = [f"w{i} w{i + 1}" for i in range(4)]

    def ask(p: str) -> str:
        stream = c.chat.completions.create(
            model="tiny.gguf",
            messages=[{"role": "user", "content": p}],
            max_tokens=40,
            temperature=0,
            stream=True,
        )
        return "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)

    expected = {p: ask(p) for p in prompts}
    got: dict[str, list[str]] = {p: [] for p in prompts}
    threads = [threading.Thread(target=lambda p=p: got[p].append(ask(p))) for p in prompts for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == {p: [expected[p]] * 2 for p in prompts}  # none dropped, no tokens mixed between requests
    assert scheduler(s).stats()["completed"] == 12


def test_llamacpp_parallel_is_slots_of_one_model(start_server: Callable[..., Server]) -> None:
    """`--parallel 3` on llama.cpp: 3 sequences of one llama.cpp context (one copy of the weights), their
    tokens decoded in shared native batches; every request completes."""
    s = start_server(parallel=3)
    sched = scheduler(s)
    assert sched.stats()["mode"] == "slots" and sched.stats()["replicas"] == 3
    engine = sched.replicas[0].batch_engine
    assert engine is not None and all(m.batch_engine is engine for m in sched.replicas)
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
    done: list[str] = []

    def ask(p: str) -> None:
        r = c.chat.completions.create(
            model="tiny.gguf", messages=[{"role": "user", "content": p}], max_tokens=40, temperature=0
        )
        assert r.choices[0].finish_reason in ("stop", "length") and r.usage is not None
        done.append(r.choices[0].message.content or "")

    threads = [threading.Thread(target=ask, args=(f"w{i} " * (1 + 5 * i),)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(done) == 6 and sched.stats()["completed"] == 6
    assert engine.mean_batch > 1.5, engine.mean_batch  # steps carried several requests


def test_parallel_slots_batch_every_request_into_shared_steps(start_server: Callable[..., Server]) -> None:
    """`--parallel 4` on an own graph: 4 slots of one model (one copy of the weights), every active request in
    each step; at --precision exact each answer equals the answer alone, token for token."""
    alone = start_server(backend="ort", precision="exact")
    s = start_server(backend="ort", precision="exact", parallel=4)
    sched = scheduler(s)
    assert sched.stats()["mode"] == "slots" and sched.stats()["replicas"] == 4
    engine = sched.replicas[0].batch_engine
    assert engine is not None and all(m.batch_engine is engine for m in sched.replicas)

    batches: list[float | None] = []

    def ask(server: Server, p: str) -> str:
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        stream = c.chat.completions.create(
            model="tiny.gguf",
            messages=[{"role": "user", "content": p}],
            max_tokens=48,
            temperature=0,
            stream=True,
        )
        text = ""
        for ch in stream:
            text += ch.choices[0].delta.content or "" if ch.choices else ""
            if (ch.model_extra or {}).get("edge"):
                batches.append(ch.model_extra["edge"]["batch"])  # type: ignore[index]
        return text

    prompts = [f"w{i} " * (1 + 9 * i) for i in range(6)]  # mixed lengths: prefill beside others' decode
    expected = {p: ask(alone, p) for p in prompts}
    assert batches == [None] * len(prompts)  # no slots: no batch
    batches.clear()
    got: dict[str, list[str]] = {p: [] for p in prompts}
    threads = [threading.Thread(target=lambda p=p: got[p].append(ask(s, p))) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == {p: [expected[p]] for p in prompts}
    health = httpx.get(s.url + "/health").json()["models"]["tiny.gguf"]
    assert health["mode"] == "slots" and health["completed"] == len(prompts)
    assert health["batch"]["mean_batch"] > 1.5, health  # steps really carried several requests
    assert len(batches) == len(prompts) and all(b is not None and b >= 1 for b in batches)
    assert max(b for b in batches if b is not None) > 2  # each response says the batch it rode in


def test_a_shared_system_prompt_is_copied_from_a_busy_slot(start_server: Callable[..., Server]) -> None:
    """Two clients with one long system prompt: while the first streams on one slot, the second, on the other,
    copies the system prompt's KV from it instead of prefilling it, and answers as it would alone."""
    system = {"role": "system", "content": " ".join(f"rule{i}" for i in range(120))}
    ask_2 = [system, {"role": "user", "content": "w3 w4"}]
    alone = start_server(backend="ort", precision="exact")
    c = openai.OpenAI(base_url=alone.url + "/v1", api_key="x", max_retries=0)
    want = c.chat.completions.create(model="tiny.gguf", messages=ask_2, max_tokens=16, temperature=0)  # type: ignore[arg-type]

    s = start_server(backend="ort", precision="exact", parallel=2, n_ctx=LONG_CTX, limits=LONG_LIMITS)
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
    first = c.chat.completions.create(
        model="tiny.gguf",
        messages=[system, {"role": "user", "content": "w1"}],  # type: ignore[list-item]
        max_tokens=400,
        temperature=0,
        stream=True,
    )
    chunks = iter(first)
    while not next(chunks).choices[0].delta.content:  # its first token: its prompt is in the KV
        pass
    got = c.chat.completions.create(model="tiny.gguf", messages=ask_2, max_tokens=16, temperature=0)  # type: ignore[arg-type]
    first.close()
    assert got.usage is not None and want.usage is not None
    cached = got.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    assert cached is not None and cached > 120  # the system prompt, copied
    assert got.choices[0].message.content == want.choices[0].message.content


def test_disconnect_mid_stream_cancels_within_one_decode_step(start_server: Callable[..., Server]) -> None:
    s = start_server(n_ctx=LONG_CTX, limits=LONG_LIMITS)
    sched = scheduler(s)
    with httpx.stream("POST", s.url + "/v1/chat/completions", json={**LONG, "stream": True}) as r:
        lines = r.iter_lines()
        got = [line for line, _ in zip(lines, range(6), strict=False) if line.startswith("data:")]
        assert len(got) >= 3
    wait_idle(sched)
    record = last_record(sched)
    assert record.stop_reason == "cancelled" and 2 <= record.n_tokens < 30_000  # stopped mid-stream
    assert record.polls_after_cancel is not None and record.polls_after_cancel <= 1
    ok = httpx.post(s.url + "/v1/chat/completions", json={**LONG, "max_tokens": 3})  # the model is free again
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 3


def test_disconnect_while_waiting_for_a_non_streamed_answer_cancels(
    start_server: Callable[..., Server],
) -> None:
    s = start_server(n_ctx=LONG_CTX, limits=LONG_LIMITS)
    sched = scheduler(s)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(s.url + "/v1/chat/completions", json=LONG, timeout=httpx.Timeout(5, read=0.3))
    wait_idle(sched)
    record = last_record(sched)
    assert record.stop_reason == "cancelled" and record.polls_after_cancel is not None
    assert record.polls_after_cancel <= 1


def test_full_queue_is_a_429_with_retry_after(start_server: Callable[..., Server]) -> None:
    s = start_server(n_ctx=LONG_CTX, limits=Limits(queue_size=1, max_tokens=LONG_CTX))
    url = s.url + "/v1/chat/completions"
    with (
        httpx.stream("POST", url, json={**LONG, "stream": True}) as running,
        httpx.stream("POST", url, json={**LONG, "stream": True}) as waiting,
    ):
        lines = running.iter_lines()  # NOTE: keep the iterator: a dropped one closes the connection
        next(lines)
        assert waiting.status_code == 200  # queued (its SSE response has started)
        r = httpx.post(url, json=LONG)
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_error"
    wait_idle(scheduler(s))
    assert httpx.post(url, json={**LONG, "max_tokens": 2}).status_code == 200


def test_stopping_the_server_ends_in_flight_requests_the_openai_way(
    start_server: Callable[..., Server],
) -> None:
    s = start_server(n_ctx=LONG_CTX, limits=LONG_LIMITS, grace_s=0.3)
    sched = scheduler(s)
    url = s.url + "/v1/chat/completions"
    lines: list[str] = []
    queued: list[httpx.Response] = []

    def read() -> None:
        with httpx.stream("POST", url, json={**LONG, "stream": True}, timeout=30) as r:
            lines.extend(r.iter_lines())

    reader = threading.Thread(target=read)
    reader.start()
    while not sched.stats()["running"]:
        time.sleep(0.01)
    waiter = threading.Thread(target=lambda: queued.append(httpx.post(url, json=LONG, timeout=30)))
    waiter.start()
    while not sched.stats()["queued"]:
        time.sleep(0.01)
    t0 = time.monotonic()
    s.stop()
    reader.join(10)
    waiter.join(10)
    assert not reader.is_alive() and not waiter.is_alive() and time.monotonic() - t0 < 8
    events = [line for line in lines if line.startswith("data:")]
    last = json.loads(events[-2].removeprefix("data:"))  # the running one: its text so far, marked cut
    assert events[-1] == "data: [DONE]" and len(events) > 3
    assert last["choices"][0]["finish_reason"] == "length" and last["edge"]["stop_reason"] == "shutdown"
    assert queued[0].status_code == 503  # the queued one never started
    assert queued[0].json()["error"]["code"] == "server_shutting_down"
    assert sched.records and last_record(sched).stop_reason == "cancelled"
    assert sched.stats()["running"] == 0


def test_a_second_stop_ends_the_grace_at_once(start_server: Callable[..., Server]) -> None:
    s = start_server(n_ctx=LONG_CTX, limits=LONG_LIMITS, grace_s=60)
    sched = scheduler(s)
    lines: list[str] = []

    def read() -> None:
        with httpx.stream("POST", s.url + "/v1/chat/completions", json={**LONG, "stream": True}) as r:
            lines.extend(r.iter_lines())

    reader = threading.Thread(target=read)
    reader.start()
    while not sched.stats()["running"]:
        time.sleep(0.01)
    s.drain.ask()  # the first Ctrl+C: a minute of grace
    t0 = time.monotonic()
    s.stop()  # the second
    reader.join(10)
    assert not reader.is_alive() and time.monotonic() - t0 < 8
    events = [line for line in lines if line.startswith("data:")]
    assert events[-1] == "data: [DONE]" and '"stop_reason":"shutdown"' in events[-2]


def test_sequential_requests_leave_rss_flat(server: Server) -> None:
    """A short version of benchmarks/serve_load.py --rss (1,000 requests there)."""
    proc = psutil.Process()
    with httpx.Client(base_url=server.url, timeout=30) as http:

        def burst(n: int) -> None:
            for i in range(n):
                body = {"model": "tiny.gguf", "messages": [{"role": "user", "content": f"w{i % 50}"}]}
                r = http.post("/v1/chat/completions", json={**body, "max_tokens": 8, "stream": i % 2 == 0})
                assert r.status_code == 200

        burst(60)  # warm up allocators and caches
        before = proc.memory_info().rss
        burst(200)
        after = proc.memory_info().rss
    assert after < before * 1.05, f"RSS grew from {before >> 20} MiB to {after >> 20} MiB"


def test_soak_on_slots_with_random_disconnects_loses_and_mixes_nothing(
    tiny_model: Path, tmp_path: Path
) -> None:
    """A short version of benchmarks/serve_load.py --soak, on `edge serve --parallel 4` in its own process:
    480 streamed requests from 8 clients, a third dropped by their client after a random number of chunks.
    Every finished answer is its prompt's answer alone (nothing lost or mixed between slots); every dropped one
    freed its slot (the server ends idle, all requests completed or cancelled); the server's RSS stays flat."""
    err = tmp_path / "stderr.txt"
    cmd = [sys.executable, "-m", "edge.cli", "serve", str(tiny_model), "--port", "0", "--backend", "ort"]
    cmd += ["--precision", "exact", "--parallel", "4", "--threads", "1"]
    with err.open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=sink, env=os.environ.copy())
    try:
        end = time.monotonic() + 120
        while "serving " not in (log := err.read_text()):
            assert proc.poll() is None and time.monotonic() < end, log
            time.sleep(0.05)
        url = log.split("serving ", 1)[1].split(" at ", 1)[1].split("/v1", 1)[0]
        _soak(url, psutil.Process(proc.pid), random.Random(0))
    finally:
        proc.kill()
        proc.wait()


def _soak(url: str, server: psutil.Process, rng: random.Random) -> None:
    prompts = [f"w{i} " * (1 + 5 * i) for i in range(8)]

    def ask(p: str, drop_after: int | None) -> str | None:
        msgs = [{"role": "user", "content": p}]
        body = {"model": "tiny.gguf", "messages": msgs, "max_tokens": 24, "temperature": 0, "stream": True}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            lines = []
            for line in r.iter_lines():
                if not line:
                    continue
                lines.append(line)
                if drop_after is not None and len(lines) > drop_after:
                    return None  # the client leaves mid-stream
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(x.removeprefix("data:")) for x in lines if x.startswith("data:{")]
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])

    expected = {p: ask(p, None) for p in prompts}
    wrong: list[tuple[str, str | None]] = []
    counts = {"done": 0, "dropped": 0}
    lock = threading.Lock()
    plans = [[(rng.choice(prompts), rng.randrange(2, 20) if rng.random() < 1 / 3 else None) for _ in range(10)]
             for _ in range(6 * 8)]  # fmt: skip

    def client(plan: list[tuple[str, int | None]]) -> None:
        for p, drop in plan:
            got = ask(p, drop)
            with lock:
                counts["dropped" if drop is not None else "done"] += 1
                if drop is None and got != expected[p]:
                    wrong.append((p, got))

    def soak(round_: int) -> int:
        clients = [threading.Thread(target=client, args=(plans[8 * round_ + i],)) for i in range(8)]
        for t in clients:
            t.start()
        for t in clients:
            t.join(240)
        assert not any(t.is_alive() for t in clients)
        end = time.monotonic() + 30
        while (h := httpx.get(url + "/health").json()["models"]["tiny.gguf"])["running"] or h["queued"]:
            assert time.monotonic() < end, h
            time.sleep(0.05)
        return int(server.memory_info().rss)

    rss = [soak(r) for r in range(6)]
    assert not wrong, wrong[:2]
    assert counts["done"] + counts["dropped"] == 480 and counts["dropped"] > 60
    h = httpx.get(url + "/health").json()["models"]["tiny.gguf"]
    assert h["mode"] == "slots" and h["completed"] == 480 + len(prompts)
    assert h["batch"]["mean_batch"] > 2
    # the first round grows the runtime's arenas to the batched shapes; after it, flat
    assert rss[-1] < rss[1] * 1.05, f"the server's RSS grew: {[r >> 20 for r in rss]} MiB"


def test_serve_takes_a_phase_plan(start_server: Callable[..., Server]) -> None:
    """`edge serve --plan prefill=...,decode=...`: prompts on one graph, tokens on another; at exact the answer
    is the single backend's, and the response names both halves."""
    msgs = [{"role": "user", "content": "w1 " * 40}]
    body = {"model": "tiny.gguf", "messages": msgs, "max_tokens": 12, "temperature": 0}
    alone = start_server(backend="ort", precision="exact")
    split = start_server(backend=None, precision="exact", plan="prefill=openvino:cpu,decode=ort:cpu")
    want = httpx.post(alone.url + "/v1/chat/completions", json=body, timeout=60).json()
    got = httpx.post(split.url + "/v1/chat/completions", json=body, timeout=60).json()
    assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
    assert "+" in got["edge"]["backend"], got["edge"]  # e.g. openvino+ort:cpu
