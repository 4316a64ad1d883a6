"""Which constrained-decoding engine edge uses for JSON Schema (issue 27), measured on the Qwen vocabulary.

    python -m benchmarks.grammar_engines                      # runs edge bench for the decode step too
    python -m benchmarks.grammar_engines --decode-json F.json # reuse an `edge bench --json` of the decode step

The vocabulary is qwen2.5-coder-0.5b's own (edge's tokenizer, token_bytes of every id, control tokens marked
special), padded with empty tokens to the logits width, 151,936. For each engine (llguidance, outlines-core)
and each schema of tests/data/schemas.json:
- compile: JSON Schema -> a matcher over the vocabulary, cold (first time in a fresh worker), again (the same
  schema a second time) and a new state from the compiled object (what a cache of compiled schemas would pay);
  a refusal is coverage, with the engine's own message;
- walk: the example instance's compact JSON, tokenized by edge, fed token by token: the mask for the 151,936
  tokens into an int32 bitmask, the token checked against it (must be allowed), then advanced; microseconds
  per token, the first walk (cold lazy state) and two more (warm);
- enforcement: the schema's `invalid` instance walked the same way must be refused at some token or at the
  end (EOS not allowed); an engine that takes it whole ignored the constraint (a silent wrong answer).
Each engine runs in its own worker process with a per-schema timeout: a compile past it is recorded, not waited
for. Then edge's side (a bitmask applied to one logits row in numpy), the decode step it is measured against,
the wheels' weight (xgrammar with its dependencies, pip download) and the CPU.
Writes benchmarks/results/grammar-engines-<date>.json and .md (the verdict below its tables is written by hand).
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import importlib.metadata as md
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.results_io import write_results

ROOT = Path(__file__).resolve().parents[1]

SCHEMAS = ROOT / "tests" / "data" / "schemas.json"
N_VOCAB = 151_936  # qwen2.5's logits width (the GGUF vocabulary is 151,665 tokens)
ENGINES = ("llguidance", "outlines-core")
WALKS = 3


@dataclass(frozen=True)
class Vocab:
    tokens: list[bytes]  # per id, padded with b"" to N_VOCAB
    special: frozenset[int]  # ATTR_CONTROL ids
    eos: tuple[int, ...]  # end-of-generation ids
    bos: int | None


def load_vocab(model: str) -> Vocab:
    from edge.models.checked import check_model
    from edge.models.tokenizer import ATTR_CONTROL

    tok = check_model(model).tokenizer
    tokens = [tok.token_bytes(i) for i in range(tok.vocab_size)]
    tokens += [b""] * (N_VOCAB - len(tokens))
    special = frozenset(i for i in range(tok.vocab_size) if int(tok._attrs[i]) & ATTR_CONTROL)
    # the model's own EOS (<|im_end|>) first: outlines-core takes one, the walks check it; llguidance takes all
    first = () if tok.eos_id is None else (tok.eos_id,)
    eos = first + tuple(sorted(tok.eog_ids - set(first)))
    return Vocab(tokens, special, eos, tok.bos_id)


def example_tokens(model: str, schemas: list[dict[str, Any]]) -> list[dict[str, list[int]]]:
    """Each schema's example (and invalid instance) as compact JSON, tokenized by edge as a model would write it."""
    from edge.models.checked import check_model

    tok = check_model(model).tokenizer
    out = []
    for entry in schemas:
        row = {}
        for key in ("example", "invalid"):
            if key in entry:
                text = json.dumps(entry[key], separators=(",", ":"), ensure_ascii=False)
                ids = tok.encode(text, parse_special=False)
                assert tok.decode(ids) == text, f"{entry['name']}: edge's tokens do not decode to the {key}"
                row[key] = ids
        out.append(row)
    return out


