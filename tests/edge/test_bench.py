"""`edge bench` and `edge eval` through the CLI, plus the roofline's parts on tiny files."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter

from edge.bench import BenchConfig
from edge.models.gguf_file import open_gguf
from edge.roofline import measure_read_bandwidth, weight_bytes_per_token

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _edge(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edge.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def _write_gguf(path: Path, *, tied: bool) -> Path:
    w = GGUFWriter(str(path), "llama")
    w.add_tensor("token_embd.weight", np.ones((8, 4), dtype=np.float32))  # 128 bytes
    w.add_tensor("blk.0.attn_q.weight", np.ones((4, 4), dtype=np.float16))  # 32 bytes
    if not tied:
        w.add_tensor("output.weight", np.ones((8, 4), dtype=np.float16), raw_dtype=GGMLQuantizationType.F16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_weight_bytes_exclude_the_embedding_only_when_a_head_exists(tmp_path: Path) -> None:
    tied = weight_bytes_per_token(open_gguf(_write_gguf(tmp_path / "tied.gguf", tied=True)))
    assert (tied.bytes_per_token, tied.total_tensor_bytes, tied.excluded) == (160, 160, ())
    untied = weight_bytes_per_token(open_gguf(_write_gguf(tmp_path / "untied.gguf", tied=False)))
    assert untied.total_tensor_bytes == 160 + 64
    assert untied.bytes_per_token == 32 + 64
    assert untied.excluded == ("token_embd.weight",)


def test_read_bandwidth_is_measured() -> None:
    bw = measure_read_bandwidth(2, array_mb=64, repeats=2)
    assert 0.1 < bw.gb_s < 10_000 and 0.1 < bw.single_thread_gb_s < 10_000
    with pytest.raises(ValueError):
        measure_read_bandwidth(0)


def test_bench_config_is_checked() -> None:
    with pytest.raises(ValueError, match="against"):
        BenchConfig(backends=("llamacpp",), against="ort")
    with pytest.raises(ValueError, match="repeat"):
        BenchConfig(repeat=0)
    assert BenchConfig(prompt_tokens=128, gen_tokens=128).n_ctx == 512


def test_unrunnable_backend_is_one_clear_line() -> None:
    out = _edge("bench", "smollm2-135m", "--backends", "llamacpp,coreml", "--repeat", "1")
    assert out.returncode == 1
    assert out.stderr.strip().count("\n") == 0, out.stderr
    assert "'coreml'" in out.stderr and "runnable backends: llamacpp, ort, openvino" in out.stderr


def _report(repeat: int) -> dict[str, object]:
    """The parts of a BenchReport.to_dict() that bench_table reads: one llama.cpp row."""
    row: dict[str, object] = {"backend": "llamacpp", "device": "cpu", "load_cold_s": 0.25, "load_s": 0.125}
    for key, v in (
        ("ttft_ms", 40.0),
        ("prefill_tok_s", 400.0),
        ("prefill_warm_tok_s", 450.0),
        ("decode_tok_s", 150.0),
    ):
        row |= {key: v, f"{key}_min": v, f"{key}_max": v}
    row |= {"decode_roofline_fraction": 0.8, "peak_rss_mb": 200.0, "rss_growth_mb": 100.0}
    row |= {"ratio_prefill": 1.0, "ratio_decode": 1.0}
    settings = {"prompt_tokens": 16, "gen_tokens": 8, "repeat": repeat, "threads": 2, "against": "llamacpp"}
    roof = {"bound_tok_s": 190.0, "bandwidth_gb_s": 19.0, "weight_bytes_per_token": 1e8}
    return {"model": "m", "settings": settings, "roofline": roof, "results": [row]}


@pytest.mark.parametrize("repeat", [1, 3])
def test_bench_table_header_matches_its_rows(repeat: int) -> None:
    """One round has only a cold load: the header says so and the row shows one figure, not it twice."""
    from rich.console import Console

    from edge.bench_report import bench_table

    console = Console(width=200, record=True, color_system=None)
    console.print(bench_table(_report(repeat)))
    text = console.export_text()
    assert "0.250" in text
    if repeat == 1:
        assert "cold/" not in text and "0.125" not in text  # no "warm" load over the cold one
    else:
        assert "cold/" in text and "0.125" in text


# matplotlib is an extra: a run where it cannot be imported (sys.modules[name] = None blocks the import)
WITHOUT_MATPLOTLIB = (
    "import sys; sys.modules['matplotlib'] = None; from edge.cli import main; sys.exit(main())"
)


def test_plot_without_matplotlib_is_one_line_with_the_extra(tmp_path: Path) -> None:
    png = tmp_path / "b.png"
    args = ["bench", "smollm2-135m", "--repeat", "1", "--plot", str(png)]
    proc = subprocess.run(
        [sys.executable, "-c", WITHOUT_MATPLOTLIB, *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1 and not png.exists()
    # said before the bench runs (no progress, no table): one line naming the extra
    assert proc.stderr.strip().splitlines() == [
        'edge: error: --plot needs matplotlib, which is not installed (pip install "edge-llm[plot]")'
    ]
    assert proc.stdout == ""


def test_edge_and_its_commands_import_no_matplotlib() -> None:
    code = (
        "import sys, edge, edge.cli, edge.measure_cli, edge.bench, edge.bench_report\n"
        "edge.cli.build_parser()\n"
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.slow
def test_bench_tiny_real_run(tmp_path: Path) -> None:
    js, png = tmp_path / "b.json", tmp_path / "b.png"
    out = _edge(
        "bench", "smollm2-135m", "--repeat", "1", "--prompt-tokens", "16", "--gen-tokens", "8",
        "--json", str(js), "--plot", str(png),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(js.read_text())
    (r,) = report["results"]  # --backends auto: the one backend --backend auto runs it on, and why
    assert r["backend"] in out.stdout and "backend auto -> " + r["backend"] in report["notes"]["auto"]
    assert "cold/" not in out.stdout  # --repeat 1: only the cold load is measured, no cold/warm pair
    assert {"model", "machine", "results", "roofline", "settings"} <= report.keys()
    assert report["model"] == "smollm2-135m"
    assert report["machine"]["cpu"] and report["machine"]["physical_cores"] >= 1
    assert report["settings"]["prompt_tokens"] == 16 and report["settings"]["gen_tokens"] == 8
    assert (r["device"], r["rounds"]) == ("cpu", 1)
    for key in ("load_s", "ttft_ms", "prefill_tok_s", "decode_tok_s", "peak_rss_mb"):
        assert r[f"{key}_min"] <= r[key] <= r[f"{key}_max"], key
        assert math.isfinite(r[key]) and r[key] > 0, key
    assert r["ratio_decode"] == 1.0 and r["ratio_prefill"] == 1.0
    assert 0 < r["decode_roofline_fraction"] < 1.5
    assert r["peak_rss_mb"] > 50  # the weights alone are ~97 MB once mapped in
    roof = report["roofline"]
    assert roof["bandwidth_gb_s"] > 0 and roof["weight_bytes_per_token"] > 50e6
    assert roof["bound_tok_s"] == pytest.approx(
        roof["bandwidth_gb_s"] * 1e9 / roof["weight_bytes_per_token"], rel=0.01
    )
    data = png.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000


@pytest.mark.slow
def test_bench_peer_row_and_batch_costs() -> None:
    """OpenVINO GenAI runs the same file through its own pipeline as a peer row; own backends also report
    what a k-token forward costs in decode steps (nothing of the kind for a peer)."""
    out = _edge(
        "bench", "smollm2-135m", "--backends", "llamacpp,ort,openvino-genai", "--repeat", "1",
        "--prompt-tokens", "32", "--gen-tokens", "8", "--json", "-", timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = {r["backend"]: r for r in json.loads(out.stdout)["results"]}
    assert rows.keys() == {"llamacpp", "ort", "openvino-genai"}
    for r in rows.values():
        assert r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0 and r["prefill_warm_tok_s"] > 0
        assert r["ratio_decode"] > 0 and r["peak_rss_mb"] > 50
    assert "batch_cost_steps" not in rows["openvino-genai"]
    # the weight bytes a token reads against the file's: llama.cpp reads the blocks as stored; edge's graph
    # (Q4_1 here, no K-quant kernels) one level of f32 scales more; a peer's own layout is not known
    assert rows["llamacpp"]["weight_bytes_ratio_to_file"] == 1.0
    assert 1.0 < rows["ort"]["weight_bytes_ratio_to_file"] < 1.6
    assert "weight_bytes_ratio_to_file" not in rows["openvino-genai"]
    assert rows["ort"]["decode_read_gb_s"] > 0 and "the file's weight bytes a token" in out.stderr
    for b in ("llamacpp", "ort"):
        costs = rows[b]["batch_cost_steps"]
        assert list(costs) == ["1", "2", "4", "8", "16"] and all(v > 0 for v in costs.values())
    assert "a forward of k tokens costs" in out.stderr  # the table and its lines go to stderr with --json -


@pytest.mark.slow
def test_eval_of_llamacpp_against_itself_is_exact() -> None:
    args = ("eval", "smollm2-135m", "--backend", "llamacpp", "--reference", "llamacpp", "--tokens", "128")
    out = _edge(*args, "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    keys = {"model", "backend", "reference", "tokens", "ppl", "ppl_ref", "kl_mean", "kl_p99", "top1_agree"}
    assert keys | {"rms_dp"} <= r.keys()
    assert r["tokens"] == 128
    assert abs(r["kl_mean"]) < 1e-6 and abs(r["kl_p99"]) < 1e-6
    assert r["top1_agree"] == 1.0 and r["rms_dp"] == 0.0
    assert r["ppl"] == r["ppl_ref"]
    assert 1 < r["ppl"] < 200


@pytest.mark.slow
def test_eval_test_chunk_scores_the_decode_path() -> None:
    """--test-chunk 1 feeds the tested backend one token per forward against a batched reference.

    llama.cpp's one-token path rounds differently from its batched one (another kernel), so against itself it
    is no longer exact: the figure is the floor for any engine measured against llama.cpp. edge's exact ORT
    graph gives the same logits either way (fp32 in both paths).
    """
    base = ("eval", "smollm2-135m", "--tokens", "96", "--test-chunk", "1", "--json")
    out = _edge(*base, "--backend", "llamacpp", "--reference", "llamacpp")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["tokens"] == 96 and r["test_chunk"] == 1
    assert 0 < r["kl_mean"] < 0.05 and r["top1_agree"] > 0.85
    exact = ("--precision", "exact", "--reference-precision", "exact")
    out = _edge(*base, "--backend", "ort", "--reference", "ort", *exact)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["test_chunk"] == 1 and r["kl_mean"] < 1e-6 and r["top1_agree"] == 1.0
    bad = _edge("eval", "smollm2-135m", "--test-chunk", "0")
    assert bad.returncode != 0 and "--test-chunk must be >= 1" in bad.stderr


@pytest.mark.slow
def test_bench_json_schema_measures_the_masks_cost_in_the_same_round(tmp_path: Path) -> None:
    schema = tmp_path / "s.json"
    schema.write_text(
        json.dumps({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]})
    )
    args = ("--repeat", "1", "--prompt-tokens", "16", "--gen-tokens", "24", "--json", "-")
    grammar = ("--json-schema", str(schema), "--draft", "ngram", "--against", "ort")
    proc = _edge("bench", "smollm2-135m", "--backends", "llamacpp,ort", *grammar, *args)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for r in out["results"]:
        steps = r["samples"]["constrained_steps"][0]
        assert 1 <= steps <= 24 and r["constrained_decode_tok_s"] > 0 and r["ratio_constrained_decode"] > 0
        assert f"{r['backend']}: decode under the grammar's mask" in proc.stderr
    # masked drafts against fast-forward alone, under the same grammar: the staged ORT graph gives the same ids
    draft = out["draft"]
    assert draft["constrained"] and draft["same_tokens"] and draft["draft_decode_tok_s"]["median"] > 0
    assert "fast-forward alone" in proc.stderr
    bad = _edge("bench", "smollm2-135m", "--json-schema", str(tmp_path / "none.json"), *args)
    assert bad.returncode == 1 and "cannot read --json-schema" in bad.stderr
