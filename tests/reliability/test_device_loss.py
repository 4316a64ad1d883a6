"""A device that disappears mid-run: the backend library really raises under a Model in the middle of a
generation. The caller gets a typed DeviceLostError saying what failed and what to do; with fallback the Model
moves to another (backend, device), re-prefills the conversation and announces the switch, and its next answer
is a fresh model's answer there."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge.api import load
from edge.devices.graph_decoder import GraphDecoder, GraphOptions
from edge.devices.llamacpp import LlamaCppDecoder, LlamaCppOptions
from edge.errors import DeviceError, DeviceLostError
from edge.generate import GenerationConfig
from edge.model import Model
from edge.models.gguf_file import open_gguf
from tests.tiny_models import TinySpec, write_tiny_model

CFG = GenerationConfig(max_tokens=12, ignore_eos=True)
PROMPT = "w1 w2 w3 w4 w5 w6 w7 w8"
TAKEOVER = {"ort": "llamacpp", "openvino": "llamacpp", "llamacpp": "ort"}  # where each goes on the CPU


@pytest.fixture(scope="module")
def other_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = TinySpec(arch="qwen2", n_embd=32, n_head=2, n_head_kv=1)
    return write_tiny_model(tmp_path_factory.mktemp("other") / "other.gguf", spec)


def break_backend(model: Model, other_model: Path, tiny_model: Path) -> object:
    """Swap the real library object under the model's decoder for one it cannot run on, as a lost device
    leaves it: ORT's session / OpenVINO's compiled model of another graph (wrong inputs), or another llama.cpp
    context whose KV is full and out of step (llama_decode returns -1). Returns what must stay alive."""
    dec = model.decoder
    if isinstance(dec, GraphDecoder):
        other = GraphDecoder(
            open_gguf(other_model), GraphOptions(backend=dec.backend, capacity=64, threads=1)
        )
        parts = ("session", "_binding", "compiled", "request")
        vars(dec.runner).update({k: v for k, v in vars(other.runner).items() if k in parts})
        return other
    assert isinstance(dec, LlamaCppDecoder)
    other_ctx = LlamaCppDecoder(tiny_model, LlamaCppOptions(n_ctx=256, n_threads=1))
    other_ctx.forward([5] * other_ctx.n_ctx)
    dec._ctx = other_ctx._ctx
    return other_ctx


def fail_mid_run(model: Model, other_model: Path, tiny_model: Path) -> DeviceLostError:
    """Generate, breaking the backend after the third piece; returns the error the caller gets."""
    keep: list[object] = []

    def on_text(piece: str) -> None:
        keep.append(piece)
        if len(keep) == 3:
            keep.append(break_backend(model, other_model, tiny_model))

    with pytest.raises(DeviceLostError) as excinfo:
        model.generate(PROMPT, CFG, reuse=False, raw=True, on_text=on_text)
    assert len(keep) == 4  # it failed mid-generation, after the third piece
    return excinfo.value


@pytest.mark.parametrize("kind", ["ort", "openvino", "llamacpp"])
def test_device_lost_without_fallback_is_a_clear_typed_error(
    kind: str, tiny_model: Path, other_model: Path, edge_cache: Path
) -> None:
    with load(str(tiny_model), backend=kind, n_ctx=256, n_threads=1) as m:
        err = fail_mid_run(m, other_model, tiny_model)
        assert isinstance(err, DeviceError) and err.failed == f"{kind}:cpu" and err.switched_to is None
        assert f"{kind}:cpu failed mid-generation" in str(err)
        assert f"{kind} failed on cpu at position" in str(err)  # the backend's own failure, where
        assert err.hint and "fallback" in err.hint
        assert isinstance(err.__cause__, DeviceError) and err.__cause__.__cause__ is not None  # the library's
        assert m.placement.backend == kind and m.placement.fallback is None  # nowhere to go: no switch
        assert m.session.held == []  # the half-run generation left nothing trusted behind


@pytest.mark.parametrize("kind", ["ort", "openvino", "llamacpp"])
def test_device_lost_with_fallback_moves_to_another_device(
    kind: str, tiny_model: Path, other_model: Path, edge_cache: Path
) -> None:
    new = TAKEOVER[kind]
    with load(str(tiny_model), backend=new, n_ctx=256, n_threads=1) as fresh:
        want = fresh.generate(PROMPT, CFG, reuse=False, raw=True)
        chat_ids = fresh.prompt_ids(PROMPT, raw=True)
    with load(str(tiny_model), backend=kind, n_ctx=256, n_threads=1, fallback=True) as m:
        ids = m.prompt_ids(PROMPT, raw=True)
        err = fail_mid_run(m, other_model, tiny_model)
        assert err.failed == f"{kind}:cpu" and err.switched_to == f"{new}:cpu"
        assert f"switched to {new}:cpu" in str(err) and err.hint and "again" in err.hint
        assert (m.placement.backend, m.placement.device) == (new, "cpu")
        assert m.placement.fallback == f"{kind}:cpu failed -> {new}:cpu"
        assert m.session.held == ids  # the conversation re-prefilled on the new device
        # sent again: only its last ids are prefilled, and the answer is a fresh model's there
        again = yield_result(m.stream_ids(chat_ids, CFG))
        assert again.stats.n_cached_tokens == len(ids) - 2
        assert again.token_ids == want.token_ids and again.text == want.text
        assert again.backend == new and again.fallback == f"{kind}:cpu failed -> {new}:cpu"
        assert m.generate(PROMPT, CFG, reuse=False, raw=True).token_ids == want.token_ids


def yield_result(stream):  # type: ignore[no-untyped-def]
    try:
        while True:
            next(stream)
    except StopIteration as stop:
        return stop.value


def test_auto_drafts_follow_the_switch(tiny_model: Path, other_model: Path, edge_cache: Path) -> None:
    """`--draft auto` drafts on the own graphs only: when one fails and the model moves to llama.cpp (the CPU's
    takeover for both), its drafts are dropped there, as open_drafters would decide on llama.cpp."""
    for kind in ("ort", "openvino"):
        with load(str(tiny_model), backend=kind, n_ctx=256, n_threads=1, fallback=True) as m:
            assert m.speculative is not None and m.draft == "ngram"
            fail_mid_run(m, other_model, tiny_model)
            assert m.placement.backend == TAKEOVER[kind] == "llamacpp"
            assert m.speculative is None and m.draft is None
            assert m.generate(PROMPT, CFG, reuse=False, raw=True).stats.draft is None
