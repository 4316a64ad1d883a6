"""One model split by phase: prompts on one graph (backend, device, precision), decode steps on another, over one
ring-buffer KV cache that this decoder owns.

A prompt chunk is a big matrix product (a matrix engine's work: OpenVINO in bf16); a decode step reads every
weight once for one row (the int8 paths' work: ORT at fast). `PhaseSplitDecoder` holds two `GraphDecoder`s of
the same file and KV geometry and builds each step's inputs against its own cache with the chosen half's
`step_feeds` (as a batch slot does, devices/batch.py), runs that half's graph and commits the new K/V itself.
The halves' own caches are never written (zero pages, not resident).

Which half runs a forward depends on its length only: more than `threshold` tokens (default WINDOW, the most a
staged window carries) is a prompt, every chunk of it on the prefill half (its last, shorter chunk too); the
rest (decode steps, speculative verifies, a short follow-up turn) run on the decode half, whose staging the
split keeps (`staged`: RingDecoder.forward cuts short forwards at window ends).

The prefill half may have static shapes (an NPU's: `--plan prefill=openvino:npu,...`, `--emulate` for the
NPU-shaped graphs compiled on the CPU): a PartitionedDecoder whose fixed-width prefill graph binds every KV
slot. It then runs a prompt itself, in its own chunks (padded to its width), on the split's ring, which it is
handed for the forward; the decode half is built with that ring's capacity.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from edge.devices.base import Capabilities, Decoder, PhaseSplit
from edge.devices.batch import BatchEngine
from edge.devices.graph_decoder import GraphDecoder, GraphOptions
from edge.devices.memory import check_slots_fit
from edge.devices.partitioned import PartitionedDecoder
from edge.devices.precision import BF16, HALF_PRECISIONS
from edge.devices.ring_decoder import RingDecoder
from edge.errors import DeviceError, PlanError
from edge.kvcache.staging import WINDOW
from edge.models.gguf_file import GGUFFile

__all__ = [
    "PhaseHalf",
    "PhasePlan",
    "PhaseSplitDecoder",
    "is_phase_plan",
    "open_phase_split",
    "parse_phase_plan",
]

PLAN_SYNTAX = "prefill=BACKEND:DEVICE[:PRECISION],decode=BACKEND:DEVICE[:PRECISION]"
GRAPH_BACKENDS = ("ort", "openvino")  # a half runs edge's own graph (llama.cpp owns its KV)


@dataclass(frozen=True)
class PhaseHalf:
    backend: str
    device: str
    precision: str

    @property
    def label(self) -> str:
        return f"{self.backend}:{self.device}:{self.precision}"


@dataclass(frozen=True)
class PhasePlan:
    """`--plan prefill=B:D[:P],decode=B:D[:P]`: which (backend, device, precision) runs each phase."""

    prefill: PhaseHalf
    decode: PhaseHalf
    precision: str  # the run's --precision (a half that names none takes it)

    @property
    def backend(self) -> str:
        """What `edge run --json` names as the backend: both halves, a precision where it is not the run's
        (e.g. "openvino:bf16+ort")."""
        return "+".join(self.half_label(h) for h in (self.prefill, self.decode))

    def half_label(self, half: PhaseHalf) -> str:
        """One half as `backend` names it: "openvino:bf16", or "ort" at the run's precision (as auto records
        and reads the halves' speeds, devices/auto_split.py)."""
        return half.backend + ("" if half.precision == self.precision else f":{half.precision}")

    @property
    def device(self) -> str:
        return "+".join(dict.fromkeys((self.prefill.device, self.decode.device)))


def is_phase_plan(text: str) -> bool:
    """Whether a --plan value is a phase plan (else a device plan: hetero:..., npu-emulated)."""
    return "prefill=" in text or "decode=" in text


def _half(phase: str, spec: str, precision: str) -> PhaseHalf:
    parts = spec.split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise PlanError(
            f"--plan {phase}={spec!r} is not BACKEND:DEVICE[:PRECISION]", hint=f"e.g. {PLAN_SYNTAX}"
        )
    backend, device = parts[0], parts[1]
    prec = parts[2] if len(parts) == 3 else precision
    if backend not in GRAPH_BACKENDS:
        raise PlanError(
            f"--plan {phase} names {backend!r}; a phase's half runs edge's own graph: ort or openvino",
            hint="llama.cpp holds its own KV cache, so it cannot share one with another half",
        )
    if prec not in HALF_PRECISIONS:
        raise PlanError(f"--plan {phase} precision {prec!r} is not one of {', '.join(HALF_PRECISIONS)}")
    if prec == BF16 and (backend, device) != ("openvino", "cpu"):
        raise PlanError(
            f"--plan {phase}={spec}: bf16 is OpenVINO's CPU precision", hint="use openvino:cpu:bf16"
        )
    return PhaseHalf(backend, device, prec)