def check_schemas(schemas: list[dict[str, Any]]) -> None:
    """Every example valid and every invalid instance invalid, by jsonschema (the reference validator)."""
    import jsonschema

    for entry in schemas:
        cls = jsonschema.validators.validator_for(entry["schema"])
        cls.check_schema(entry["schema"])
        validator = cls(entry["schema"], format_checker=cls.FORMAT_CHECKER)
        validator.validate(entry["example"])
        if "invalid" in entry and validator.is_valid(entry["invalid"]):
            raise SystemExit(f"{entry['name']}: its invalid instance is valid by jsonschema")


# ---- engines (built inside a worker process) ---------------------------------------------------------------


class _LlgTokenizer:
    """What llguidance.TokenizerWrapper reads: ids, token bytes (special ones prefixed 0xff) and an encoder."""

    def __init__(self, vocab: Vocab, tok: Any) -> None:
        self._tok = tok
        self.eos_token_id = vocab.eos[0]
        self.bos_token_id = vocab.bos
        self.tokens = [b"\xff" + t if i in vocab.special else t for i, t in enumerate(vocab.tokens)]
        self.special_token_ids = sorted(vocab.special)

    def __call__(self, data: bytes) -> list[int]:
        return self._tok.encode(data.decode("utf-8", "replace"), parse_special=False)


class Llguidance:
    def __init__(self, vocab: Vocab, tok: Any) -> None:
        import llguidance

        self._llg = llguidance
        wrapper = llguidance.TokenizerWrapper(_LlgTokenizer(vocab, tok))
        self.tokenizer = llguidance.LLTokenizer(wrapper, n_vocab=N_VOCAB, eos_token=list(vocab.eos))

    def compile(self, schema: dict[str, Any]) -> Any:
        grammar = self._llg.LLMatcher.grammar_from_json_schema(schema)  # raises ValueError on what it refuses
        matcher = self._llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher

    def new_state(self, compiled: Any) -> Any:
        return compiled.deep_copy()

    def fill_mask(self, state: Any, mask: np.ndarray) -> None:
        state.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)

    def advance(self, state: Any, token: int) -> bool:
        return state.consume_token(token)


class OutlinesCore:
    def __init__(self, vocab: Vocab, tok: Any) -> None:
        import outlines_core

        self._oc = outlines_core
        by_bytes: dict[bytes, list[int]] = {}
        for i, t in enumerate(vocab.tokens):
            if t and i not in vocab.special and i not in vocab.eos:
                by_bytes.setdefault(t, []).append(i)
        self.vocabulary = outlines_core.Vocabulary(vocab.eos[0], by_bytes)

    def compile(self, schema: dict[str, Any]) -> Any:
        regex = self._oc.json_schema.build_regex_from_schema(json.dumps(schema))
        return self._oc.Index(regex, self.vocabulary)

    def new_state(self, compiled: Any) -> Any:
        return self._oc.Guide(compiled)

    def fill_mask(self, state: Any, mask: np.ndarray) -> None:
        state.write_mask_into(mask.ctypes.data, mask.size, 4)

    def advance(self, state: Any, token: int) -> bool:
        state.advance(token, return_tokens=False)
        return True


def _allowed(mask: np.ndarray, token: int) -> bool:
    return bool((int(mask[token >> 5]) >> (token & 31)) & 1)


