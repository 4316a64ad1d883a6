"""`edge bench`: speed and memory of backends on one model, measured side by side on the `Decoder` contract.

Backends run interleaved (A B A B ...) over the rounds, so drift of a noisy machine hits all of them alike.
Each round loads the backend afresh, prefills a fixed prompt (TTFT = prefill + choosing the first token)
and decodes `gen_tokens` greedy single-token forwards (EOS is ignored: this measures speed, not text).
With `depth` N (llama-bench's -d), N tokens of the same text are in the KV before the prompt, untimed.
"""

from __future__ import annotations

import platform
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from edge import __version__
from edge.bench_config import BATCH_SIZES, BenchConfig, Sample
from edge.bench_draft import DraftBenchResult, measure_draft
from edge.bench_peers import PEERS, measure_peer
from edge.data import read_text
from edge.devices.auto import (
    AUTO,
    AUTO_BACKENDS,
    HalfSpeed,
    Speed,
    choose_backend,
    machine_key,
    model_sha256,
    record_speeds,
)
from edge.devices.base import Decoder, rollback_reach
from edge.devices.discovery import discover
from edge.devices.registry import DecoderOptions, open_decoder, require_backend
from edge.errors import EdgeError
from edge.models.artifact import is_artifact
from edge.models.checked import CheckedModel, check_model
from edge.models.tokenizer import Tokenizer
from edge.roofline import Bandwidth, WeightBytes, measure_read_bandwidth, weight_bytes_per_token

__all__ = ["BenchConfig", "BenchReport", "Stat", "bench_prompt", "run_bench", "total_steps"]

RSS_METHOD = (
    "in-process: psutil RSS sampled every 20 ms by a thread from just before the load to the close, "
    "plus at each phase boundary; peak_rss_mb is the process peak in that window, rss_growth_mb is that "
    "peak minus the RSS just before the load (what the backend itself costs, weights mapped in included)"
)
LOAD_NOTE = (
    "load_cold_s is the first load of the backend in this process (the model file may already be in the OS "
    "page cache); load_s is the median of the later (warm) loads, or the cold one when --repeat 1"
)


@dataclass(frozen=True)
class Stat:
    median: float
    min: float
    max: float

    @staticmethod
    def of(values: Sequence[float]) -> Stat:
        return Stat(statistics.median(values), min(values), max(values))


