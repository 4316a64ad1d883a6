"""`edge serve` (the real CLI, smollm2-135m) stopped by SIGTERM or SIGINT while 4 streamed and 4 non-streamed
requests of the real openai client run or wait in its queue: each ends the OpenAI way, never cut silently.

A request cut at the end of the grace keeps its text so far, marked incomplete (finish_reason "length",
`edge.stop_reason` "shutdown"; streamed: that last chunk, then [DONE]); one that never started is a 503
`server_shutting_down` (streamed: an SSE error event, which the openai client raises as an APIError). The
process exits 0 and writes nothing to stderr but its log lines.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.shared_cache import pull_named_models

pytestmark = pytest.mark.slow
MODEL = "smollm2-135m"
LONG = "Write the numbers from 1 to 5000 separated by commas."  # smollm2 runs on to max_tokens here
SHORT = "Name a fruit."


@dataclass
class Outcome:
    """How one request ended, as its client saw it."""

    stream: bool
    text: str = ""
    finish: str | None = None
    edge: dict[str, Any] | None = None
    error: openai.APIError | None = None
    raw: bytearray = field(default_factory=bytearray)  # the response body as it came over the wire
    first_text: threading.Event = field(default_factory=threading.Event)  # a streamed one's text has begun


class _Recorded(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, into: bytearray) -> None:
        self.inner, self.into = inner, into

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.inner:
            self.into += chunk
            yield chunk

    def close(self) -> None:
        self.inner.close()


class Tee(httpx.HTTPTransport):
    """Keeps the raw body of what the openai client reads: its Stream hides whether [DONE] came."""

    def __init__(self, into: bytearray) -> None:
        super().__init__()
        self.into = into

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        r = super().handle_request(request)
        assert isinstance(r.stream, httpx.SyncByteStream)
        return httpx.Response(
            r.status_code, headers=r.headers, stream=_Recorded(r.stream, self.into), extensions=r.extensions
        )


@dataclass
class Serve:
    proc: subprocess.Popen[bytes]
    url: str
    stderr: Path

    def stats(self) -> dict[str, int]:
        return httpx.get(self.url + "/health", timeout=10).json()["models"][MODEL]

    def wait_for(
        self, test: Callable[[dict[str, int]], bool], what: str, timeout: float = 60
    ) -> dict[str, int]:
        end = time.monotonic() + timeout
        while not test(stats := self.stats()):
            assert time.monotonic() < end, f"the server never had {what}: {stats}"
            time.sleep(0.02)
        return stats

    def ask(self, prompt: str, *, stream: bool, max_tokens: int, out: Outcome | None = None) -> Outcome:
        out = out or Outcome(stream)
        c = openai.OpenAI(
            base_url=self.url + "/v1",
            api_key="x",
            max_retries=0,
            timeout=120,
            http_client=httpx.Client(transport=Tee(out.raw)),
        )
        args: dict[str, Any] = {
            "model": MODEL,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        try:
            if stream:
                for ch in c.chat.completions.create(**args, stream=True):
                    out.text += ch.choices[0].delta.content or ""
                    if out.text:
                        out.first_text.set()
                    if ch.choices[0].finish_reason is not None:
                        out.finish, out.edge = ch.choices[0].finish_reason, (ch.model_extra or {}).get("edge")
            else:
                r = c.chat.completions.create(**args)
                out.text, out.finish = r.choices[0].message.content or "", r.choices[0].finish_reason
                out.edge = (r.model_extra or {}).get("edge")
        except openai.APIError as exc:
            out.error = exc
        return out

    def end(self, timeout: float = 60) -> tuple[int, str]:
        """The exit status and the stderr of the process, once it exits."""
        try:
            rc = self.proc.wait(timeout)
        finally:
            self.proc.kill()
        return rc, self.stderr.read_text()


@pytest.fixture
def serve(tmp_path: Path, edge_cache: Path) -> Iterator[Callable[..., Serve]]:
    """Start `edge serve` processes (`serve(*flags)`); they are killed at the end if still alive."""
    pull_named_models([MODEL])
    procs: list[subprocess.Popen[bytes]] = []

    def start(*flags: str) -> Serve:
        err = tmp_path / f"stderr-{len(procs)}.txt"
        cmd = [sys.executable, "-m", "edge.cli", "serve", MODEL, "--port", "0", "--backend", "llamacpp"]
        with err.open("wb") as sink:
            proc = subprocess.Popen(
                [*cmd, "--threads", "1", *flags],
                stdout=subprocess.DEVNULL,
                stderr=sink,
                env=os.environ.copy(),
            )
        procs.append(proc)
        end = time.monotonic() + 120
        # "edge: serving smollm2-135m at http://...:PORT/v1", then the warm-up (a request would wait for it)
        while "warmed up" not in (log := err.read_text()):
            assert proc.poll() is None and time.monotonic() < end, log
            time.sleep(0.05)
        url = log.split("serving ", 1)[1].split(" at ", 1)[1].split("/v1", 1)[0]
        return Serve(proc, url, err)

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def run_all(jobs: list[Callable[[], Outcome]]) -> tuple[list[threading.Thread], list[Outcome | None]]:
    results: list[Outcome | None] = [None] * len(jobs)

    def one(i: int) -> None:
        results[i] = jobs[i]()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    return threads, results


def assert_clean_log(rc: int, stderr: str) -> None:
    assert rc == 0, stderr
    assert "Traceback" not in stderr and "CancelledError" not in stderr, stderr
    assert all(line.startswith("edge: ") for line in stderr.splitlines()), stderr


def assert_cut_with_its_text(out: Outcome) -> None:
    assert out.error is None and out.text, out
    assert out.finish == "length" and out.edge is not None and out.edge["stop_reason"] == "shutdown"
    if out.stream:  # the final chunk, then [DONE]
        events = [line for line in out.raw.decode().splitlines() if line.startswith("data:")]
        assert '"finish_reason":"length"' in events[-2] and events[-1] == "data: [DONE]"


def assert_refused_before_it_began(out: Outcome) -> None:
    assert out.error is not None and out.error.code == "server_shutting_down", out
    assert out.finish is None and out.text == ""
    if not out.stream:
        assert isinstance(out.error, openai.APIStatusError) and out.error.status_code == 503


# The signal lands once the running request has text: a streamed one is watched; for a non-streamed one the
# same prompt is asked first (its KV is then reused) and the lead runs for twice that request's time
@pytest.mark.parametrize(
    ("sig", "lead_streams"), [(signal.SIGTERM, True), (signal.SIGINT, False)], ids=["SIGTERM", "SIGINT"]
)
def test_a_signal_ends_running_and_queued_requests_the_openai_way(
    serve: Callable[..., Serve], sig: signal.Signals, lead_streams: bool
) -> None:
    s = serve("--grace", "1")
    t0 = time.monotonic()
    assert s.ask(LONG, stream=False, max_tokens=2).error is None
    two_tokens_s = time.monotonic() - t0
    lead = Outcome(lead_streams)  # the one running (--parallel 1)
    threads, _ = run_all([lambda: s.ask(LONG, stream=lead_streams, max_tokens=3000, out=lead)])
    s.wait_for(lambda st: st["running"] == 1, "the first request running")
    if lead_streams:
        assert lead.first_text.wait(60)
    else:
        time.sleep(2 * two_tokens_s)  # its prompt is in the KV: it has text by then
    kinds = [not lead_streams] * 4 + [lead_streams] * 3  # 7 behind it: 4 streamed and 4 not in all
    behind, waiting = run_all([lambda st=st: s.ask(LONG, stream=st, max_tokens=3000) for st in kinds])
    s.wait_for(lambda st: st["queued"] == 7, "7 requests queued")
    s.proc.send_signal(sig)
    for t in threads + behind:
        t.join(60)
    rc, stderr = s.end()
    assert_cut_with_its_text(lead)
    for out in waiting:
        assert out is not None
        assert_refused_before_it_began(out)
    assert_clean_log(rc, stderr)
    assert "grace over: 1 running request(s) end with their text so far, 7 queued get a 503" in stderr


def test_requests_that_finish_within_the_grace_are_answered_whole(serve: Callable[..., Serve]) -> None:
    s = serve("--grace", "60")
    jobs = [lambda st=st: s.ask(LONG, stream=st, max_tokens=40) for st in [True, False] * 2]
    threads, results = run_all(jobs)
    at_signal = s.wait_for(lambda st: st["running"] + st["queued"] + st["completed"] == 4, "4 requests")
    s.proc.send_signal(signal.SIGTERM)
    health = httpx.get(s.url + "/health", timeout=10)  # the drain has begun once /health says so
    while health.status_code == 200:
        health = httpx.get(s.url + "/health", timeout=10)
    assert health.status_code == 503 and health.json()["status"] == "stopping"
    late = s.ask(SHORT, stream=False, max_tokens=4)  # one that comes during the drain
    for t in threads:
        t.join(120)
    rc, stderr = s.end()
    assert at_signal["queued"] >= 1  # the queue went on being served during the grace
    for out in results:
        assert out is not None and out.error is None and out.text, out
        assert out.finish in ("stop", "length") and out.edge is not None
        assert out.edge["stop_reason"] in ("eos", "stop", "length")
        if out.stream:
            assert out.raw.decode().rstrip().endswith("data: [DONE]")
    assert_refused_before_it_began(late)
    assert_clean_log(rc, stderr)
    assert "grace over" not in stderr