def walk(engine: Any, state: Any, tokens: list[int], eos: int) -> dict[str, Any]:
    """Mask + check + advance per token; then whether EOS is allowed at the end. Times in microseconds."""
    mask = np.zeros((N_VOCAB + 31) // 32, dtype=np.int32)
    mask_us, step_us = [], []
    for pos, token in enumerate(tokens):
        t0 = time.perf_counter_ns()
        engine.fill_mask(state, mask)
        t1 = time.perf_counter_ns()
        if not _allowed(mask, token):
            return {"accepted": False, "refused_at": pos, "mask_us": mask_us, "step_us": step_us}
        try:
            ok = engine.advance(state, token)
        except Exception as err:  # outlines-core raises on a token its index has no transition for
            return {
                "accepted": False,
                "refused_at": pos,
                "error": str(err)[:200],
                "mask_us": mask_us,
                "step_us": step_us,
            }
        t2 = time.perf_counter_ns()
        if not ok:
            return {"accepted": False, "refused_at": pos, "mask_us": mask_us, "step_us": step_us}
        mask_us.append((t1 - t0) / 1e3)
        step_us.append((t2 - t0) / 1e3)
    engine.fill_mask(state, mask)
    return {"accepted": True, "eos_allowed": _allowed(mask, eos), "mask_us": mask_us, "step_us": step_us}


def run_schema(engine: Any, entry: dict[str, Any], toks: dict[str, list[int]], eos: int) -> dict[str, Any]:
    row: dict[str, Any] = {"name": entry["name"]}
    t0 = time.perf_counter()
    try:
        compiled = engine.compile(entry["schema"])
    except Exception as err:
        return {**row, "compiled": False, "error": f"{type(err).__name__}: {str(err).strip()[:300]}"}
    row["compile_ms"] = (time.perf_counter() - t0) * 1e3
    if row["compile_ms"] < 2000:  # a second multi-second build says nothing more
        t0 = time.perf_counter()
        engine.compile(entry["schema"])
        row["compile_again_ms"] = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    engine.new_state(compiled)
    row["new_state_ms"] = (time.perf_counter() - t0) * 1e3
    walks = [walk(engine, engine.new_state(compiled), toks["example"], eos) for _ in range(WALKS)]
    row["compiled"] = True
    row["example_accepted"] = all(w["accepted"] and w["eos_allowed"] for w in walks)
    row["example_walk"] = {k: v for k, v in walks[0].items() if k not in ("mask_us", "step_us")}
    row["cold_step_us"] = walks[0]["step_us"]
    row["warm_step_us"] = [x for w in walks[1:] for x in w["step_us"]]
    row["warm_mask_us"] = [x for w in walks[1:] for x in w["mask_us"]]
    if "invalid" in toks:
        bad = walk(engine, engine.new_state(compiled), toks["invalid"], eos)
        row["invalid_refused"] = not (bad["accepted"] and bad["eos_allowed"])
    return row


def _worker(name: str, vocab: Vocab, model: str, conn: Any) -> None:
    from edge.models.checked import check_model

    tok = check_model(model).tokenizer  # llguidance encodes text with it (its TokenizerWrapper)
    t0 = time.perf_counter()
    engine = {"llguidance": Llguidance, "outlines-core": OutlinesCore}[name](vocab, tok)
    conn.send({"tokenizer_s": time.perf_counter() - t0})
    while (job := conn.recv()) is not None:
        conn.send(run_schema(engine, *job))


class Worker:
    """One engine in a spawned process: a compile that runs past the timeout is killed, then a fresh worker."""

    def __init__(self, name: str, vocab: Vocab, model: str) -> None:
        self._args = (name, vocab, model)
        self.tokenizer_s: list[float] = []
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_worker, args=(*self._args, child), daemon=True)
        self._proc.start()
        self.tokenizer_s.append(self._conn.recv()["tokenizer_s"])

    def run(
        self, entry: dict[str, Any], toks: dict[str, list[int]], eos: int, timeout_s: float
    ) -> dict[str, Any]:
        self._conn.send((entry, toks, eos))
        if self._conn.poll(timeout_s):
            return self._conn.recv()
        self._proc.kill()
        self._proc.join()
        self._start()
        return {
            "name": entry["name"],
            "compiled": False,
            "timeout": True,
            "error": f"no result in {timeout_s:.0f} s",
        }

    def close(self) -> None:
        self._conn.send(None)
        self._proc.join(10)


# ---- edge's side, the decode step, weight, machine ---------------------------------------------------------


