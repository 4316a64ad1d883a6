"""`edge bench --depth N` (llama-bench's -d): the prompt and decode measured with N tokens already in the KV, on
every backend, on a tiny GGUF with the real backends."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import edge.bench as bench
from edge.bench import BenchConfig, run_bench
from edge.devices.base import Decoder
from edge.errors import ContextOverflowError, EdgeError
from tests.tiny_models import TinySpec, write_tiny_model

pytestmark = pytest.mark.usefixtures("edge_cache")  # graphs built for the tiny file: a private cache

DEPTH, PROMPT, GEN = 40, 12, 6


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("depth") / "qwen2.gguf", TinySpec(arch="qwen2"))


def test_the_context_must_hold_the_depth_the_prompt_and_the_tokens() -> None:
    with pytest.raises(ContextOverflowError) as err:
        BenchConfig(depth=4096, ctx_size=4096, prompt_tokens=64, gen_tokens=64)
    text = str(err.value)
    assert "--depth 4096" in text and "--ctx-size 4096" in text and "4240" in text  # 4096 + 64 + 64 + 16
    assert err.value.hint and "--ctx-size 4240" in err.value.hint
    assert BenchConfig(depth=4096, ctx_size=4240, prompt_tokens=64, gen_tokens=64).n_ctx == 4240
    # left out, the context is what a round holds, rounded up to 256
    assert BenchConfig(depth=4096, prompt_tokens=64, gen_tokens=64).n_ctx == 4352
    assert BenchConfig(prompt_tokens=128, gen_tokens=128).n_ctx == 512
    with pytest.raises(ValueError, match="--depth must be >= 0"):
        BenchConfig(depth=-1)
    with pytest.raises(EdgeError, match="--depth"):
        BenchConfig(depth=8, draft="ngram")


def test_a_depth_that_does_not_fit_is_one_line_naming_both(tiny: Path) -> None:
    args = ["bench", str(tiny), "--depth", "500", "--ctx-size", "256", "--repeat", "1"]
    proc = subprocess.run(
        [sys.executable, "-m", "edge.cli", *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert "--depth 500" in line and "--ctx-size 256" in line


def test_a_peer_cannot_hold_the_depth_nor_take_the_context_size(tiny: Path) -> None:
    for asked, cfg in (
        ("--depth", BenchConfig(backends=("llamacpp", "openvino-genai"), depth=8, repeat=1)),
        ("--ctx-size", BenchConfig(backends=("llamacpp", "openvino-genai"), ctx_size=512, repeat=1)),
    ):
        with pytest.raises(EdgeError, match=f"{asked} does not apply to openvino-genai") as err:
            run_bench(str(tiny), cfg)
        assert err.value.hint and "openvino-genai" in err.value.hint


class _Spy:
    """A decoder that records (position before, tokens) of each forward."""

    def __init__(self, dec: Decoder, log: list[tuple[str, int, int]]) -> None:
        self._dec, self._log = dec, log

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        self._log.append((self._dec.backend, self._dec.position, len(tokens)))
        return self._dec.forward(tokens, last_only=last_only)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dec, name)


def test_every_backend_measures_the_prompt_and_decode_at_the_depth(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log: list[tuple[str, int, int]] = []
    real_open = bench._open
    monkeypatch.setattr(bench, "_open", lambda *a: _Spy(real_open(*a), log))
    backends = ("llamacpp", "ort", "openvino")
    cfg = BenchConfig(backends=backends, depth=DEPTH, prompt_tokens=PROMPT, gen_tokens=GEN, repeat=1)
    report = run_bench(str(tiny), cfg, on_step=None)
    out = report.to_dict()
    assert out["settings"]["depth"] == DEPTH and out["settings"]["n_ctx"] == 256
    for b in backends:
        calls = [(pos, n) for name, pos, n in log if name == b]
        # the depth's prefill into an empty KV, then the prompt after it, then each token
        assert calls[:3] == [(0, DEPTH), (DEPTH, PROMPT), (DEPTH + PROMPT, 1)]
        decode = [pos for pos, n in calls[2 : 2 + GEN]]
        assert decode == list(range(DEPTH + PROMPT, DEPTH + PROMPT + GEN))
        # the warm prompt runs at the same depth again (rolled back, or refilled untimed)
        assert calls[-1] == (DEPTH, PROMPT)
    for r in out["results"]:
        assert r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0 and r["prefill_warm_tok_s"] > 0
    assert "auto_record" not in report.notes  # speeds at a depth never decide --backend auto
    assert f"--depth {DEPTH} the first prompt follows" in report.notes["depth"]
    assert "depth 40, prompt 12" in _table_text(out)


def _table_text(report: dict[str, Any]) -> str:
    from rich.console import Console

    from edge.bench_report import bench_table

    console = Console(width=200, record=True, color_system=None)
    console.print(bench_table(report))
    return console.export_text()


def test_depth_zero_is_the_plain_bench(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[tuple[str, int, int]] = []
    real_open = bench._open
    monkeypatch.setattr(bench, "_open", lambda *a: _Spy(real_open(*a), log))
    cfg = BenchConfig(backends=("ort",), prompt_tokens=PROMPT, gen_tokens=2, repeat=1)
    report = run_bench(str(tiny), cfg).to_dict()
    assert log[0] == ("ort", 0, PROMPT) and log[-1] == ("ort", 0, PROMPT)
    assert report["settings"]["depth"] == 0 and f".gguf: prompt {PROMPT}," in _table_text(report)
    json.dumps(report)