@dataclass(frozen=True)
class BackendResult:
    backend: str
    device: str
    load_cold_s: float
    load_s: Stat  # warm loads (the cold one when there is a single round)
    ttft_ms: Stat
    prefill_tok_s: Stat  # the first prompt after load
    prefill_warm_tok_s: Stat
    decode_tok_s: Stat
    peak_rss_mb: Stat
    rss_growth_mb: Stat
    samples: tuple[Sample, ...]

    def to_dict(self, against: BackendResult, roofline: dict[str, Any]) -> dict[str, Any]:
        bound_tok_s = float(roofline["bound_tok_s"])
        out: dict[str, Any] = {"backend": self.backend, "device": self.device, "rounds": len(self.samples)}
        # the weights a token reads, against the file's (what llama.cpp reads), and the rate decode read them at
        file_bytes = int(roofline["weight_bytes_per_token"])
        read = self.samples[0].weights_read
        if read > 0:
            out["weight_bytes_read_per_token"] = read
            out["weight_bytes_ratio_to_file"] = round(read / file_bytes, 4)
            out["decode_read_gb_s"] = round(self.decode_tok_s.median * read / 1e9, 2)
            out["decode_bandwidth_fraction"] = round(out["decode_read_gb_s"] / roofline["bandwidth_gb_s"], 4)
        out["load_cold_s"] = round(self.load_cold_s, 4)
        for name, stat, digits in (
            ("load_s", self.load_s, 4),
            ("ttft_ms", self.ttft_ms, 2),
            ("prefill_tok_s", self.prefill_tok_s, 2),
            ("prefill_warm_tok_s", self.prefill_warm_tok_s, 2),
            ("decode_tok_s", self.decode_tok_s, 2),
            ("peak_rss_mb", self.peak_rss_mb, 1),
            ("rss_growth_mb", self.rss_growth_mb, 1),
        ):
            out[name] = round(stat.median, digits)
            out[f"{name}_min"] = round(stat.min, digits)
            out[f"{name}_max"] = round(stat.max, digits)
        out["ratio_decode"] = round(self.decode_tok_s.median / against.decode_tok_s.median, 4)
        out["ratio_prefill"] = round(self.prefill_tok_s.median / against.prefill_tok_s.median, 4)
        out["ratio_prefill_warm"] = round(
            self.prefill_warm_tok_s.median / against.prefill_warm_tok_s.median, 4
        )
        if all(s.batch_cost for s in self.samples):  # peers measured through their own pipelines: none
            out["batch_cost_steps"] = {
                str(k): round(statistics.median(s.batch_cost[i] for s in self.samples), 3)
                for i, k in enumerate(BATCH_SIZES)
            }
        if all(s.constrained_steps for s in self.samples):  # --json-schema: the mask's cost, same rounds
            out["constrained_decode_tok_s"] = round(
                statistics.median(s.constrained_decode_tok_s for s in self.samples), 2
            )
            out["ratio_constrained_decode"] = round(
                statistics.median(
                    s.constrained_decode_tok_s / s.plain_decode_same_steps_tok_s for s in self.samples
                ),
                4,
            )
        if all(s.step_by_step_tok_s for s in self.samples):
            out["fast_forward_tok_s"] = round(
                statistics.median(s.fast_forward_tok_s for s in self.samples), 2
            )
            out["ratio_fast_forward"] = round(
                statistics.median(s.fast_forward_tok_s / s.step_by_step_tok_s for s in self.samples), 4
            )
            out["fast_forward_identical"] = all(s.fast_forward_identical for s in self.samples)
            out["forced_tokens"] = self.samples[0].forced_tokens
        out["ratio_ttft"] = round(self.ttft_ms.median / against.ttft_ms.median, 4)
        out["decode_roofline_fraction"] = round(self.decode_tok_s.median / bound_tok_s, 4)
        out["samples"] = {
            k: [round(getattr(s, k), 4) for s in self.samples]
            for k in Sample.__dataclass_fields__
            if k not in ("partitions", "batch_cost")
        }
        if self.samples[0].partitions:
            out["partitions"] = [
                {
                    "partition": label,
                    "prefill_ms": round(statistics.median(s.partitions[i][1] for s in self.samples), 2),
                    "decode_ms_per_token": round(
                        statistics.median(s.partitions[i][2] for s in self.samples), 3
                    ),
                }
                for i, (label, _, _) in enumerate(self.samples[0].partitions)
            ]
        return out


@dataclass(frozen=True)
class BenchReport:
    model: str
    path: str
    config: BenchConfig
    machine: dict[str, Any]
    results: tuple[BackendResult, ...]
    roofline: dict[str, Any]
    notes: dict[str, str] = field(default_factory=dict)
    draft: DraftBenchResult | None = None

    @property
    def against(self) -> BackendResult:
        return next(r for r in self.results if r.backend == self.config.against)

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "model": self.model,
            "file": self.path,
            "edge_version": __version__,
            "settings": {
                "backends": list(c.backends),
                "plans": list(c.plans),
                "against": c.against,
                "device": c.device,
                "prompt_tokens": c.prompt_tokens,
                "gen_tokens": c.gen_tokens,
                "repeat": c.repeat,
                "threads": self.machine["threads"],
                "depth": c.depth,
                "n_ctx": c.n_ctx,
                "kv_dtype": c.kv_dtype,
                "order": "interleaved: each round runs every backend once, in the order given",
            },
            "machine": self.machine,
            "results": [r.to_dict(self.against, self.roofline) for r in self.results],
            "roofline": self.roofline,
            "notes": self.notes,
            "draft": None if self.draft is None else self.draft.to_dict(),
        }