def mask_apply_us(repeat: int = 300) -> dict[str, float]:
    """A bitmask applied to one logits row in numpy, median µs, by the share of tokens allowed: np.where
    branches per element (a 50 % mask mispredicts), a lookup-table add does not."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(N_VOCAB, dtype=np.float32)
    table = np.array([-np.inf, 0.0], dtype=np.float32)
    out = {}
    for density in (0.01, 0.5, 0.99):
        bits = rng.random((N_VOCAB + 31) // 32 * 32) < density
        mask = np.packbits(bits, bitorder="little").view(np.int32)

        def unpack(mask: np.ndarray = mask) -> np.ndarray:
            return np.unpackbits(mask.view(np.uint8), bitorder="little")[:N_VOCAB].view(bool)

        variants = {
            "unpack": unpack,
            "unpack+where": lambda unpack=unpack: np.where(unpack(), logits, np.float32(-np.inf)),
            "unpack+table-add": lambda unpack=unpack: logits + table[unpack().view(np.uint8)],
        }
        for name, fn in variants.items():
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter_ns()
                fn()
                times.append((time.perf_counter_ns() - t0) / 1e3)
            out[f"{name} {density:.0%}"] = statistics.median(times)
    return out


def decode_step(model: str, decode_json: Path | None) -> dict[str, Any]:
    """Decode tok/s of `model` on the own ORT graph from `edge bench --json` (run here unless given)."""
    if decode_json is None:
        decode_json = Path(tempfile.mkdtemp()) / "bench.json"
        cmd = [
            str(Path(sys.executable).parent / "edge"),
            "bench",
            model,
            "--backends",
            "ort",
            "--repeat",
            "1",
        ]
        cmd += ["--prompt-tokens", "16", "--gen-tokens", "32", "--json", str(decode_json)]
        subprocess.run(cmd, check=True)
    data = json.loads(decode_json.read_text())
    return {"model": model, "bench": data}


def decode_tok_s(bench: dict[str, Any]) -> float:
    (ort,) = [r for r in bench["results"] if r["backend"] == "ort"]
    return float(ort["decode_tok_s"])


def installed_bytes(dist: str) -> int:
    files = md.distribution(dist).files or []
    return sum(f.size or 0 for f in files)


def wheel_weight(xgrammar_dir: Path | None) -> dict[str, Any]:
    """Wheel bytes as pip downloads them: llguidance and outlines-core alone (no runtime deps), xgrammar with all."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for dist in ("llguidance", "outlines-core"):
            spec = f"{dist}=={md.version(dist)}"
            sub = Path(tmp) / dist
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", spec, "-d", str(sub)], check=True
            )
            deps = md.distribution(dist).requires or []
            out[dist] = {
                "wheel_bytes": sum(f.stat().st_size for f in sub.iterdir()),
                "installed_bytes": installed_bytes(dist),
                "runtime_requires": [d for d in deps if "extra ==" not in d],
            }
    if xgrammar_dir is not None:
        wheels = sorted(xgrammar_dir.glob("*.whl"), key=lambda f: -f.stat().st_size)
        own = next(f for f in wheels if f.name.startswith("xgrammar-"))
        out["xgrammar"] = {
            "wheel_bytes": own.stat().st_size,
            "with_deps_bytes": sum(f.stat().st_size for f in wheels),
            "n_wheels": len(wheels),
            "largest": [(f.name, f.stat().st_size) for f in wheels[:6]],
            "torch_free": xgrammar_imports(own),
        }
    return out


def xgrammar_imports(wheel: Path) -> dict[str, list[str]]:
    """Module-level imports of torch/transformers in xgrammar's core modules: what `import xgrammar` needs."""
    found: dict[str, list[str]] = {}
    with zipfile.ZipFile(wheel) as zf:
        for mod in ("__init__", "matcher", "tokenizer_info", "compiler", "grammar"):
            tree = ast.parse(zf.read(f"xgrammar/{mod}.py"))
            names = [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names]
            names += [n.module or "" for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 0]
            heavy = sorted({n.split(".")[0] for n in names} & {"torch", "transformers", "triton"})
            if heavy:
                found[f"xgrammar/{mod}.py"] = heavy
    return found


