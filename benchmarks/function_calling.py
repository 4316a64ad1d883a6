"""Function calling on the catalog chat models: edge serve beside llama.cpp's own server on the same GGUF files.

A public-style set (benchmarks/data/function_calling.json: BFCL-like "simple" and "multiple" cases, one question,
one or several candidate functions, the expected function and arguments) asked with the real `openai` client at
temperature 0: edge and `llama-server --jinja`, each with tool_choice "auto" and "required". Scored on the
first call: valid (it parses and its arguments validate against the function's schema), right function, right
arguments (each by value: strings trimmed and case-insensitive, numbers by value; an argument the case does not
list is wrong). Writes results/function-calling-<date>.json and .md.

    python -m benchmarks.function_calling --models qwen2.5-coder-0.5b       # llama-server from PATH or build-llama
    python -m benchmarks.function_calling --models smollm2-135m --engines edge --backend ort
    python -m benchmarks.function_calling --models qwen2.5-coder-1.5b --every 2   # every 2nd case of each category

One engine runs at a time, each on --threads threads, on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai

import edge
from benchmarks.results_io import write_results

ROOT = Path(__file__).resolve().parents[1]

DATA = ROOT / "benchmarks" / "data" / "function_calling.json"
RESULTS = ROOT / "benchmarks" / "results"
MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
SCORES = ("valid", "function", "arguments")
LLAMA_SERVER_BUILT = Path("/work/build-llama/bin/llama-server")  # where the session's build of it lies
MAX_TOKENS = 160  # a call here takes < 80 tokens; a text answer is cut here (it is no call either way)


def tools_for(case: dict[str, Any], functions: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": n, **functions[n]}} for n in case["functions"]]


def same_value(given: Any, want: Any) -> bool:
    """BFCL's checks: strings trimmed and case-insensitive, numbers by value (10 == 10.0), booleans exactly."""
    if isinstance(want, str):
        return isinstance(given, str) and given.strip().lower() == want.strip().lower()
    if isinstance(want, bool) or isinstance(given, bool):
        return given is want
    if isinstance(want, (int, float)):
        return isinstance(given, (int, float)) and float(given) == float(want)
    return bool(given == want)


def right_arguments(args: dict[str, Any], expected: dict[str, list[Any]]) -> bool:
    if set(args) - set(expected):
        return False
    for key, acceptable in expected.items():
        if key not in args:
            if None not in acceptable:
                return False
        elif not any(same_value(args[key], a) for a in acceptable if a is not None):
            return False
    return True


def score(message: Any, case: dict[str, Any], functions: dict[str, Any]) -> dict[str, Any]:
    """The first call's three checks, and what came back (calls, or the text answered instead)."""
    calls = message.tool_calls or []
    out: dict[str, Any] = {"id": case["id"], "category": case["category"], "n_calls": len(calls)}
    out["text"] = None if calls else (message.content or "")
    out.update(dict.fromkeys(SCORES, False))
    if not calls:
        return out
    name, raw = calls[0].function.name, calls[0].function.arguments
    out["call"] = {"name": name, "arguments": raw}
    try:
        args = json.loads(raw)
    except json.JSONDecodeError:
        return out
    if name not in case["functions"] or not isinstance(args, dict):
        return out
    try:
        jsonschema.validate(args, functions[name]["parameters"])
    except jsonschema.ValidationError:
        return out
    expected = case["expected"]
    out["valid"] = True
    out["function"] = name == expected["name"]
    out["arguments"] = out["function"] and right_arguments(args, expected["arguments"])
    return out


def call_in_text(text: str | None) -> dict[str, Any] | None:
    """A call the engine did not parse: the first JSON object of a text answer (bare, in a ```json fence or in
    <tool_call> tags) that has a "name". Scored apart, to tell the model's knowledge from the engine's parsing."""
    text = text or ""
    start = text.find("{")
    if start < 0:
        return None
    try:
        obj, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) and isinstance(obj.get("name"), str) else None


def right_in_text(row: dict[str, Any], case: dict[str, Any]) -> bool:
    obj = None if row["n_calls"] else call_in_text(row["text"])
    if obj is None or obj["name"] != case["expected"]["name"]:
        return False
    args = obj.get("arguments", obj.get("parameters"))
    return isinstance(args, dict) and right_arguments(args, case["expected"]["arguments"])