def parse_phase_plan(text: str, precision: str) -> PhasePlan:
    """A phase plan from its text; `precision` is the run's, for halves that name none. PlanError when it does
    not parse."""
    halves: dict[str, PhaseHalf] = {}
    for item in text.split(","):
        phase, eq, spec = item.strip().partition("=")
        if not eq or phase not in ("prefill", "decode"):
            raise PlanError(
                f"--plan {text!r}: {item.strip()!r} is not prefill=... or decode=...", hint=PLAN_SYNTAX
            )
        if phase in halves:
            raise PlanError(f"--plan {text!r} names {phase} twice", hint=PLAN_SYNTAX)
        halves[phase] = _half(phase, spec.strip(), precision)
    if set(halves) != {"prefill", "decode"}:
        raise PlanError(f"--plan {text!r} must name both halves", hint=PLAN_SYNTAX)
    return PhasePlan(halves["prefill"], halves["decode"], precision)


Half = GraphDecoder | PartitionedDecoder  # a static-shape prefill half is a PartitionedDecoder


def _check_geometry(prefill: Half, decode: Half) -> None:
    """Both halves must read and write the same KV: the same layers, KV heads, head size, layer kinds and
    slots (each layer's capacity and window)."""
    a, b = prefill.cfg, decode.cfg
    pairs = {
        "layers": (a.n_layer, b.n_layer),
        "KV heads": (a.n_head_kv, b.n_head_kv),
        "head size": (a.head_dim, b.head_dim),
        "vocabulary": (a.n_vocab, b.n_vocab),
        "KV type": (prefill.kv_dtype, decode.kv_dtype),
        "layer kinds": (prefill._kinds, decode._kinds),
        "KV slots": (
            [(x.capacity, x.window) for x in prefill._specs],
            [(x.capacity, x.window) for x in decode._specs],
        ),
    }
    differ = [f"{k} {x} vs {y}" for k, (x, y) in pairs.items() if x != y]
    if differ:
        raise PlanError(
            f"the phase halves do not share a KV geometry ({'; '.join(differ)})",
            hint="both halves must run the same model file with the same context size and --kv-dtype",
        )
    if decode._bind_all:
        raise PlanError(
            "a decode half with static shapes (NPU-shaped) is not in this version of edge",
            hint="name the NPU for the prefill half: --plan prefill=openvino:npu,decode=ort:cpu",
        )
    if prefill._bind_all and not isinstance(prefill, PartitionedDecoder):
        raise PlanError("a static-shape prefill half comes from an NPU-shaped plan (a PartitionedDecoder)")