def machine() -> dict[str, Any]:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    return {
        "cpu": fields.get("Model name", "?").strip(),
        "cpus": os.cpu_count(),
        "flags": sorted(f for f in flags if f.startswith(("avx512", "avx_vnni", "amx")) or f == "avx2"),
        "loadavg_start": os.getloadavg(),
        "versions": {d: md.version(d) for d in ("llguidance", "outlines-core", "numpy", "onnxruntime")},
    }


# ---- summary -----------------------------------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def summarize(rows: list[dict[str, Any]], tokenizer_s: list[float], step_ms: float) -> dict[str, Any]:
    done = [r for r in rows if r["compiled"]]
    warm = [x for r in done for x in r["warm_step_us"]]
    cold = [x for r in done for x in r["cold_step_us"]]
    with_invalid = [r for r in done if "invalid_refused" in r]
    compile_ms = [r["compile_ms"] for r in done]
    return {
        "tokenizer_s": tokenizer_s[0],
        "compiled": len(done),
        "schemas": len(rows),
        "timeouts": [r["name"] for r in rows if r.get("timeout")],
        "refused": {r["name"]: r["error"] for r in rows if not r["compiled"]},
        "example_accepted": sum(r["example_accepted"] for r in done),
        "example_rejected": [r["name"] for r in done if not r["example_accepted"]],
        "invalid_checked": len(with_invalid),
        "invalid_refused": sum(r["invalid_refused"] for r in with_invalid),
        "invalid_accepted": [r["name"] for r in with_invalid if not r["invalid_refused"]],
        "compile_ms_median": statistics.median(compile_ms) if compile_ms else None,
        "compile_ms_max": max(compile_ms) if compile_ms else None,
        "compile_again_ms_median": _median([r["compile_again_ms"] for r in done if "compile_again_ms" in r]),
        "first_mask_ms_median": _median(
            [r["compile_ms"] + r["cold_step_us"][0] / 1e3 for r in done if r["cold_step_us"]]
        ),
        "new_state_ms_median": statistics.median([r["new_state_ms"] for r in done]) if done else None,
        "warm_step_us_median": _pct(warm, 50),
        "warm_step_us_p99": _pct(warm, 99),
        "cold_step_us_median": _pct(cold, 50),
        "cold_step_us_p99": _pct(cold, 99),
        "warm_step_pct_of_decode": _pct(warm, 50) / (step_ms * 1e3) * 100,
        "warm_p99_pct_of_decode": _pct(warm, 99) / (step_ms * 1e3) * 100,
        "cold_p99_pct_of_decode": _pct(cold, 99) / (step_ms * 1e3) * 100,
    }


def _cell(r: dict[str, Any]) -> str:
    if not r["compiled"]:
        return "timeout | - | -" if r.get("timeout") else "refused | - | -"
    enforced = {True: "yes", False: "**no**"}.get(r.get("invalid_refused"), "n/a")
    ok = "yes" if r["example_accepted"] else f"**no** (at {r['example_walk'].get('refused_at', 'EOS')})"
    med = statistics.median(r["warm_step_us"]) if r["warm_step_us"] else float("nan")
    return f"{r['compile_ms']:.1f} | {med:.0f} / {max(r['cold_step_us'], default=0):.0f} | {ok}, {enforced}"