def bench_prompt(tokenizer: Tokenizer, n: int) -> list[int]:
    """Exactly n token ids from the shipped text (BOS first when the model wants one), cycled if needed."""
    text_ids = tokenizer.encode(read_text(), parse_special=False)
    if not text_ids:
        raise EdgeError("the shipped benchmark text encodes to no tokens")
    head = [tokenizer.bos_id] if tokenizer.add_bos and tokenizer.bos_id is not None else []
    body: list[int] = []
    while len(head) + len(body) < n:
        body.extend(text_ids)
    return (head + body)[:n]


class _PeakRss:
    """Peak RSS of this process while active, sampled by a thread (ctypes calls release the GIL)."""

    def __init__(self, interval_s: float = 0.02) -> None:
        self._proc = psutil.Process()
        self._interval = interval_s
        self._stop = threading.Event()
        self.baseline = self.peak = self._proc.memory_info().rss
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()

    def sample(self) -> None:
        self.peak = max(self.peak, self._proc.memory_info().rss)

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _open(entry: str, model: CheckedModel, cfg: BenchConfig) -> Decoder:
    if entry in cfg.plans:
        from edge.devices.phase_split import is_phase_plan
        from edge.devices.planned import DeviceRequest, PlannedOptions, open_requested

        if is_phase_plan(entry):  # prefill=...,decode=...: the model split by phase
            # prefill=openvino:npu-emulated,...: the NPU-shaped prefill half on the CPU (--emulate's)
            emulated = entry.replace(":npu-emulated", ":npu")
            request = DeviceRequest(phases=emulated, emulate=emulated != entry)
        else:
            emulate = entry == "npu-emulated"
            request = DeviceRequest(None, "npu" if emulate else entry, None, emulate)
        popts = PlannedOptions(
            n_ctx=cfg.n_ctx, threads=cfg.threads, precision=cfg.precision, kv_dtype=cfg.kv_dtype
        )
        return open_requested(model, request, popts)[0]
    dopts = DecoderOptions(
        n_ctx=cfg.n_ctx, n_threads=cfg.threads, precision=cfg.precision, kv_dtype=cfg.kv_dtype
    )
    return open_decoder(entry, model, cfg.device, dopts)


def _batch_costs(dec: Decoder, token: int, reps: int = 3) -> tuple[float, ...]:
    """Median time of a k-token forward (then rolled back) over a one-token forward's, per k (BATCH_SIZES
    starts at 1, so k=1 is 1.0: the generation loop's own overhead, which dominates on tiny models, stays
    out of the ratio)."""
    medians = []
    for k in BATCH_SIZES:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            dec.forward([token] * k)
            times.append(time.perf_counter() - t0)
            dec.rollback(k)
        medians.append(statistics.median(times))
    return tuple(m / medians[0] for m in medians)


def _partition_times(dec: Decoder) -> list[float]:
    parts = dec.capabilities().partitions
    return [] if parts is None else list(parts.partition_times())


def _fill(dec: Decoder, context: list[int]) -> None:
    """The depth's tokens into an empty KV, untimed (llama-bench's -d)."""
    if context:
        dec.forward(context, last_only=True)


def _back_to_depth(dec: Decoder, context: list[int]) -> None:
    """The KV holding the depth's tokens only again: rolled back where the decoder reaches that far, else
    emptied and filled anew (untimed either way)."""
    extra = dec.position - len(context)
    reach = rollback_reach(dec)
    if context and (reach is None or reach >= extra):
        dec.rollback(extra)
        return
    dec.reset()
    _fill(dec, context)