def ask_all(
    url: str, model: str, choice: str, data: dict[str, Any], system: str | None = None
) -> list[dict[str, Any]]:
    """Every case asked once; `system`: an app's system message before each question (it replaces the chat
    template's default one, as apps' own instructions do)."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)
    rows = []
    head = [] if system is None else [{"role": "system", "content": system}]
    for case in data["cases"]:
        t0 = time.perf_counter()
        reply = client.chat.completions.create(
            model=model,
            messages=[*head, {"role": "user", "content": case["question"]}],
            tools=tools_for(case, data["functions"]),
            tool_choice=choice,
            temperature=0,
            max_tokens=MAX_TOKENS,
        )
        row = score(reply.choices[0].message, case, data["functions"])
        row["seconds"] = round(time.perf_counter() - t0, 3)
        row["finish_reason"] = reply.choices[0].finish_reason
        extra = (reply.model_extra or {}).get("edge") or {}
        if extra.get("backend"):  # edge says which backend answered (llama-server has no such field)
            row["backend"] = extra["backend"]
        rows.append(row)
        print(f"  {model} {choice} {case['id']}: {row['arguments']} {row.get('call') or row['text']!r:.120}")
    return rows


@contextlib.contextmanager
def edge_server(model: str, backend: str, threads: int, n_ctx: int) -> Iterator[str]:
    server = edge.serve(
        models=[model], port=0, block=False, backend=backend, n_threads=threads, n_ctx=n_ctx, grace_s=1.0
    )
    try:
        yield server.url
    finally:
        server.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def llama_server(binary: Path, gguf: Path, threads: int, n_ctx: int) -> Iterator[str]:
    port = free_port()
    cmd = [str(binary), "--jinja", "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["-t", str(threads), "-c", str(n_ctx), "-np", "1"]
    log = RESULTS / ".llama-server.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"llama-server exited with {proc.returncode}:\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError("llama-server did not become healthy in 300 s")


def gguf_of(model: str) -> Path:
    from edge.models.catalog import CATALOG
    from edge.models.store import model_path

    return model_path(CATALOG[model])


def tally(rows: Sequence[dict[str, Any]], cases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: sum(r[k] for r in rows) for k in SCORES}
    out["right_in_text"] = sum(right_in_text(r, cases[r["id"]]) for r in rows)
    for cat in ("simple", "multiple"):
        out[f"arguments_{cat}"] = sum(r["arguments"] for r in rows if r["category"] == cat)
    out["text_answers"] = sum(r["n_calls"] == 0 for r in rows)
    out["n"] = len(rows)  # per run: runs merged together may have measured different subsets (--every)
    out["n_simple"] = sum(r["category"] == "simple" for r in rows)
    out["mean_s"] = round(sum(r["seconds"] for r in rows) / max(1, len(rows)), 2)
    return out


def table(runs: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| model | engine | tool_choice | valid call | right function | right arguments | simple / multiple"
        " | answered in text | of which right if parsed | s / case |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        t = run["tally"]
        n, n_simple = t["n"], t["n_simple"]
        if "error" in run:
            lines.append(
                f"| {run['model']} | {run['engine']} | {run['choice']} | error: {run['error']} ||||||| "
            )
            continue
        lines.append(
            f"| {run['model']} | {run['engine']} | {run['choice']} | {t['valid']}/{n} | {t['function']}/{n}"
            f" | **{t['arguments']}/{n}** | {t['arguments_simple']}/{n_simple} / {t['arguments_multiple']}/"
            f"{n - n_simple} | {t['text_answers']} | {t['right_in_text']} | {t['mean_s']} |"
        )
    return lines


def cpu_name() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def peer_version(binary: Path) -> str:
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=False)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return "; ".join(line for line in lines if line.startswith(("version", "built")))


def run_model(model: str, args: argparse.Namespace, data: dict[str, Any]) -> list[dict[str, Any]]:
    runs = []
    if "edge" in args.engines:
        with edge_server(model, args.backend, args.threads, args.ctx) as url:
            for choice in args.edge_choices:
                runs.append({"model": model, "engine": f"edge ({args.backend})", "choice": choice})
                runs[-1]["rows"] = ask_all(url, model, choice, data, args.system)
                answered = sorted({r["backend"] for r in runs[-1]["rows"] if "backend" in r})
                if answered:  # the backend that answered, not only the one asked for ("auto")
                    runs[-1]["engine"] = f"edge ({', '.join(answered)})"
    if args.llama_server is None or "llama-server" not in args.engines:
        return runs
    for choice in args.peer_choices:
        runs.append({"model": model, "engine": "llama-server --jinja", "choice": choice})
    try:
        with llama_server(args.llama_server, gguf_of(model), args.threads, args.ctx) as url:
            for run in runs[-len(args.peer_choices) :]:
                run["rows"] = ask_all(url, model, run["choice"], data, args.system)
    except (RuntimeError, openai.OpenAIError) as exc:
        for run in runs[-len(args.peer_choices) :]:
            run.setdefault("error", " ".join(str(exc).split())[:300])
            run.setdefault("rows", [])
    return runs


def cpu_flags() -> str:
    """The SIMD features that decide the kernels: AVX2, AVX-512, VNNI, BF16, AMX."""
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    have = next((line.split(":", 1)[1].split() for line in out.splitlines() if line.startswith("Flags:")), [])
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
    return " ".join(f for f in wanted if f in have) or "none of AVX2/AVX-512/VNNI/BF16/AMX"


def default_llama_server() -> Path | None:
    found = shutil.which("llama-server")
    if found:
        return Path(found)
    return LLAMA_SERVER_BUILT if LLAMA_SERVER_BUILT.exists() else None


def subset(cases: list[dict[str, Any]], every: int, limit: int | None) -> list[dict[str, Any]]:
    """Every `every`-th case of each category (stratified: simple and multiple keep their share), then `limit`."""
    if every > 1:
        seen: dict[str, int] = {}
        kept = []
        for case in cases:
            i = seen.get(case["category"], 0)
            seen[case["category"]] = i + 1
            if i % every == 0:
                kept.append(case)
        cases = kept
    return cases[:limit]


def notes(args: argparse.Namespace, argvs: Sequence[Sequence[str]]) -> list[str]:
    commands = ", then ".join(f"`python -m benchmarks.function_calling {' '.join(a)}`" for a in argvs)
    peer = (
        f"`{args.llama_server}` ({peer_version(args.llama_server)})"
        if args.llama_server
        else "**not found** (no --llama-server PATH, none on PATH or at build-llama): edge only"
    )
    return [
        f"# Function calling: edge beside llama-server, {dt.date.today().isoformat()}",
        "",
        f"- CPU: {cpu_name()} (lscpu; {cpu_flags()}); {args.threads} threads per engine, one engine at a time,"
        f" n_ctx {args.ctx}",
        f"- Command: {commands}",
        f"- Peer: {peer}",
        f"- Cases: {DATA.relative_to(ROOT)} (BFCL-style simple and multiple), temperature 0, max_tokens {MAX_TOKENS};"
        " scored on the first call: valid = parses and validates against the schema, right function,"
        ' right arguments by value (strings trimmed, case-insensitive; numbers by value). "of which right if'
        ' parsed": text answers whose first JSON object (bare, fenced or tagged) names the right function with the'
        " right arguments, a call the engine did not return as one (not counted as right).",
        f"- System message: {'none (user-only prompts)' if args.system is None else repr(args.system)}",
        "",
    ]


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument(
        "--llama-server",
        type=Path,
        default=default_llama_server(),
        help=f"llama.cpp's server binary (default: on PATH, else {LLAMA_SERVER_BUILT}; none: edge only)",
    )
    ap.add_argument(
        "--backend", default="auto", help="edge's backend (default auto: edge's own choice for the model)"
    )
    ap.add_argument("--edge-choices", nargs="+", default=["auto", "required"])
    ap.add_argument("--peer-choices", nargs="+", default=["auto", "required"])
    ap.add_argument("--threads", type=int, default=1, help="per engine (default 1: the cores are shared)")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument(
        "--engines", nargs="+", choices=["edge", "llama-server"], default=["edge", "llama-server"]
    )
    ap.add_argument("--merge", nargs="+", type=Path, help="only tabulate these results' .json files together")
    ap.add_argument("--limit", type=int, help="only the first N cases (a quick check)")
    ap.add_argument(
        "--every", type=int, default=1, help="every N-th case of each category (a stratified subset)"
    )
    ap.add_argument("--tag", default="", help="appended to the results' name")
    ap.add_argument("--system", help="an app's system message before each question (default: none)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    if args.llama_server is None:
        print(
            "no llama-server given or found: measuring edge only, the peer's columns are left out",
            file=sys.stderr,
        )
    data = json.loads(DATA.read_text())
    data["cases"] = subset(data["cases"], args.every, args.limit)
    if args.merge:  # runs made apart (one engine at a time, in turns), tabulated side by side by model
        runs = [run for p in args.merge for run in json.loads(p.read_text())["runs"]]
        runs.sort(key=lambda run: args.models.index(run["model"]) if run["model"] in args.models else 99)
        report(args, argv, runs, data)
        return
    runs = []
    for model in args.models:  # written after each model: a long run keeps what it has measured
        runs += run_model(model, args, data)
        report(args, argv, runs, data)


def report(
    args: argparse.Namespace, argv: list[str], runs: list[dict[str, Any]], data: dict[str, Any]
) -> None:
    cases = {c["id"]: c for c in json.loads(DATA.read_text())["cases"]}  # all: merged runs may be subsets
    for run in runs:
        run["tally"] = tally(run["rows"], cases)
    parts = [json.loads(p.read_text())["argv"] for p in args.merge or []]
    lines = notes(args, [*parts, argv]) + table(runs)
    stem = RESULTS / f"function-calling-{dt.date.today().isoformat()}{args.tag}"
    write_results(stem, {"argv": argv, "cpu": cpu_name(), "runs": runs}, lines)


if __name__ == "__main__":
    main()
