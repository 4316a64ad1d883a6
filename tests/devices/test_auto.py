"""`--backend auto`: the choice follows measurements (edge bench's, else the recorded prior), is keyed by the
file and the machine, never gives an exact request to llama.cpp, and sends what the own graphs refuse to
llama.cpp with the refusal as the note."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType

from edge.api import load
from edge.bench import BenchConfig, run_bench
from edge.devices import auto
from edge.devices.auto import Speed, choose_backend, machine_key, model_sha256, record_speeds
from edge.errors import BackendUnavailableError, ModelFormatError
from edge.models.catalog import CATALOG
from tests.reliability.ggufs import rewrite_gguf
from tests.tiny_models import TinySpec, write_tiny_model

pytestmark = pytest.mark.usefixtures("edge_cache")  # measurements and graphs: a private cache

ALL = ["llamacpp", "ort", "openvino"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "llama.gguf", TinySpec(arch="llama"))


@pytest.fixture(scope="module")
def refused(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A llama file with YaRN RoPE scaling: llama.cpp runs it, the own graphs refuse it."""
    out = tmp_path_factory.mktemp("refused") / "yarn.gguf"
    yarn = {
        "llama.rope.scaling.type": ("yarn", GGUFValueType.STRING),
        "llama.rope.scaling.factor": (4.0, GGUFValueType.FLOAT32),
        "llama.rope.scaling.original_context_length": (512, GGUFValueType.UINT32),
    }
    return rewrite_gguf(tiny, out, yarn)


def _record(
    path: Path, speeds: dict[str, tuple[float, float]], precision: str = "fast", threads: int = 1
) -> None:
    kept = record_speeds(
        model_sha256(path),
        machine_key(threads),
        precision,
        {b: Speed(p, d) for b, (p, d) in speeds.items()},
        "test",
    )
    assert kept


def test_the_choice_follows_the_measurement(tiny: Path) -> None:
    _record(tiny, {"llamacpp": (500.0, 100.0), "ort": (900.0, 150.0), "openvino": (800.0, 60.0)})
    c = choose_backend(tiny, threads=1, available=ALL)
    assert (c.backend, c.source) == ("ort", "measured")
    assert set(c.speeds) == set(ALL) and "ort" in c.explain()
    # a later run where llama.cpp is faster replaces it: no hard-coded preference
    _record(tiny, {"llamacpp": (900.0, 200.0), "ort": (900.0, 150.0)})
    c = choose_backend(tiny, threads=1, available=ALL)
    assert (c.backend, c.source) == ("llamacpp", "measured")
    # another machine (here: another thread count) has not measured it: the prior decides there
    assert choose_backend(tiny, threads=3, available=ALL).source == "prior"