def _measure(
    entry: str, model: CheckedModel, context: list[int], prompt: list[int], cfg: BenchConfig
) -> Sample:
    """One round of `entry`: load, `context` into the KV untimed, then the timed prompt and decode."""
    if entry in PEERS:
        with _PeakRss() as rss:
            return measure_peer(entry, model, prompt, cfg, rss)
    with _PeakRss() as rss:
        t0 = time.perf_counter()
        dec = _open(entry, model, cfg)
        load_s = time.perf_counter() - t0
        try:
            _fill(dec, context)
            rss.sample()
            p0 = _partition_times(dec)
            t0 = time.perf_counter()
            logits = dec.forward(prompt, last_only=True)
            t_prefill = time.perf_counter() - t0
            token = int(np.argmax(logits[-1]))
            ttft = time.perf_counter() - t0
            rss.sample()
            p1 = _partition_times(dec)
            steps = []
            for _ in range(cfg.gen_tokens):
                ts = time.perf_counter()
                token = int(np.argmax(dec.forward([token], last_only=True)[-1]))
                steps.append(time.perf_counter() - ts)
            t_decode = sum(steps)
            rss.sample()
            p2 = _partition_times(dec)
            batch = _batch_costs(dec, token)
            constrained = _constrained_decode(dec, model, prompt, cfg) if cfg.grammar else (0, 0.0)
            jumps = _fast_forward(dec, model, prompt, cfg) if cfg.grammar else _Jumps()
            _back_to_depth(dec, context)
            t0 = time.perf_counter()
            dec.forward(prompt, last_only=True)
            t_warm = time.perf_counter() - t0
            rss.sample()
            caps = dec.capabilities()
            parts_of, weights_read = caps.partitions, caps.weights_read or 0
            labels = [p.label for p in parts_of.partition_info()] if parts_of is not None else []
        finally:
            dec.close()
    mb = 2**20
    parts = tuple(
        (label, (p1[i] - p0[i]) * 1e3, (p2[i] - p1[i]) * 1e3 / cfg.gen_tokens)
        for i, label in enumerate(labels if len(p0) == len(labels) else [])
    )
    return Sample(
        weights_read=weights_read,
        load_s=load_s,
        ttft_ms=ttft * 1e3,
        prefill_tok_s=len(prompt) / t_prefill,
        decode_tok_s=cfg.gen_tokens / t_decode,
        peak_rss_mb=rss.peak / mb,
        rss_growth_mb=(rss.peak - rss.baseline) / mb,
        prefill_warm_tok_s=len(prompt) / t_warm,
        batch_cost=batch,
        partitions=parts,
        constrained_decode_tok_s=constrained[0] / constrained[1] if constrained[1] else 0.0,
        plain_decode_same_steps_tok_s=constrained[0] / sum(steps[: constrained[0]])
        if constrained[0]
        else 0.0,
        constrained_steps=constrained[0],
        fast_forward_tok_s=jumps.fast_tok_s,
        step_by_step_tok_s=jumps.step_tok_s,
        fast_forward_identical=jumps.identical,
        forced_tokens=jumps.forced,
    )


@dataclass(frozen=True)
class _Jumps:
    fast_tok_s: float = 0.0
    step_tok_s: float = 0.0
    identical: bool = True
    forced: int = 0


def _fast_forward(dec: Decoder, model: CheckedModel, prompt: list[int], cfg: BenchConfig) -> _Jumps:
    """The same greedy generation under `cfg.grammar` with and without fast-forward, through the generation
    loop itself: decode tok/s (tokens after the prompt over the time after it) of each."""
    from edge.generate import Generation, GenerationConfig

    runs = []
    for fast in (True, False):
        gen_cfg = GenerationConfig(max_tokens=cfg.gen_tokens, grammar=cfg.grammar, fast_forward=fast)
        gen = Generation(dec, model.tokenizer, prompt, gen_cfg)
        gen.run()
        runs.append(gen)
    fast, step = runs
    forced = fast.stats.forced.forced if fast.stats.forced is not None else 0
    return _Jumps(
        fast.stats.n_tokens / fast.stats.decode_s if fast.stats.decode_s else 0.0,
        step.stats.n_tokens / step.stats.decode_s if step.stats.decode_s else 0.0,
        fast.token_ids == step.token_ids,
        forced,
    )


