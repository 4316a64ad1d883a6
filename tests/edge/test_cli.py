"""The `edge` command line end to end, on real catalog models (pulled on first use)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge.models.resolve import resolve_model
from tests.shared_cache import pull_named_models

EDGE = [sys.executable, "-m", "edge.cli"]


def edge(
    *args: str, stdin: str | None = None, timeout: float = 300, pull: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run the CLI; `pull`: first pull the catalog models it names (a pull's progress lines on stderr are not
    what these tests read), False where the command fails before it needs the model."""
    if pull:
        pull_named_models(args)
    env = {k: v for k, v in os.environ.items() if k != "EDGE_DEBUG"}
    return subprocess.run(
        [*EDGE, *args], input=stdin, capture_output=True, text=True, timeout=timeout, env=env
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("edge: error:") and "Traceback" not in proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_unknown_model_is_one_clear_line() -> None:
    proc = edge("run", "no-such-model.gguf", "hi")
    assert_one_line_error(proc, "no-such-model.gguf", "catalog name")


def test_models_at_80_columns_never_cut_a_name() -> None:
    from edge.models.catalog import CATALOG

    env = {**os.environ, "COLUMNS": "80"}
    proc = subprocess.run([*EDGE, "models"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, proc.stdout
    assert "…" not in proc.stdout
    for name in CATALOG:  # each name whole, at the start of its row
        assert any(line.split()[:1] == [name] for line in lines if line.strip()), (name, proc.stdout)


def test_hostile_file_is_one_clear_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (2**62).to_bytes(8, "little") + bytes(8))
    assert_one_line_error(edge("run", str(bad), "hi"), "bad.gguf")
    assert_one_line_error(edge("tokenize", str(bad), "hi"), "bad.gguf")


def test_bad_option_values() -> None:
    assert_one_line_error(edge("run", "smollm2-135m", "hi", "--top-p", "0", pull=False), "top_p")


@pytest.mark.slow
def test_absent_device_lists_what_exists_and_fallback_is_announced() -> None:
    proc = edge("run", "smollm2-135m", "hi", "--device", "npu")
    assert_one_line_error(proc, "no npu", "found:", "--fallback cpu", "--device npu --emulate")
    assert "by openvino" not in proc.stderr  # the user named no backend
    proc = edge(
        "run", "smollm2-135m", "Say hi", "--device", "npu", "--fallback", "--max-tokens", "4", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["device"] == "cpu" and out["fallback"] == "npu -> cpu"
    assert "fallback npu -> cpu" in proc.stderr
    # the device to fall back to may be named; --explain says what runs where and why
    proc = edge(
        "run",
        "smollm2-135m",
        "Say hi",
        "--device",
        "npu",
        "--fallback",
        "cpu",
        "--explain",
        "--max-tokens",
        "2",
    )
    assert proc.returncode == 0, proc.stderr
    # the CPU it falls back to runs --backend auto's choice, and says why
    assert re.search(
        r"plan: smollm2-135m whole model on (llamacpp|ort|openvino):cpu \(fallback npu -> cpu\)", proc.stderr
    )
    assert "backend auto -> " in proc.stderr
    assert_one_line_error(
        edge("run", "smollm2-135m", "hi", "--device", "hetero:cpu"), "hetero needs two or more"
    )
    assert_one_line_error(edge("run", "smollm2-135m", "hi", "--device", "gpu", "--emulate"), "--emulate")


def test_run_split_by_phase_names_both_halves() -> None:
    """--plan prefill=...,decode=...: --json names both halves, --explain prints them, a bad plan is one line."""
    plan = "prefill=openvino:cpu,decode=ort:cpu"
    args = ("run", "smollm2-135m", "Say hi", "--plan", plan, "--json", "--explain", "--max-tokens", "2")
    proc = edge(*args)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["backend"], out["device"]) == ("openvino+ort", "cpu")
    assert "split by phase" in proc.stderr
    assert "prefill: openvino:cpu:fast" in proc.stderr and "decode:  ort:cpu:fast" in proc.stderr
    assert_one_line_error(edge("run", "smollm2-135m", "hi", "--plan", "prefill=ort:cpu"), "both halves")
    bad = edge("run", "smollm2-135m", "hi", "--plan", plan, "--backend", "ort")
    assert_one_line_error(bad, "no --backend")


@pytest.mark.slow
def test_run_json_greedy_equals_llama_cpp_python() -> None:
    import llama_cpp

    prompt = "Why is the sky blue? Answer in two sentences."
    proc = edge(
        "run",
        "smollm2-135m",
        prompt,
        "--json",
        "--temperature",
        "0",
        "--max-tokens",
        "48",
        "--backend",
        "llamacpp",
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)  # the whole stdout is one JSON object
    keys = {"model", "text", "token_ids", "n_prompt_tokens", "n_tokens", "ttft_ms", "prefill_tok_s"}
    keys |= {"decode_tok_s", "backend", "device", "fallback", "draft"}
    assert keys <= set(out)
    assert out["model"] == "smollm2-135m" and out["backend"] == "llamacpp" and out["device"] == "cpu"
    assert out["fallback"] is None and out["draft"] is None and out["precision"] is None  # llama.cpp: its own
    assert out["n_tokens"] == len(out["token_ids"]) > 0 and out["ttft_ms"] > 0 and out["decode_tok_s"] > 0
    assert "blue" in out["text"].lower() or "light" in out["text"].lower()

    # llama-cpp-python's own pipeline on the same prompt: its tokenizer, its greedy sampler
    path = str(resolve_model("smollm2-135m"))
    llm = llama_cpp.Llama(model_path=path, n_ctx=4096, n_threads=2, verbose=False)
    rendered = (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = llm.tokenize(rendered.encode(), add_bos=False, special=True)
    assert out["n_prompt_tokens"] == len(ids)
    ref: list[int] = []
    for tok in llm.generate(ids, temp=0.0, top_k=1, repeat_penalty=1.0):
        if llama_cpp.llama_vocab_is_eog(llm._model.vocab, tok) or len(ref) == 48:
            break
        ref.append(tok)
    llm.close()
    assert out["token_ids"] == ref
    assert out["text"] == llm_detok(path, ref)


def llm_detok(path: str, ids: list[int]) -> str:
    import llama_cpp

    v = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    return v.detokenize(ids).decode("utf-8", errors="replace")


@pytest.mark.slow
def test_run_streams_text_and_summary() -> None:
    proc = edge("run", "smollm2-135m", "Count from 1 to 5.", "--max-tokens", "24", "--seed", "7")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    summary = proc.stderr.strip().splitlines()[-1]
    assert "tokens" in summary and "TTFT" in summary and "tok/s" in summary
    assert "/cpu" in summary and "(auto, " in summary  # where --backend auto ran it, and why
    again = edge("run", "smollm2-135m", "Count from 1 to 5.", "--max-tokens", "24", "--seed", "7")
    assert again.stdout == proc.stdout  # a seed makes sampling repeat


@pytest.mark.slow
def test_stdin_prompt() -> None:
    """The default model's own path is tests/edge/test_cli_edges.py's; the tiny model keeps this one fast."""
    proc = edge("run", "smollm2-135m", "--max-tokens", "8", "--json", stdin="What is 2+2?")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["model"] == "smollm2-135m"


@pytest.mark.slow
def test_base_model_runs_as_completion_with_a_note() -> None:
    import llama_cpp

    prompt = "The capital of France is"
    # llama.cpp on both sides: the check is that no template wraps the prompt. Across engines greedy tokens
    # part at gemma3's near-ties: at this prompt's sixth token ORT's K-quant kernels alone move the margin
    # between 0.004 and 0.31 logits with the summation order of the ISA they run
    proc = edge(
        "run",
        "gemma3-270m",
        prompt,
        "--temperature",
        "0",
        "--max-tokens",
        "8",
        "--json",
        "--backend",
        "llamacpp",
    )
    assert proc.returncode == 0, proc.stderr
    assert "gemma3-270m is a base model with no chat template; running as plain completion" in proc.stderr
    out = json.loads(proc.stdout)
    llm = llama_cpp.Llama(model_path=str(resolve_model("gemma3-270m")), n_ctx=256, n_threads=2, verbose=False)
    ids = llm.tokenize(prompt.encode(), add_bos=True, special=True)  # gemma adds BOS; no template applied
    assert out["n_prompt_tokens"] == len(ids)
    ref = []
    for tok in llm.generate(ids, temp=0.0, top_k=1, repeat_penalty=1.0):
        if llama_cpp.llama_vocab_is_eog(llm._model.vocab, tok) or len(ref) == 8:
            break
        ref.append(tok)
    llm.close()
    assert out["token_ids"] == ref and out["text"].strip()


@pytest.mark.slow
def test_prompt_longer_than_context() -> None:
    proc = edge("run", "smollm2-135m", "word " * 400, "--ctx-size", "256")
    assert_one_line_error(proc, "context holds 256", "--ctx-size")


@pytest.mark.slow
def test_stop_string_is_not_printed() -> None:
    proc = edge("run", "smollm2-135m", "List the numbers 1 to 9, comma separated.", "--temperature", "0")
    full = json.loads(
        edge(
            "run", "smollm2-135m", "List the numbers 1 to 9, comma separated.", "--temperature", "0", "--json"
        ).stdout
    )["text"]
    assert "4" in full
    stopped = edge(
        "run",
        "smollm2-135m",
        "List the numbers 1 to 9, comma separated.",
        "--temperature",
        "0",
        "--stop",
        "4",
        "--json",
    )
    out = json.loads(stopped.stdout)
    assert out["stop_reason"] == "stop" and out["text"] == full[: full.index("4")]
    assert proc.returncode == 0


@pytest.mark.slow
def test_ctrl_c_mid_generation_exits_cleanly() -> None:
    env = {k: v for k, v in os.environ.items() if k != "EDGE_DEBUG"}
    p = subprocess.Popen(
        [
            *EDGE,
            "run",
            "smollm2-135m",
            "Write a long story about a lighthouse.",
            "--max-tokens",
            "2000",
            "--temperature",
            "0.8",
            "--seed",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # a test run started in the background (`cmd &` in a script) inherits SIGINT ignored, and Python then
        # installs no Ctrl-C handler: give the child the default disposition a terminal user has
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert p.stdout is not None
    first = p.stdout.read(20)  # wait until text streams
    assert first
    p.send_signal(signal.SIGINT)
    try:
        _, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 130
    assert "interrupted" in err and "Traceback" not in err


@pytest.mark.slow
def test_tokenize_json_and_jsonl_match_llama_cpp() -> None:
    import llama_cpp

    path = str(resolve_model("qwen2.5-coder-0.5b"))
    vocab = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    texts = ["<|im_start|>user\nhello wörld 🤖<|im_end|>", "def f(x):\n    return x**2  # 平方", "   "]
    out = json.loads(edge("tokenize", "qwen2.5-coder-0.5b", texts[0], "--json").stdout)
    assert out == {"model": "qwen2.5-coder-0.5b", "token_ids": vocab.tokenize(texts[0].encode(), False, True)}
    proc = edge(
        "tokenize", "qwen2.5-coder-0.5b", "--jsonl", stdin="".join(json.dumps(t) + "\n" for t in texts)
    )
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert rows == [{"token_ids": vocab.tokenize(t.encode(), False, True)} for t in texts]
    started = time.monotonic()
    assert_one_line_error(edge("tokenize", "qwen2.5-coder-0.5b", "--jsonl", stdin="[1, 2]\n"), "line 1")
    assert time.monotonic() - started < 60


def test_run_takes_options_between_model_and_prompt() -> None:
    from edge.cli import parse

    args = parse(["run", "smollm2-135m", "--temperature", "0", "--max-tokens", "8", "Say hi"])
    assert args.args == ["smollm2-135m", "Say hi"]
    assert args.temperature == 0 and args.max_tokens == 8
    with pytest.raises(SystemExit):  # anything else left over is still an error
        parse(["run", "smollm2-135m", "--no-such-option", "Say hi"])
    with pytest.raises(SystemExit):
        parse(["models", "stray"])


@pytest.mark.slow
def test_a_schemas_annotation_keys_are_noted_and_the_answer_validates(tmp_path: Path) -> None:
    import jsonschema

    schema = {
        "type": "object",
        "javaType": "com.example.Answer",  # a generator's annotation: no JSON Schema keyword
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    path = tmp_path / "answer.json"
    path.write_text(json.dumps(schema))
    proc = edge("run", "smollm2-135m", "Is water wet?", "--json-schema", str(path), "--max-tokens", "16")
    assert proc.returncode == 0, proc.stderr
    assert "edge: note: schema keys that are no JSON Schema keyword, ignored: #/javaType" in proc.stderr
    jsonschema.validate(json.loads(proc.stdout), schema)