def report(data: dict[str, Any]) -> list[str]:
    m, s, w = data["machine"], data["summary"], data["weight"]
    step_ms = data["decode_step_ms"]
    lines = [
        f"# Constrained-decoding engines on the Qwen vocabulary ({data['date']})",
        "",
        f"`python -m benchmarks.grammar_engines` on {m['cpu']}, {m['cpus']} CPUs ({', '.join(m['flags'])}), "
        f"load average {m['loadavg_start'][0]:.1f} at the start (the machine is shared). Versions: "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items())
        + f". Vocabulary: {data['vocab_model']}'s, {N_VOCAB:,} ids ({data['n_special']} control tokens special, EOS {data['eos'][0]}). "
        f"{len(data['rows'][ENGINES[0]])} schemas (tests/data/schemas.json), per-schema timeout {data['timeout_s']:.0f} s.",
        "",
        f"Decode step: {data['decode_model']} on the own ORT graph, {data['decode_tok_s']:.1f} tok/s measured on "
        f"this busy machine (`edge bench --backends ort --repeat 1 --prompt-tokens 16 --gen-tokens 32`), "
        f"{data['reference_tok_s']:.1f} tok/s recorded on a quieter machine; the % below are of the faster "
        f"one, {step_ms:.1f} ms/token.",
        "",
        "| | " + " | ".join(ENGINES) + " |",
        "|---|" + "---|" * len(ENGINES),
    ]

    def row(label: str, fmt: Any) -> None:
        lines.append(f"| {label} | " + " | ".join(fmt(s[e], w.get(e, {})) for e in ENGINES) + " |")

    row("tokenizer/vocabulary build", lambda x, _: f"{x['tokenizer_s']:.2f} s")
    row("schemas compiled", lambda x, _: f"{x['compiled']}/{x['schemas']} ({len(x['timeouts'])} timeouts)")
    row("example accepted (tokens + EOS)", lambda x, _: f"{x['example_accepted']}/{x['compiled']}")
    row("invalid instance refused", lambda x, _: f"{x['invalid_refused']}/{x['invalid_checked']}")
    row("compile, median / max", lambda x, _: f"{_ms(x['compile_ms_median'])} / {_ms(x['compile_ms_max'])}")
    row("compile again (when < 2 s), median", lambda x, _: _ms(x["compile_again_ms_median"]))
    row("compile + first mask, median", lambda x, _: _ms(x["first_mask_ms_median"]))
    row("new state from compiled, median", lambda x, _: _ms(x["new_state_ms_median"]))
    row(
        "mask+advance per token, warm median / p99",
        lambda x, _: f"{x['warm_step_us_median']:.0f} / {x['warm_step_us_p99']:.0f} µs",
    )
    row(
        "first walk (cold) median / p99",
        lambda x, _: f"{x['cold_step_us_median']:.0f} / {x['cold_step_us_p99']:.0f} µs",
    )
    row(
        "warm median / p99 / cold p99, % of a decode step",
        lambda x, _: (
            f"{x['warm_step_pct_of_decode']:.2f} / {x['warm_p99_pct_of_decode']:.2f} / {x['cold_p99_pct_of_decode']:.1f} %"
        ),
    )
    row(
        "wheel / installed",
        lambda _, y: (
            f"{y['wheel_bytes'] / 1e6:.1f} / {y['installed_bytes'] / 1e6:.1f} MB, deps: {', '.join(y['runtime_requires']) or 'none'}"
        ),
    )
    xg = w.get("xgrammar")
    if xg:
        lines += [
            "",
            f"xgrammar 0.2.9 (excluded by weight, not run): its wheel {xg['wheel_bytes'] / 1e6:.1f} MB, with its "
            f"dependencies {xg['with_deps_bytes'] / 1e9:.2f} GB in {xg['n_wheels']} wheels from PyPI (largest: "
            + ", ".join(f"{n.split('-')[0]} {b / 1e6:.0f} MB" for n, b in xg["largest"][:5])
            + "). Module-level imports of the heavy dependencies in its core: "
            + "; ".join(f"{k}: {', '.join(v)}" for k, v in xg["torch_free"].items())
            + " — `import xgrammar` (GrammarCompiler, TokenizerInfo, GrammarMatcher) does not run without them.",
        ]
    a = data["mask_apply_us"]
    lines += [
        "",
        f"edge's side, one {N_VOCAB:,}-float logits row in numpy (median µs): "
        + ", ".join(f"{k} {v:.0f}" for k, v in a.items())
        + f" (np.where at 50 %: {a['unpack+where 50%'] / (step_ms * 1e3) * 100:.2f} % of a decode step).",
        "",
        "Per schema: compile ms | warm median / cold max µs per token | example accepted, invalid refused",
        "",
        "| schema | "
        + " | ".join(f"{e} compile ms | {e} µs/token | {e} ok, enforced" for e in ENGINES)
        + " |",
        "|---|" + "---|---|---|" * len(ENGINES),
    ]
    by = {e: {r["name"]: r for r in data["rows"][e]} for e in ENGINES}
    for r in data["rows"][ENGINES[0]]:
        lines.append(f"| {r['name']} | " + " | ".join(_cell(by[e][r["name"]]) for e in ENGINES) + " |")
    lines += ["", "Refused or timed out, with the engine's message:", ""]
    for e in ENGINES:
        for name, err in s[e]["refused"].items():
            lines.append(f"- {e}, {name}: {err.splitlines()[0][:200]}")
    return lines


