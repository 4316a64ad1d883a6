"""Every decoder edge can open keeps the whole `Decoder` contract (devices/base.py): the core calls, and the
optional abilities it declares in `capabilities()` (a bounded rollback, sinks, partitions) work as declared.

Run on a tiny generated model: every runnable backend of the registry, a partitioned artifact split across
two backends, and the NPU-shaped (static) plan emulated on the CPU. Core ML has no Decoder (its models are
exported only; prediction needs macOS): the registry says so and refuses to open it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from edge.devices.base import Capabilities, Decoder
from edge.devices.partitioned import PartitionedOptions, open_artifact_decoder
from edge.devices.planned import DeviceRequest, PlannedOptions, open_requested
from edge.devices.registry import DecoderOptions, open_decoder, require_backend, runnable_backends
from edge.errors import BackendUnavailableError, DeviceError
from edge.models.convert import ConvertOptions, convert
from tests.tiny_models import TinySpec, write_tiny_model

pytestmark = pytest.mark.usefixtures("edge_cache")

SPEC = TinySpec(seed=11)
IDS = [1, *range(300, 311)]  # 12 tokens
CTX = 128


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("conformance") / "tiny.gguf", SPEC)


def _partitioned(path: Path, tmp: Path) -> Decoder:
    art = tmp / "art"
    convert(path, art, ConvertOptions(target="openvino", ranges="0-0,1-1", precision="exact"))
    opts = PartitionedOptions(capacity=CTX, threads=1)
    return open_artifact_decoder(art, [("ort", "cpu"), ("openvino", "cpu")], options=opts)


def _npu_emulated(path: Path, tmp: Path) -> Decoder:
    opts = PlannedOptions(n_ctx=CTX, threads=1, prefill_chunk=8, static_capacity=64, precision="exact")
    return open_requested(path, DeviceRequest(None, "npu", None, emulate=True), opts)[0]


def _backend(name: str) -> Callable[[Path, Path], Decoder]:
    def opener(path: Path, tmp: Path) -> Decoder:
        return open_decoder(name, path, "cpu", DecoderOptions(n_ctx=CTX, n_threads=1, precision="exact"))

    return opener


def _batch_slot(backend: str) -> Callable[[Path, Path], Decoder]:
    """A slot of a batch (devices/batch.py, devices/llamacpp_batch.py) keeps the contract too; its sibling
    decodes beside it meanwhile."""

    def opener(path: Path, tmp: Path) -> Decoder:
        return _slot_beside_a_sibling(_backend(backend)(path, tmp))

    return opener


def _slot_beside_a_sibling(base: Decoder) -> Decoder:
    import threading

    batching = base.capabilities().batching
    assert batching is not None, f"{base.backend} declares batching"
    slot, sibling = batching.slots(2)

    errors: list[BaseException] = []

    def busy() -> None:
        try:
            for i in range(40):
                sibling.forward([1 + i % 7])
        except BaseException as exc:  # seen by the check below, not lost with the thread
            errors.append(exc)
        finally:
            sibling.close()

    thread = threading.Thread(target=busy, daemon=True)
    thread.start()

    def sibling_ran_clean() -> None:
        thread.join(timeout=60)
        assert not thread.is_alive(), "the sibling slot hung"
        assert not errors, f"the sibling slot failed: {errors[0]!r}"

    _AFTER.append(sibling_ran_clean)
    return slot


def _phase_split(path: Path, tmp: Path) -> Decoder:
    """Prompts on OpenVINO, the rest on ORT, one KV (devices/phase_split.py); a threshold of 4 tokens sends
    this file's 12-token forwards to the prefill half and its short ones to the decode half."""
    from edge.devices.graph_decoder import GraphDecoder, GraphOptions
    from edge.devices.phase_split import PhaseSplitDecoder
    from edge.models.gguf_file import open_gguf

    gg = open_gguf(path)
    halves = [GraphDecoder(gg, GraphOptions(backend=b, capacity=CTX, threads=1)) for b in ("openvino", "ort")]
    return PhaseSplitDecoder(*halves, threshold=4)


# checks an opener leaves for after its decoder is closed (a batch slot's sibling thread)
_AFTER: list[Callable[[], None]] = []

# name -> (how to open it, whether it is partitioned)
CASES: dict[str, tuple[Callable[[Path, Path], Decoder], bool]] = {
    **{name: (_backend(name), False) for name in runnable_backends()},
    "partitioned:ort+openvino": (_partitioned, True),
    "npu-emulated(static)": (_npu_emulated, True),
    **{f"batch-slot({b})": (_batch_slot(b), False) for b in ("ort", "llamacpp") if b in runnable_backends()},
    "phase-split(openvino+ort)": (_phase_split, False),
}


@pytest.fixture(params=list(CASES))
def case(request: pytest.FixtureRequest, model_file: Path, tmp_path: Path) -> Iterator[tuple[Decoder, bool]]:
    opener, partitioned = CASES[request.param]
    dec = opener(model_file, tmp_path)
    try:
        yield dec, partitioned
    finally:
        checks, _AFTER[:] = list(_AFTER), []  # this case's, whatever happens below
        try:
            dec.close()
        finally:
            for check in checks:
                check()