def test_a_new_graph_format_makes_measurements_stale(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The own graphs' speed was measured on the graphs of one GRAPH_FORMAT; another one measures again."""
    _record(tiny, {"llamacpp": (500.0, 100.0), "ort": (900.0, 150.0)})
    assert choose_backend(tiny, threads=1, available=ALL).source == "measured"
    monkeypatch.setattr("edge.devices.graph_decoder.GRAPH_FORMAT", 10_000)
    assert machine_key(1)["versions"]["graph_format"] == "10000"
    assert choose_backend(tiny, threads=1, available=ALL).source == "prior"


def test_fastest_means_the_whole_reference_request(tiny: Path) -> None:
    # ort decodes faster but prefills so slowly that a 128 + 128-token request takes longer on it
    _record(tiny, {"llamacpp": (1000.0, 100.0), "ort": (50.0, 110.0)})
    assert Speed(1000.0, 100.0).request_s() < Speed(50.0, 110.0).request_s()
    assert choose_backend(tiny, threads=1, available=ALL).backend == "llamacpp"


def test_exact_never_goes_to_llama_cpp(tiny: Path) -> None:
    """llama.cpp has one precision (int8 activations): an exact request chooses among the own graphs."""
    _record(tiny, {"llamacpp": (5000.0, 900.0), "ort": (100.0, 10.0), "openvino": (200.0, 20.0)}, "exact")
    c = choose_backend(tiny, precision="exact", threads=1, available=ALL)
    assert (c.backend, c.source) == ("openvino", "measured")
    # nothing measured at exact: ONNX Runtime, and the reason says nothing was measured
    c = choose_backend(tiny, precision="exact", threads=5, available=ALL)
    assert (c.backend, c.source) == ("ort", "default") and "nothing measured" in c.why


def test_the_prior_is_the_recorded_benchmark(tiny: Path) -> None:
    """Unmeasured, a catalog file gets its own recorded speeds and any other file those of the recorded model
    nearest in size; the prior file is what benchmarks/auto_prior.py wrote from a results file."""
    prior = json.loads(resources.files("edge.devices").joinpath("auto_prior.json").read_text())
    source = Path(__file__).resolve().parents[2] / prior["source"]
    recorded = json.loads(source.read_text())
    for name, run in recorded.items():
        entry = prior["models"][CATALOG[name].sha256]
        for r in run["bench"]["results"]:
            if r["backend"] in ALL:
                assert entry["backends"][r["backend"]]["decode_tok_s"] == r["decode_tok_s"]
    c = choose_backend(tiny, threads=7, available=ALL)  # a few KB: nearest is the smallest catalog model
    smallest = min(prior["models"].values(), key=lambda m: m["size"])
    assert c.source == "prior" and smallest["name"] in c.why
    want = min(
        smallest["backends"],
        key=lambda b: Speed(**smallest["backends"][b]).request_s(),
    )
    assert c.backend == want


def test_one_candidate_needs_no_measurement(tiny: Path) -> None:
    c = choose_backend(tiny, available=["ort"])
    assert (c.backend, c.source) == ("ort", "only")


def test_a_file_the_own_graphs_refuse_goes_to_llama_cpp(refused: Path) -> None:
    c = choose_backend(refused, available=ALL)
    assert (c.backend, c.source) == ("llamacpp", "refused")
    assert c.note is not None and "'yarn'" in c.note and "llama.cpp runs it" in c.note
    with load(str(refused), n_ctx=64, n_threads=1) as m:  # auto is the default
        assert m.placement.backend == "llamacpp" and m.placement.auto is not None
        assert np.isfinite(m.decoder.forward([1, 2, 3])).all()
    with pytest.raises(BackendUnavailableError, match=r"only llama\.cpp runs this file") as exc:
        choose_backend(refused, available=["ort", "openvino"])
    assert exc.value.hint == 'pip install "edge-llm[llamacpp]"'
    with pytest.raises(ModelFormatError, match="--precision exact needs edge's own graph"):
        choose_backend(refused, precision="exact", available=ALL)


def test_load_runs_and_reports_the_choice(tiny: Path) -> None:
    _record(tiny, {"llamacpp": (100.0, 10.0), "ort": (900.0, 150.0), "openvino": (100.0, 10.0)})
    with load(str(tiny), n_ctx=64, n_threads=1) as m:
        assert m.placement.backend == "ort" and m.placement.auto is not None
        assert m.placement.auto.source == "measured"
    import edge

    with edge.load(str(tiny), n_ctx=64, n_threads=1) as api_model:  # the API's default is auto too
        assert api_model.backend == "ort"
        assert (
            api_model.backend_choice is not None
            and "backend auto -> ort (measured)" in api_model.backend_choice
        )
    # a named backend is run as named, with no auto choice
    with load(str(tiny), backend="llamacpp", n_ctx=64, n_threads=1) as m:
        assert m.placement.backend == "llamacpp" and m.placement.auto is None


def test_edge_bench_records_what_auto_reads(tiny: Path) -> None:
    smoke = BenchConfig(backends=("llamacpp", "ort"), prompt_tokens=8, gen_tokens=4, repeat=1, threads=1)
    before = choose_backend(tiny, threads=1, available=ALL)
    assert "auto_record" not in run_bench(str(tiny), smoke).notes  # too short to replace a measurement
    assert choose_backend(tiny, threads=1, available=ALL).speeds == before.speeds
    cfg = BenchConfig(backends=("llamacpp", "ort"), prompt_tokens=64, gen_tokens=32, repeat=1, threads=1)
    report = run_bench(str(tiny), cfg)
    assert "auto_record" in report.notes
    speeds = {r.backend: Speed(r.prefill_tok_s.median, r.decode_tok_s.median) for r in report.results}
    c = choose_backend(tiny, threads=1, available=ALL)
    assert c.source == "measured" and c.speeds.keys() == speeds.keys()
    for b, s in speeds.items():  # the medians as recorded (rounded to 0.01 tok/s)
        assert c.speeds[b].prefill_tok_s == pytest.approx(s.prefill_tok_s, abs=0.01)
        assert c.speeds[b].decode_tok_s == pytest.approx(s.decode_tok_s, abs=0.01)
    assert c.backend == min(speeds, key=lambda b: speeds[b].request_s())
    # `--backends auto` benches that choice, and says why
    auto_run = run_bench(str(tiny), BenchConfig(prompt_tokens=8, gen_tokens=4, repeat=1, threads=1))
    assert [r.backend for r in auto_run.results] == [c.backend]
    assert "backend auto" in auto_run.notes["auto"]


def test_edge_bench_shows_this_machine_not_the_prior(tmp_path: Path) -> None:
    """An unmeasured file: `edge bench --backends auto` names the prior's machine and prints none of its figures
    (its table is this machine's), and no repository path an installed edge does not have; --explain's
    figures are labelled as another machine's."""
    fresh = write_tiny_model(tmp_path / "fresh.gguf", TinySpec(arch="llama", seed=11))
    prior = json.loads(resources.files("edge.devices").joinpath("auto_prior.json").read_text())
    run = run_bench(str(fresh), BenchConfig(prompt_tokens=8, gen_tokens=4, repeat=1, threads=1))
    note = run.notes["auto"]
    assert note.startswith("backend auto -> ") and "(prior)" in note and len(note.splitlines()) == 1
    assert f"on {prior['machine']['cpu']}, {prior['machine']['threads']} threads" in note
    assert prior["source"] not in note and "benchmarks/" not in note and "tok/s" not in note
    choice = choose_backend(fresh, threads=1)
    lines = choice.explain().splitlines()
    assert "another machine's, not measured here" in lines[1] and "tok/s" in lines[2]
    assert "benchmarks/" not in choice.explain()


def test_a_damaged_measurement_file_is_ignored(tiny: Path) -> None:
    from edge.models.store import cache_dir

    (cache_dir() / auto.SPEEDS_FILE).write_text("{not json")
    assert choose_backend(tiny, threads=1, available=ALL).source == "prior"
    _record(tiny, {"llamacpp": (100.0, 10.0), "ort": (900.0, 150.0)})  # rewritten whole
    assert choose_backend(tiny, threads=1, available=ALL).source == "measured"