def _ms(v: float | None) -> str:
    return "-" if v is None else (f"{v / 1e3:.2f} s" if v >= 1000 else f"{v:.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab-model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--decode-model", default="qwen2.5-coder-1.5b")
    ap.add_argument(
        "--decode-json", type=Path, help="an `edge bench --json` file of --decode-model (else run)"
    )
    ap.add_argument(
        "--xgrammar-wheels", type=Path, help="a `pip download xgrammar -d DIR` folder (with deps)"
    )
    ap.add_argument(
        "--reference-tok-s",
        type=float,
        default=14.1,
        help="a recorded decode tok/s of --decode-model (default: 1.5b ort, fast-graphs-2026-12-02-avx2.md)",
    )
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds one schema may take per engine")
    ap.add_argument("--only", help="comma-separated schema names (a quick run)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()

    schemas = json.loads(SCHEMAS.read_text())
    if args.only:
        schemas = [s for s in schemas if s["name"] in args.only.split(",")]
    check_schemas(schemas)
    data: dict[str, Any] = {
        "date": dt.date.today().isoformat(),
        "machine": machine(),
        "timeout_s": args.timeout,
    }
    decode = decode_step(args.decode_model, args.decode_json)
    data.update(decode_model=args.decode_model, decode_bench=decode["bench"])
    data["decode_tok_s"] = decode_tok_s(decode["bench"])
    data["reference_tok_s"] = args.reference_tok_s
    # the faster step is the denominator: a busy machine's slow step would flatter the engines
    data["decode_step_ms"] = 1e3 / max(data["decode_tok_s"], args.reference_tok_s)
    vocab = load_vocab(args.vocab_model)
    toks = example_tokens(args.vocab_model, schemas)
    data.update(vocab_model=args.vocab_model, n_special=len(vocab.special), eos=vocab.eos)
    data["rows"], data["summary"] = {}, {}
    for name in ENGINES:
        worker = Worker(name, vocab, args.vocab_model)
        rows = []
        for entry, t in zip(schemas, toks, strict=True):
            rows.append(worker.run(entry, t, vocab.eos[0], args.timeout))
            print(name, rows[-1]["name"], rows[-1].get("compile_ms", rows[-1].get("error")), flush=True)
        worker.close()
        data["rows"][name] = rows
        data["summary"][name] = summarize(rows, worker.tokenizer_s, data["decode_step_ms"])
    data["mask_apply_us"] = mask_apply_us()
    data["weight"] = wheel_weight(args.xgrammar_wheels)
    data["machine"]["loadavg_end"] = os.getloadavg()
    write_results(args.out / f"grammar-engines-{data['date']}", data, report(data))


if __name__ == "__main__":
    main()