class PhaseSplitDecoder(RingDecoder):
    """`Decoder` whose prompts run on one graph decoder and whose decode steps run on another (module docstring)."""

    def __init__(
        self,
        prefill: Half,
        decode: GraphDecoder,
        *,
        threshold: int = WINDOW,
        labels: tuple[str, str] | None = None,
        backend: str | None = None,
    ) -> None:
        _check_geometry(prefill, decode)
        if threshold < 1:
            raise ValueError(f"the phase threshold must be >= 1 token, got {threshold}")
        self._halves = (prefill, decode)
        self._threshold = threshold
        self._labels = labels or tuple(f"{h.backend}:{h.device}:{h.options.precision}" for h in self._halves)
        self.backend = backend or f"{prefill.backend}+{decode.backend}"
        self.device = "+".join(dict.fromkeys((prefill.device, decode.device)))
        self.staged = decode.staged  # short forwards are the decode half's, cut at its windows
        self.first_run_costs = prefill.first_run_costs or decode.first_run_costs
        self.weights_read = decode.capabilities().weights_read  # a token is the decode half's
        self._init_ring_of(decode.cfg, decode.options)  # a static decode half is refused (_check_geometry)
        # a static prefill half runs prompts itself on this ring (_forward_static); its own is dropped
        self._static = prefill if isinstance(prefill, PartitionedDecoder) and prefill._bind_all else None
        if self._static is not None:
            self._static.cache = self.cache
        self._long = False  # the forward being run goes to the prefill half
        self.seconds = [0.0, 0.0]  # graph time of each half since load (prefill, decode)
        self._batched = False  # split into slots (`slots`): the batch engine runs both graphs from then on

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        # NOTE: the whole forward's length picks the half, so a prompt's last, short chunk stays on it
        self._long = len(tokens) > self._threshold
        if self._long and self._static is not None:
            return self._forward_static(self._static, tokens, last_only)
        return super().forward(tokens, last_only=last_only)

    @property
    def max_sink(self) -> int:
        """As RingDecoder's; with a static prefill half, one of its padded chunks must still fit beside them."""
        own = super().max_sink
        return own if self._static is None else min(own, self._static.max_sink)

    def _forward_static(self, half: PartitionedDecoder, tokens: Sequence[int], last_only: bool) -> np.ndarray:
        """A prompt on the static prefill half: its chunking (its graph's width, padded), this split's ring."""
        if self._batched:
            raise DeviceError("this decoder was split into slots; use the slots", hint="see Model.slots")
        with self._lock:
            half.cache = self.cache  # set_sink may have replaced the ring since the last prompt
            t0 = time.perf_counter()
            try:
                return half.forward(tokens, last_only=last_only)
            finally:
                self.seconds[0] += time.perf_counter() - t0

    def _step(
        self, ids: Sequence[int], last_only: bool, *, window: bool = False, score: bool = True
    ) -> np.ndarray:
        if self._batched:  # its graphs are the batch engine's now: two threads on one runner would race
            raise DeviceError("this decoder was split into slots; use the slots", hint="see Model.slots")
        i = 0 if self._long else 1
        half = self._halves[i]
        view = self.cache.begin(len(ids))
        if view.dropped:
            raise self._overflowed()
        feeds = half.step_feeds(self, view, ids, last_only, window=window, score=score)
        t0 = time.perf_counter()
        out = half.run(feeds)
        self.seconds[i] += time.perf_counter() - t0
        self.cache.commit(out[1::2], out[2::2])
        return out[0][0]

    def capabilities(self) -> Capabilities:
        # NOTE: not batch-invariant: a prompt's rows come from another graph than a decode step's
        batches = all(h.capabilities().batching is not None for h in self._halves)
        return Capabilities(
            max_rollback=self.max_rollback,
            sinks=self,
            staged=self.staged,
            first_run_costs=self.first_run_costs,
            weights_read=self.weights_read,
            truncation=self,
            phases=self._phases,
            batching=self if batches else None,
        )

    @property
    def _phases(self) -> PhaseSplit:
        return PhaseSplit(self._labels[0], self._labels[1], self._threshold)

    def slots(self, n: int) -> list[Decoder]:
        """`Batching`: n decoders, each its own KV, over this split's two graphs: a slot's prompts run on the
        prefill half alone, its decode steps packed with the other slots' on the decode half (devices/batch.py).
        Once: this decoder no longer steps on its own, and its own KV is freed."""
        if self._batched:
            raise DeviceError("this decoder was split into slots already", hint="load the model again")
        if self._static is not None:
            raise DeviceError(
                "a static-shape (NPU) prefill half runs one sequence", hint="serve it with replicas"
            )
        check_slots_fit(n, self.cache.nbytes)
        prefill, decode = self._halves
        engine = BatchEngine(decode, prefill=prefill, phases=self._phases, backend=self.backend)
        slots: list[Decoder] = list(engine.slots(n))
        self._batched = True
        self.cache = self._new_cache(self.cache.sink)  # NOTE: a fresh ring's buffers are untouched zero pages
        return slots

    def close(self) -> None:
        if self._batched:  # the batch engine closes both halves with its last slot
            return
        for half in self._halves:
            half.close()


def open_phase_split(
    gguf: GGUFFile,
    plan: PhasePlan,
    *,
    capacity: int,
    threads: int | None = None,
    static_prefill: Callable[[], PartitionedDecoder] | None = None,
    slots: bool = False,
    kv_dtype: str = "f32",
) -> PhaseSplitDecoder:
    """Both halves of `plan` on the file (each builds or reuses its cached graph), as one decoder.
    `static_prefill`: opens the prefill half as an NPU-shaped plan (devices/planned.py); the decode half then
    takes its ring's capacity. `slots`: the split will be split into slots, whose decode rows the decode half
    packs (its attention per slot; the prefill half runs one prompt at a time). `kv_dtype`: the one ring's type
    (f32 | f16), which both halves' graphs read."""

    def half(h: PhaseHalf, kv: int, per_slot: bool = False) -> GraphDecoder:
        opts = GraphOptions(
            backend=h.backend,
            device=h.device,
            capacity=kv,
            threads=threads,
            precision=h.precision,
            slot_axis=per_slot,
            kv_dtype=kv_dtype,
        )
        return GraphDecoder(gguf, opts)

    prefill: Half = static_prefill() if static_prefill is not None else half(plan.prefill, capacity)
    if static_prefill is not None:  # the static graph's global layers hold this many slots
        capacity = max((s.capacity for s in prefill._specs if s.window is None), default=capacity)
    try:
        decode = half(plan.decode, capacity, slots)
    except BaseException:
        prefill.close()
        raise
    try:
        labels = (plan.prefill.label, plan.decode.label)
        return PhaseSplitDecoder(prefill, decode, labels=labels, backend=plan.backend)
    except BaseException:
        prefill.close()
        decode.close()
        raise