def _same(a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_core_contract(case: tuple[Decoder, bool]) -> None:
    dec, _ = case
    assert isinstance(dec, Decoder)
    assert dec.backend and dec.device and dec.n_ctx >= CTX // 2 and dec.vocab_size == SPEC.n_vocab
    assert dec.position == 0 and dec.kv_fill().position == 0 and dec.kv_fill().fill == 0
    full = dec.forward(IDS)
    assert full.shape == (len(IDS), SPEC.n_vocab) and np.isfinite(full).all()
    kv = dec.kv_fill()
    assert dec.position == kv.position == kv.fill == len(IDS) <= kv.capacity
    # a rollback within the declared limit leaves the state a fresh prefill of the rest would find
    limit = dec.capabilities().max_rollback
    k = 3 if limit is None else min(3, limit)
    dec.rollback(k)
    assert dec.position == len(IDS) - k
    _same(dec.forward(IDS[-k:]), full[-k:])
    last = dec.forward([IDS[0]], last_only=True)
    assert last.shape == (1, SPEC.n_vocab) and dec.position == len(IDS) + 1
    dec.reset()
    assert dec.position == 0 and dec.kv_fill().fill == 0
    _same(dec.forward(IDS[:6], last_only=True)[0], full[5])
    dec.close()
    with pytest.raises(DeviceError):
        dec.forward([1])


def test_declared_rollback_limit_is_exact(case: tuple[Decoder, bool]) -> None:
    dec, _ = case
    caps = dec.capabilities()
    assert isinstance(caps, Capabilities)
    n = 3 * len(IDS)
    for _ in range(3):
        dec.forward(IDS)
    if caps.max_rollback is None:  # unbounded: back to the first token
        dec.rollback(n - 1)
        assert dec.position == 1
        return
    assert 0 < caps.max_rollback < n  # more was fed than the undo log holds
    # a declared Truncation may reach further right now (a ring that has not wrapped), never less far
    reach = caps.max_rollback if caps.truncation is None else caps.truncation.rollback_reach()
    assert caps.max_rollback <= reach <= n
    with pytest.raises(ValueError):
        dec.rollback(reach + 1)
    assert dec.position == n  # a refused rollback changes nothing
    dec.rollback(caps.max_rollback)
    assert dec.position == n - caps.max_rollback


def test_truncation_when_declared(case: tuple[Decoder, bool]) -> None:
    """Rolling back beyond the undo log, as far as `rollback_reach` says, leaves the state a fresh prefill of
    the rest would find."""
    dec, _ = case
    truncation = dec.capabilities().truncation
    limit = dec.capabilities().max_rollback
    if truncation is None:
        return
    full = dec.forward(IDS)
    dec.forward(IDS)
    assert truncation.rollback_reach() == 2 * len(IDS)  # nothing wrapped: back to the start
    deep = 2 * len(IDS) - 3
    assert limit is not None and deep > limit
    dec.rollback(deep)
    assert dec.position == 3
    _same(dec.forward(IDS[3:]), full[3:])


def test_sinks_when_declared(case: tuple[Decoder, bool]) -> None:
    dec, _ = case
    sinks = dec.capabilities().sinks
    kv = dec.kv_fill()
    if sinks is None:
        assert not kv.ring and kv.sink == 0  # only a ring pins tokens
        return
    assert kv.ring and 0 < kv.sink <= sinks.max_sink
    dec.forward(IDS)
    assert sinks.set_sink(sinks.max_sink) is True
    assert dec.position == 0 and dec.kv_fill().sink == sinks.max_sink  # a new geometry starts empty
    assert sinks.set_sink(sinks.max_sink) is False
    assert sinks.set_sink(10**6) is False  # clamped to the bound
    dec.forward(IDS)
    assert dec.position == len(IDS)


def test_partitions_when_declared(case: tuple[Decoder, bool]) -> None:
    dec, partitioned = case
    parts = dec.capabilities().partitions
    assert (parts is not None) == partitioned
    if parts is None:
        return
    info = parts.partition_info()
    assert [i for p in info for i in p.layers] == list(range(SPEC.n_layer))
    assert [p.head for p in info] == [False] * (len(info) - 1) + [True]
    before = parts.partition_times()
    dec.forward(IDS)
    after = parts.partition_times()
    assert len(before) == len(after) == len(info)
    assert all(b > a for a, b in zip(before, after, strict=True))
    assert all(p.label.endswith(f"{p.backend}:{p.device}") for p in info)


def test_phases_when_declared(case: tuple[Decoder, bool], request: pytest.FixtureRequest) -> None:
    """A phase split names both halves; nothing else declares one."""
    dec, _ = case
    phases = dec.capabilities().phases
    assert (phases is not None) == request.node.callspec.params["case"].startswith("phase-split")
    if phases is None:
        return
    assert (
        phases.threshold >= 1 and phases.prefill.startswith("openvino:") and phases.decode.startswith("ort:")
    )
    assert not dec.capabilities().batch_invariant


def test_coreml_is_registered_but_has_no_decoder() -> None:
    assert "coreml" not in runnable_backends()
    with pytest.raises(BackendUnavailableError, match="has no Decoder"):
        require_backend("coreml")


def test_abilities_are_never_probed() -> None:
    """Optional abilities are read from `capabilities()`, never found by getattr (style.md)."""
    root = Path(__file__).resolve().parents[2]
    probe = re.compile(r"getattr\(.*(max_rollback|set_sink|partitions|partition_seconds|kv_fill|\"cache\")")
    found = [
        f"{f.relative_to(root)}:{n}"
        for pkg in ("edge", "devices", "apps", "kvcache", "graph_opt", "models", "tests", "benchmarks")
        for f in sorted((root / pkg).rglob("*.py"))
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
        if probe.search(line) and f.name != "test_conformance.py"
    ]
    assert not found, found