def _constrained_decode(
    dec: Decoder, model: CheckedModel, prompt: list[int], cfg: BenchConfig
) -> tuple[int, float]:
    """Greedy decode steps under `cfg.grammar` after the prompt, shaped as the plain loop's: each one the
    forward of the last token, the mask, the masked argmax and the grammar's advance (what a constrained
    generation pays a token): (steps, seconds). Stops at gen_tokens or when the grammar's value is complete."""
    from edge.grammar import compile_grammar
    from edge.sampling import Sampler, SamplingConfig

    assert cfg.grammar is not None
    dec.reset()
    constraint = compile_grammar(cfg.grammar, model.tokenizer, dec.vocab_size)
    greedy = Sampler(SamplingConfig())  # the generation loop's own masked draw

    def choose(row: np.ndarray) -> int:
        token = greedy(row, (), constraint.allowed())
        constraint.advance(token)
        return token

    token = choose(dec.forward(prompt, last_only=True)[-1])
    n, t0 = 0, time.perf_counter()
    while n < cfg.gen_tokens and not constraint.done:
        token = choose(dec.forward([token], last_only=True)[-1])
        n += 1
    return n, time.perf_counter() - t0


def machine_info(threads: int | None) -> dict[str, Any]:
    inv = discover()
    cpu = inv.cpu
    return {
        "cpu": cpu.model,
        "arch": cpu.arch,
        "physical_cores": cpu.physical_cores,
        "logical_cores": cpu.logical_cores,
        "threads": threads or cpu.physical_cores,
        "isa": [k for k, v in cpu.isa.items() if v],
        "memory_total_mb": inv.memory_total_mb,
        "memory_available_mb": inv.memory_available_mb,
        "os": inv.os,
        "versions": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "edge": __version__,
            **{b.name: b.version for b in inv.backends if b.available},
        },
        "backends_unavailable": {b.name: b.reason for b in inv.backends if not b.available},
        # how a backend runs here (llama.cpp: the configuration that passed its known-answer check)
        "backend_notes": {b.name: b.note for b in inv.backends if b.note},
    }


def total_steps(cfg: BenchConfig) -> int:
    """Steps `run_bench` announces through `on_step`: the bandwidth measurement, then backends x rounds."""
    return 1 + cfg.repeat * len(cfg.entries) + (1 if cfg.draft else 0)


