"""Every entry point that opens a model goes through one checked way in (models/checked.py): a hostile file is
refused with a clear error before any native library (llama.cpp, OpenVINO GenAI's GGUF reader) sees it.

llama.cpp's loader and OpenVINO GenAI's pipeline are replaced by recorders that refuse a hostile path (and
let the good tiny model through to the real llama.cpp), so a missed check fails the test instead of
aborting the test run."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edge.errors import ModelFormatError, TokenizerError
from tests.reliability.ggufs import rewrite_gguf

# what passes the file's layout checks but lies: llama.cpp aborts the process (GGML_ASSERT) on both
HOSTILE = {
    "block-count": ({"llama.block_count": 2**31}, "block_count"),
    "tokens-duplicated": ({"tokenizer.ggml.tokens": None}, "tokenizer.ggml"),
}


@pytest.fixture(scope="module", params=list(HOSTILE))
def hostile(
    request: pytest.FixtureRequest, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    overrides, needle = HOSTILE[request.param]
    if "tokenizer.ggml.tokens" in overrides:
        from gguf import GGUFReader

        field = GGUFReader(tiny_model).fields["tokenizer.ggml.tokens"]
        tokens = [bytes(field.parts[i]) for i in field.data]
        tokens[5] = tokens[4]  # the same text twice
        from gguf import GGUFValueType as V

        overrides = {"tokenizer.ggml.tokens": (tokens, V.ARRAY, V.STRING)}
    path = rewrite_gguf(tiny_model, tmp_path_factory.mktemp("hostile") / f"{request.param}.gguf", overrides)
    return path, needle


class NativeReached(AssertionError):
    pass


@pytest.fixture
def native(monkeypatch: pytest.MonkeyPatch, hostile: tuple[Path, str]) -> Iterator[list[str]]:
    """What native loaders were asked to read a hostile file (must stay empty)."""
    import llama_cpp

    bad = str(hostile[0])
    reached: list[str] = []
    real = llama_cpp.Llama

    def guarded(*args: Any, **kwargs: Any) -> Any:
        path = str(kwargs.get("model_path", args[0] if args else ""))
        if path == bad:
            reached.append(f"llama.cpp: {path}")
            raise NativeReached(path)
        return real(*args, **kwargs)

    monkeypatch.setattr(llama_cpp, "Llama", guarded)
    try:
        import openvino_genai

        def pipeline(path: Any, *args: Any, **kwargs: Any) -> Any:
            reached.append(f"openvino-genai: {path}")
            raise NativeReached(str(path))

        monkeypatch.setattr(openvino_genai, "LLMPipeline", pipeline)
    except ImportError:  # the bench extra is not installed: that peer reads nothing
        pass
    yield reached


def _refused(call: Callable[[], object], needle: str, reached: list[str]) -> None:
    with pytest.raises((ModelFormatError, TokenizerError)) as err:
        call()
    assert needle in str(err.value), err.value
    assert reached == []


def _cli_refused(
    argv: list[str], needle: str, reached: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from edge.cli import main

    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1, err
    assert err and err[-1].startswith("edge: error:") and needle in err[-1], err
    assert reached == []


def test_api_load(hostile: tuple[Path, str], native: list[str], graph_cache: Path) -> None:
    import edge

    path, needle = hostile
    for backend in ("llamacpp", "ort", "auto"):
        _refused(lambda b=backend: edge.load(str(path), backend=b, draft="none"), needle, native)


def test_api_draft_model(
    hostile: tuple[Path, str], native: list[str], tiny_model: Path, graph_cache: Path
) -> None:
    import edge

    path, needle = hostile
    _refused(
        lambda: edge.load(str(tiny_model), backend="llamacpp", draft=str(path), n_ctx=64), needle, native
    )


def test_chat_app_loader(hostile: tuple[Path, str], native: list[str], graph_cache: Path) -> None:
    from edge.apps.tui.app import _load_model
    from edge.apps.tui.settings import ChatSettings

    path, needle = hostile
    settings = ChatSettings(model=str(path), backend="llamacpp", n_ctx=64)
    _refused(lambda: _load_model(settings, lambda *_: None), needle, native)


def test_server(hostile: tuple[Path, str], native: list[str], graph_cache: Path) -> None:
    import edge

    path, needle = hostile
    _refused(
        lambda: edge.serve(str(path), port=0, block=False, backend="llamacpp", n_ctx=64).stop(),
        needle,
        native,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "{bad}", "hi", "--backend", "llamacpp", "--max-tokens", "1", "--ctx-size", "64"],
        ["run", "{bad}", "hi", "--backend", "ort", "--max-tokens", "1", "--ctx-size", "64"],
        ["run", "{good}", "hi", "--backend", "llamacpp", "--draft", "{bad}", "--ctx-size", "64"],
        ["bench", "{bad}", "--backends", "llamacpp,openvino-genai", "--repeat", "1"],
        ["bench", "{good}", "--backends", "llamacpp", "--draft", "{bad}", "--repeat", "1"],
        ["eval", "{bad}", "--backend", "llamacpp", "--reference", "llamacpp", "--tokens", "16"],
        ["convert", "{bad}", "--target", "ort", "-o", "{out}"],
        ["tokenize", "{bad}", "hi"],
    ],
    ids=["run", "run-ort", "run-draft", "bench", "bench-draft", "eval", "convert", "tokenize"],
)
def test_cli(
    argv: list[str],
    hostile: tuple[Path, str],
    native: list[str],
    tiny_model: Path,
    graph_cache: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path, needle = hostile
    subs = {"{bad}": str(path), "{good}": str(tiny_model), "{out}": str(tmp_path / "out")}
    _cli_refused([subs.get(a, a) for a in argv], needle, native, capsys)
    assert not (tmp_path / "out").exists()


def test_a_bare_path_is_checked_by_the_openers(hostile: tuple[Path, str], native: list[str]) -> None:
    """Code that opens a decoder on a path itself (benchmarks, a future entry point) is checked there too."""
    from edge.devices.llamacpp import LlamaCppDecoder
    from edge.devices.registry import open_decoder

    path, needle = hostile
    _refused(lambda: open_decoder("llamacpp", path), needle, native)
    _refused(lambda: LlamaCppDecoder(path), needle, native)


def test_the_good_file_reaches_llama_cpp(native: list[str], tiny_model: Path, graph_cache: Path) -> None:
    """The recorder lets a file that passes the checks through to the real llama.cpp."""
    import edge

    with edge.load(str(tiny_model), backend="llamacpp", draft="none", n_ctx=64) as m:
        assert m.backend == "llamacpp" and m.generate("hi", max_tokens=2).token_ids
    assert native == []
