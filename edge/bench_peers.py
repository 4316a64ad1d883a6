"""Peers measured in `edge bench` beside edge's backends, through their own pipelines (not the Decoder contract).

OpenVINO GenAI (`--backends ...,openvino-genai`, installed with `pip install "edge-llm[bench]"`) runs the same
GGUF with its own reader and graph (it loads F16/Q4_0/Q4_1/Q4_K/Q6_K/Q8_0 files); its perf metrics give the
time to first token and the time per output token. It runs on --device with its own default precision
(--precision is edge's; GenAI's own choice is what a user of it gets).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from edge.bench_config import BenchConfig, Sample
from edge.errors import BackendUnavailableError, EdgeError
from edge.models.checked import CheckedModel

__all__ = ["GENAI", "PEERS", "measure_peer"]

GENAI = "openvino-genai"
PEERS = (GENAI,)


def _genai() -> Any:
    try:
        import openvino_genai
    except Exception as exc:
        raise BackendUnavailableError(
            f"openvino-genai does not import: {exc}", hint='pip install "edge-llm[bench]"'
        ) from None
    return openvino_genai


def measure_peer(name: str, model: CheckedModel, prompt: list[int], cfg: BenchConfig, rss: Any) -> Sample:
    """One round of peer `name` on `model` (checked: its own GGUF reader is native code): load, the prompt,
    `gen_tokens` greedy tokens (EOS ignored), then another prompt of the same length (warm: shapes seen,
    nothing of it cached)."""
    if name != GENAI:
        raise EdgeError(f"unknown peer {name!r}", hint=f"peers: {', '.join(PEERS)}")
    og = _genai()
    import openvino as ov

    config: dict[str, Any] = {"INFERENCE_NUM_THREADS": cfg.threads} if cfg.threads else {}
    path = model.source().path  # an `edge convert` artifact: the GGUF it came from
    t0 = time.perf_counter()
    try:
        pipe = og.LLMPipeline(str(path), cfg.device.upper(), **config)
    except Exception as exc:
        raise EdgeError(
            f"OpenVINO GenAI cannot load {path.name}: {str(exc).splitlines()[0] if str(exc) else exc}",
            hint="it reads F16/Q4_0/Q4_1/Q4_K/Q6_K/Q8_0 GGUF files only; leave it out of --backends",
        ) from None
    load_s = time.perf_counter() - t0
    rss.sample()
    gen = og.GenerationConfig()
    gen.max_new_tokens = cfg.gen_tokens
    gen.ignore_eos = True  # speed, not text: always gen_tokens tokens

    def run(ids: list[int], max_new: int) -> Any:
        arr = np.array([ids], dtype=np.int64)
        gen.max_new_tokens = max_new
        inputs = og.TokenizedInputs(ov.Tensor(arr), ov.Tensor(np.ones_like(arr)))
        return pipe.generate(inputs, gen).perf_metrics

    first = run(prompt, cfg.gen_tokens)
    rss.sample()
    half = len(prompt) // 2
    warm = run(prompt[:1] + prompt[half:] + prompt[1:half], 1)  # same length, another prefix
    rss.sample()
    ttft_ms = float(first.get_ttft().mean)
    return Sample(
        load_s=load_s,
        ttft_ms=ttft_ms,
        prefill_tok_s=len(prompt) / (ttft_ms / 1e3),
        decode_tok_s=1e3 / float(first.get_tpot().mean),
        peak_rss_mb=rss.peak / 2**20,
        rss_growth_mb=(rss.peak - rss.baseline) / 2**20,
        prefill_warm_tok_s=len(prompt) / (float(warm.get_ttft().mean) / 1e3),
    )