def run_bench(model: str, cfg: BenchConfig, on_step: Callable[[str, int], None] | None = None) -> BenchReport:
    """Measure every backend `cfg.repeat` times, interleaved; `on_step(what, steps_done)` before each step."""
    step = on_step or (lambda _what, _done: None)
    for b in cfg.backends:  # fail before measuring anything
        if b not in PEERS and b != AUTO:
            require_backend(b)
    peers = [b for b in cfg.backends if b in PEERS]
    for asked, given in (("--depth", cfg.depth), ("--ctx-size", cfg.ctx_size is not None)):
        if given and peers:  # a peer's own pipeline sizes its context itself: it would not be what was asked
            raise EdgeError(
                f"{asked} does not apply to {peers[0]} (measured through its own pipeline)",
                hint=f"leave {peers[0]} out of --backends, or measure it without {asked}",
            )
    checked = check_model(model)  # before llama.cpp or OpenVINO GenAI reads the file
    if cfg.draft not in (None, "", "none", "auto", "ngram"):
        check_model(cfg.draft)  # a draft model file that fails its checks fails before any measuring
    path, gguf, tokenizer = checked.path, checked.gguf, checked.tokenizer
    cfg, auto_note = _resolve_auto(cfg, path)
    ids = bench_prompt(tokenizer, cfg.depth + cfg.prompt_tokens)  # the prompt continues the depth's text
    context, prompt = ids[: cfg.depth], ids[cfg.depth :]
    machine = machine_info(cfg.threads)
    load_start = round(psutil.getloadavg()[0], 2)

    step("memory bandwidth", 0)
    weights = weight_bytes_per_token(gguf)
    bw = measure_read_bandwidth(machine["threads"])
    entries = cfg.entries
    samples: dict[str, list[Sample]] = {b: [] for b in entries}
    for r in range(cfg.repeat):
        for b in entries:
            step(f"round {r + 1}/{cfg.repeat} {b}", 1 + r * len(entries) + entries.index(b))
            samples[b].append(_measure(b, checked, context, prompt, cfg))
    draft = None
    if cfg.draft:
        step(f"draft {cfg.draft}: {cfg.repeat} rounds", 1 + cfg.repeat * len(entries))
        draft = measure_draft(
            checked,
            prompt,
            draft=cfg.draft,
            backend=cfg.against,
            device=cfg.device,
            draft_device=cfg.draft_device,
            draft_k=cfg.draft_k,
            gen_tokens=cfg.gen_tokens,
            repeat=cfg.repeat,
            n_ctx=cfg.n_ctx + cfg.draft_k,
            threads=cfg.threads,
            precision=cfg.precision,
            grammar=cfg.grammar,
            kv_dtype=cfg.kv_dtype,
        )

    # Other work on the machine skews every figure; the load average says how busy it was.
    machine["load_avg_1m"] = {"start": load_start, "end": round(psutil.getloadavg()[0], 2)}
    results = [_backend_result(b, ss, cfg) for b, ss in samples.items()]
    roofline = _roofline(bw, weights)
    notes = {"rss": RSS_METHOD, "load": LOAD_NOTE}
    if auto_note:
        notes["auto"] = auto_note
    if cfg.depth:  # the untimed depth ran the prompt kernels first: not a cold first prompt any more
        notes["depth"] = (
            f"at --depth {cfg.depth} the first prompt follows the depth's untimed prefill (the kernels' first runs "
            "are paid there): read it as a second prompt, not as the first after load"
        )
    if _record_for_auto(path, cfg, results):
        notes["auto_record"] = (
            "these medians now decide --backend auto for this file on this machine (devices/auto.py)"
        )
    return BenchReport(model, str(path), cfg, machine, tuple(results), roofline, notes, draft)


def _backend_result(backend: str, samples: list[Sample], cfg: BenchConfig) -> BackendResult:
    """One backend's rounds as medians; the first load is the cold one, the later ones the warm figure."""
    warm = [s.load_s for s in samples[1:]] or [samples[0].load_s]
    return BackendResult(
        backend=backend,
        device=cfg.device if backend in cfg.backends else "plan",
        load_cold_s=samples[0].load_s,
        load_s=Stat.of(warm),
        ttft_ms=Stat.of([s.ttft_ms for s in samples]),
        prefill_tok_s=Stat.of([s.prefill_tok_s for s in samples]),
        prefill_warm_tok_s=Stat.of([s.prefill_warm_tok_s for s in samples]),
        decode_tok_s=Stat.of([s.decode_tok_s for s in samples]),
        peak_rss_mb=Stat.of([s.peak_rss_mb for s in samples]),
        rss_growth_mb=Stat.of([s.rss_growth_mb for s in samples]),
        samples=tuple(samples),
    )


def _roofline(bw: Bandwidth, weights: WeightBytes) -> dict[str, Any]:
    """The decode bound a memory-bound step allows: measured read bandwidth / weight bytes read per token."""
    bound = bw.gb_s * 1e9 / weights.bytes_per_token
    return {
        "bandwidth_gb_s": round(bw.gb_s, 2),
        "bandwidth_median_gb_s": round(bw.median_gb_s, 2),
        "bandwidth_single_thread_gb_s": round(bw.single_thread_gb_s, 2),
        "bandwidth_method": bw.method,
        "weight_bytes_per_token": weights.bytes_per_token,
        "total_tensor_bytes": weights.total_tensor_bytes,
        "excluded_tensors": list(weights.excluded),
        "weights_note": weights.note + "; KV-cache reads not counted",
        "bound_tok_s": round(bound, 1),
    }


