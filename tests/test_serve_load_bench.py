"""benchmarks/serve_load.py's pure parts: server specs, percentiles, stalls during a window, the CPU line, the
mix-up check, the load's prompt mix, the soak's deepest prompts and the result table."""

from __future__ import annotations

import pytest

from benchmarks.serve_load import (
    SHORT_PROMPTS,
    Prompts,
    Request,
    ServerSpec,
    cpu_summary,
    deepest,
    largest_gap_during,
    level_summary,
    load_table,
    mixed_up,
    parse_server,
    percentile,
    with_ratios,
)


def test_server_specs() -> None:
    assert parse_server("edge:4") == ServerSpec("edge", 4)
    assert parse_server("edge:4:openvino") == ServerSpec("edge", 4, "openvino")
    assert parse_server("llama-server:8").label == "llama-server:8"
    assert parse_server("edge").slots == 1
    for bad in ("vllm:4", "edge:x", "edge:0", "llama-server:4:ort", "edge:1:ort:cpu"):
        with pytest.raises(ValueError):
            parse_server(bad)


def test_percentiles_interpolate_between_ranks() -> None:
    assert percentile([], 50) is None
    assert percentile([5.0], 99) == 5.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)
    assert percentile([0.0, 10.0], 99) == pytest.approx(9.9)


def test_largest_gap_overlapping_a_window() -> None:
    times = [0.0, 1.0, 1.5, 5.0, 5.2]
    assert largest_gap_during(times, 1.6, 2.0) == 3.5  # the stall spans the window
    assert largest_gap_during(times, 0.5, 1.2) == 1.0
    assert largest_gap_during(times, 6.0, 7.0) is None


def test_cpu_summary_names_the_extensions() -> None:
    text = "Model name:   AMD EPYC 9R14\nCPU(s):  2\nFlags: fpu avx2 avx512f avx512_vnni avx512_bf16\n"
    cpu = cpu_summary(text)
    assert cpu["model"] == "AMD EPYC 9R14"
    assert cpu["summary"] == "AVX2, AVX-512, VNNI, BF16"
    assert cpu_summary("Flags: sse2 avx2 avx_vnni amx_tile amx_bf16\n")["summary"] == "AVX2, VNNI, BF16, AMX"
    kvm = cpu_summary("Model name: AMD EPYC\nCPU family:  26\nModel:  2\nFlags: avx2\n")
    assert kvm["model"] == "AMD EPYC (CPU family 26 model 2)"


def test_mixed_up_only_when_another_answer_agrees_longer() -> None:
    own, other = "The capital of Japan is Tokyo.", "Three rivers: the Nile, the Congo"
    assert not mixed_up("The capital of Japan is Kyoto", own, [other])  # diverged late: numerics
    assert mixed_up("Three rivers: the Nile", own, [other])


def stream(sent: float, first: float, step: float, n: int, ok: bool = True) -> Request:
    times = [sent + first + k * step for k in range(n)]
    return Request(
        ok=ok, sent=sent, ttft_s=first, chunk_times=times, tokens=n, error=None if ok else "HTTP 429"
    )


def test_level_summary_and_table() -> None:
    one = level_summary(1, 2.0, [stream(0.0, 0.1, 0.02, 20)])
    four = level_summary(4, 2.0, [stream(0.0, 0.2, 0.04, 30) for _ in range(3)] + [stream(0, 0, 0, 0, False)])
    assert one["aggregate_tok_s"] == 10.0 and one["ttft_p50_ms"] == 100.0 and one["itl_p99_ms"] == 20.0
    assert four["errors"] == 1 and four["error_kinds"] == ["HTTP 429"] and four["aggregate_tok_s"] == 45.0
    levels = with_ratios([one, four])
    assert [lv["vs_1_client"] for lv in levels] == [1.0, 4.5]
    table = load_table([{"server": "edge:4", "levels": levels}])
    assert table[2].startswith("| edge:4 | 1 | 1 | 0 | 10.0 | 1.0x | 100.0 / 100.0 | 20.0 / 20.0 |")
    assert "| 4 | 4 | 1 | 45.0 | 4.5x |" in table[3]


def test_the_deepest_prompts_are_counted_in_tokens() -> None:
    refs = {  # the longest text is not the deepest: the server's token counts decide
        "a long sentence in few tokens": Request(prompt_tokens=20, tokens=10),
        "12 34 56": Request(prompt_tokens=30, tokens=40),
        "mid": Request(prompt_tokens=25, tokens=10),
    }
    assert deepest(refs, 2) == ["mid", "12 34 56"]


def test_every_client_of_every_level_runs_the_one_clients_mix() -> None:
    long = [f"long body {k}" for k in range(4)]
    prompts = Prompts(long)

    def kinds(client: int, requests: int) -> list[str]:
        bodies = [prompts(client, j, "t").removeprefix("[t] ") for j in range(requests)]
        assert all(b in long or b in SHORT_PROMPTS for b in bodies)
        return ["long" if b in long else "short" for b in bodies]

    for requests in (1, 2, 3, 5):
        one = kinds(0, requests)
        assert one == ["short", "long", "short", "long", "short"][:requests]
        assert all(kinds(i, requests) == one for i in range(8))
    # the same kind, another body for each client (up to the 4 long bodies); each prompt unique by its tag
    assert len({prompts(i, 1, "t") for i in range(4)}) == 4
    assert len({prompts(i, 0, "t") for i in range(8)}) == 8
    tagged = {prompts(i, j, f"c4-{i}-{j}") for i in range(4) for j in range(3)}
    assert len(tagged) == 12