def _resolve_auto(cfg: BenchConfig, path: Path) -> tuple[BenchConfig, str | None]:
    """`auto` in --backends becomes the backend `--backend auto` runs this model on, with why."""
    if AUTO not in cfg.backends:
        return cfg, None
    if cfg.device != "cpu" or is_artifact(path):
        raise EdgeError(
            "--backends auto chooses between backends for a GGUF file on the CPU",
            hint="name the backends, e.g. --backends ort,openvino",
        )
    choice = choose_backend(path, precision=cfg.precision, threads=cfg.threads)
    # a split by phase: the single backend it beat, and the split as a plan beside it
    single = choice.backend if choice.split is None or not choice.split.chosen else choice.split.single
    backends = tuple(dict.fromkeys(single if b == AUTO else b for b in cfg.backends))
    against = single if cfg.against == AUTO else cfg.against
    plans = cfg.plans if choice.plan is None else tuple(dict.fromkeys((*cfg.plans, choice.plan)))
    # the choice alone: this run's table is the machine's own figures, and the prior's are another machine's
    return replace(cfg, backends=backends, against=against, plans=plans), choice.explain(figures=False)


# the shortest bench run whose rates --backend auto takes (its reference request is 128 + 128 tokens)
AUTO_MIN_PROMPT, AUTO_MIN_GEN = 64, 32


def _record_for_auto(path: Path, cfg: BenchConfig, results: Sequence[BackendResult]) -> bool:
    """Hand this run's medians to `--backend auto` (a GGUF on the CPU, two or more of its backends, runs long
    enough for a rate: a quick smoke run must not replace the measurement auto decides by)."""
    if cfg.device != "cpu" or is_artifact(path):
        return False
    if cfg.prompt_tokens < AUTO_MIN_PROMPT or cfg.gen_tokens < AUTO_MIN_GEN or cfg.depth:
        return False  # too short for a rate, or at a depth: auto decides by an empty KV's speeds
    if cfg.kv_dtype != "auto":
        return False  # auto decides by the KV types it loads with
    speeds = {
        r.backend: Speed(r.prefill_tok_s.median, r.decode_tok_s.median, r.prefill_warm_tok_s.median)
        for r in results
        if r.backend in AUTO_BACKENDS
    }
    source = f"edge bench, {cfg.repeat} round(s), {cfg.prompt_tokens}-token prompt, {cfg.gen_tokens} decoded"
    halves = _measured_halves(cfg, results)
    return record_speeds(model_sha256(path), machine_key(cfg.threads), cfg.precision, speeds, source, halves)


def _measured_halves(cfg: BenchConfig, results: Sequence[BackendResult]) -> dict[str, HalfSpeed]:
    """What each CPU half of the run's phase plans measured, named as the plan's backend label names it
    (`openvino:bf16`): the prefill half its prompts (first and warm), the decode half its tokens."""
    from edge.devices.phase_split import is_phase_plan, parse_phase_plan

    halves: dict[str, HalfSpeed] = {}
    for r in results:
        if r.backend not in cfg.plans or not is_phase_plan(r.backend):
            continue
        split = parse_phase_plan(r.backend, cfg.precision)
        measured = (
            (split.prefill, HalfSpeed(r.prefill_tok_s.median, r.prefill_warm_tok_s.median)),
            (split.decode, HalfSpeed(decode_tok_s=r.decode_tok_s.median)),
        )
        for half, speed in measured:
            if half.device == "cpu":
                key = split.half_label(half)
                halves[key] = halves[key].slowest(speed) if key in halves else speed
    return halves
