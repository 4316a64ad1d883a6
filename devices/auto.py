"""`--backend auto`: the backend that measures fastest for this model on this machine.

What decides, best first:
1. measured here: `edge bench` records its medians per (model file SHA-256, machine, precision) in
   `<cache>/backend-speed.json`; its latest run that measured two or more of the candidates decides.
2. the prior: speeds recorded on the reference machine (`auto_prior.json`, written by
   benchmarks/auto_prior.py from an `edge bench` results file): the same file when it is a catalog model,
   else the recorded model nearest in size. Recorded at `--precision fast` only.
3. nothing recorded (`--precision exact` unmeasured): ONNX Runtime, said as such.

NOTE: auto never measures while loading: measuring means loading every candidate (seconds to build a graph,
twice the memory) and 2 shared cores make a short measurement noise; `edge bench MODEL --backends all` is the
measurement (interleaved rounds), and its result is reused until the file, the CPU or a runtime changes.

"Fastest" is the time of a reference request, 128 prompt tokens (the first prompt after load) and 128 tokens
decoded, as `edge bench` measures by default. Only the own graphs honour `--precision exact`, so an exact
request chooses among them; a file the own graphs refuse (models/arch.py) goes to llama.cpp.

By phase: a measured run also weighs a split (devices/auto_split.py): the fastest prefill half and the fastest
decode half of the own graphs it measured (whole backends, and the halves of the phase plans it measured, such
as OpenVINO's bf16 prompt half), chosen only where that request runs SPLIT_MARGIN faster than the fastest single
backend; the prior and the default never split.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from edge.devices.auto_split import (
    REF_GEN,
    REF_PROMPT,
    HalfSpeed,
    Speed,
    SplitVerdict,
    halves_json,
    parse_halves,
    phase_table,
    positive,
    weigh_split,
)
from edge.devices.llamacpp import INSTALL_LLAMACPP
from edge.devices.precision import BF16
from edge.errors import BackendUnavailableError, ModelFormatError
from edge.models.jsonstore import read_json, write_json

__all__ = [
    "AUTO",
    "AUTO_BACKENDS",
    "REF_GEN",
    "REF_PROMPT",
    "Choice",
    "HalfSpeed",
    "Speed",
    "choose_backend",
    "machine_key",
    "model_sha256",
    "record_speeds",
]

AUTO = "auto"
# The backends auto chooses between, in the order a tie goes.
AUTO_BACKENDS = ("llamacpp", "ort", "openvino")
GRAPH_BACKENDS = ("ort", "openvino")
SPEEDS_FILE = "backend-speed.json"
_FORMAT = 1
_DISTS = {"llamacpp": "llama-cpp-python", "ort": "onnxruntime", "openvino": "openvino"}


@dataclass(frozen=True)
class Choice:
    """What auto chose and why. `source`: measured | prior | default | only (one candidate) | refused (the own
    graphs do not run the file; `note` says why). `split`: the split by phase the measurement allowed, weighed
    against the fastest single backend; when it is chosen, `backend` is its label (`openvino:bf16+ort`) and
    `plan` the `--plan` it opens as."""

    backend: str
    source: str
    why: str
    speeds: Mapping[str, Speed] = field(default_factory=dict)
    note: str | None = None
    split: SplitVerdict | None = None

    @property
    def plan(self) -> str | None:
        """The phase plan auto runs (`prefill=...,decode=...`), or None for one backend."""
        return self.split.plan if self.split is not None and self.split.chosen else None

    @property
    def label(self) -> str:
        """For the summary line: `auto, measured`."""
        return f"auto, {self.source}"

    def explain(self, *, figures: bool = True) -> str:
        """Why, then (figures) the speeds it weighed: measured here, or the prior's, said as recorded elsewhere."""
        lines = [f"backend auto -> {self.backend} ({self.source}): {self.why}"]
        if not figures or not self.speeds:
            return lines[0]
        if self.split is not None:
            lines += ["  " + line for line in self.split.explain()]
        if self.source == "prior":
            lines.append("  the recorded speeds (another machine's, not measured here):")
        fastest = min((s.request_s() for s in self.speeds.values()), default=0.0)
        for b, s in sorted(self.speeds.items(), key=lambda kv: kv[1].request_s()):
            warm = "" if s.prefill_warm_tok_s is None else f" (warm {s.prefill_warm_tok_s:.0f})"
            lines.append(
                f"  {b:<9} prefill {s.prefill_tok_s:7.0f} tok/s{warm}  decode {s.decode_tok_s:6.1f} tok/s  "
                f"{REF_PROMPT}+{REF_GEN}-token request {s.request_s():5.2f} s ({s.request_s() / fastest:.2f}x)"
            )
        return "\n".join(lines)


# -- keys --------------------------------------------------------------------------------------------------
def machine_key(threads: int | None) -> dict[str, Any]:
    """What a measurement holds for: the CPU (its model name and instruction sets: a virtual machine's name can
    be the vendor's alone, "AMD EPYC" for an AVX2-only part and a Zen 5 with BF16 alike), the thread count, the
    runtimes' versions (installed ones) and the own graphs' format (a graph change, such as a new attention
    form, makes earlier measurements stale). A measured bf16 half therefore stands only where bf16 ran."""
    from edge.devices.cpu import probe_cpu
    from edge.devices.graph_decoder import GRAPH_FORMAT

    cpu = probe_cpu()
    versions: dict[str, str | None] = {}
    for backend, dist in _DISTS.items():
        try:
            versions[backend] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[backend] = None
    try:
        versions["edge"] = metadata.version("edge-llm")
    except metadata.PackageNotFoundError:
        versions["edge"] = None
    versions["graph_format"] = str(GRAPH_FORMAT)
    isa = sorted(k for k, on in cpu.isa.items() if on)
    return {"cpu": cpu.model, "isa": isa, "threads": threads or cpu.physical_cores, "versions": versions}


def _catalog_sha256(path: Path) -> str | None:
    """The catalog's SHA-256 when `path` is a verified catalog file (no hashing), else None."""
    from edge.models.catalog import CATALOG
    from edge.models.store import is_verified, model_path

    real = path.resolve()
    for entry in CATALOG.values():
        if model_path(entry).resolve() == real and is_verified(entry):
            return entry.sha256
    return None


def model_sha256(path: Path) -> str:
    """The file's SHA-256: the catalog's for a verified catalog file, else hashed once and remembered by
    (path, size, mtime) in the cache."""
    from edge.models.artifact import file_sha256
    from edge.models.store import cache_dir

    known = _catalog_sha256(path)
    if known is not None:
        return known
    real = path.resolve()
    st = real.stat()
    memo_path = cache_dir() / "sha256-memo.json"
    key = f"{real}|{st.st_size}|{st.st_mtime_ns}"
    memo = read_json(memo_path).get("files", {})
    if isinstance(memo, dict) and isinstance(memo.get(key), str):
        return str(memo[key])
    digest = file_sha256(real)
    memo = memo if isinstance(memo, dict) else {}
    memo[key] = digest
    write_json(memo_path, {"files": memo})
    return digest


# -- the measurement store ---------------------------------------------------------------------------------
def _speeds_path() -> Path:
    from edge.models.store import cache_dir

    return cache_dir() / SPEEDS_FILE


def _parse_speeds(raw: object) -> dict[str, Speed]:
    """A run's backends as stored; damaged entries are left out (the warm prompt is absent in records before
    auto by phase)."""
    out: dict[str, Speed] = {}
    for b, s in raw.items() if isinstance(raw, dict) else ():
        if b not in AUTO_BACKENDS or not isinstance(s, dict):
            continue
        prefill, decode = positive(s.get("prefill_tok_s")), positive(s.get("decode_tok_s"))
        if prefill is not None and decode is not None:
            out[b] = Speed(prefill, decode, positive(s.get("prefill_warm_tok_s")))
    return out


def record_speeds(
    sha256: str,
    machine: Mapping[str, Any],
    precision: str,
    speeds: Mapping[str, Speed],
    source: str,
    halves: Mapping[str, HalfSpeed] | None = None,
) -> bool:
    """Remember one measurement run (replacing the earlier one for the same key); runs of fewer than two
    backends compare nothing and are not kept. `halves`: what the run's phase plans measured of each half
    (devices/auto_split.py), kept beside the backends (readers before auto by phase skip them). Returns
    whether it was kept."""
    kept = {b: s for b, s in speeds.items() if b in AUTO_BACKENDS}
    if len(kept) < 2:
        return False
    path = _speeds_path()
    data = read_json(path)
    runs = data.get("runs") if data.get("format") == _FORMAT else None
    runs = [r for r in (runs if isinstance(runs, list) else []) if isinstance(r, dict)]
    key = {"model": sha256, "machine": dict(machine), "precision": precision}
    runs = [r for r in runs if {k: r.get(k) for k in key} != key]
    runs.append(
        {
            **key,
            "backends": halves_json({b: HalfSpeed.of(s) for b, s in kept.items()}),
            **({"halves": halves_json(halves)} if halves else {}),
            "source": source,
            "recorded": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
    )
    write_json(path, {"format": _FORMAT, "runs": runs})
    return True


def _has_runs() -> bool:
    runs = read_json(_speeds_path()).get("runs")
    return isinstance(runs, list) and bool(runs)


@dataclass(frozen=True)
class _Run:
    """One recorded measurement: whole backends, the halves its phase plans measured, where it came from."""

    speeds: dict[str, Speed]
    halves: dict[str, HalfSpeed]
    source: str


def _measured(sha256: str, machine: Mapping[str, Any], precision: str) -> _Run | None:
    data = read_json(_speeds_path())
    if data.get("format") != _FORMAT or not isinstance(data.get("runs"), list):
        return None
    key = (sha256, dict(machine), precision)
    for r in reversed(data["runs"]):
        if isinstance(r, dict) and (r.get("model"), r.get("machine"), r.get("precision")) == key:
            source = f"{r.get('source', 'edge bench')}, {r.get('recorded', '?')}"
            return _Run(_parse_speeds(r.get("backends")), parse_halves(r.get("halves")), source)
    return None


def _prior() -> dict[str, Any]:
    try:
        text = resources.files("edge.devices").joinpath("auto_prior.json").read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, ValueError, ModuleNotFoundError):
        return {}
    return data if isinstance(data, dict) else {}


# -- the choice --------------------------------------------------------------------------------------------
def _fastest(speeds: Mapping[str, Speed], candidates: Sequence[str]) -> str:
    return min((b for b in candidates if b in speeds), key=lambda b: speeds[b].request_s())


def probe_candidates() -> tuple[list[str], dict[str, str]]:
    """The auto candidates whose SDK imports here and runs (llama-cpp-python is an extra), and why an installed
    one does not run (llama.cpp failing its known-answer check, devices/native_check.py)."""
    from edge.devices.registry import BACKENDS

    out, refused = [], {}
    for b in AUTO_BACKENDS:
        try:
            status = BACKENDS[b].probe()
        except Exception:  # a broken SDK is an absent one here; naming it explicitly shows the error
            continue
        if status.available:
            out.append(b)
        elif status.version:  # it imports (a version) but is refused here
            refused[b] = status.reason
    return out, refused


def available_backends() -> list[str]:
    """The auto candidates whose SDK imports and runs here."""
    return probe_candidates()[0]


def own_graph_refusal(path: Path) -> str | None:
    """Why edge's own graphs refuse the file (models/arch.py), or None when they take it."""
    from edge.models.arch import ArchConfig
    from edge.models.gguf_file import open_gguf

    gguf = open_gguf(path)
    try:
        ArchConfig.from_gguf(gguf.metadata, set(gguf.tensors))
    except ModelFormatError as exc:
        return exc.message
    return None


def choose_backend(
    path: Path,
    *,
    precision: str = "fast",
    threads: int | None = None,
    available: Sequence[str] | None = None,
    batching: bool = False,
    split: bool = True,
) -> Choice:
    """The backend `--backend auto` runs `path` (a GGUF file) on, on this machine's CPU; an installed backend
    refused here (llama.cpp failing its known-answer check) is no candidate, and the note says so.
    `batching`: several sequences will run at once (`edge serve --parallel N`): auto chooses among the own
    graphs (devices/batch.py), whose slots served 4 clients 1.7x llama-server's on the 0.5b
    (docs/performance.md), unless the file runs only on llama.cpp (whose slots are sequences of one
    context, devices/llamacpp_batch.py); a split by phase batches too (its slots'
    prompts on the prefill half, their decode rows packed on the decode half). `split`: whether a split by
    phase may be chosen where it measured faster (devices/auto_split.py); the caller then opens `Choice.plan`."""
    have, refused = probe_candidates() if available is None else (list(available), {})
    if batching and own_graph_refusal(path) is None and any(b in GRAPH_BACKENDS for b in have):
        have = [b for b in have if b in GRAPH_BACKENDS]
        choice = _choose(path, precision, threads, have, refused, split)
        note = "parallel requests: the own graphs' slots served them fastest (docs/performance.md)"
        return replace(choice, note=f"{choice.note}; {note}" if choice.note else note)
    choice = _choose(path, precision, threads, have, refused, split)
    if not refused or choice.backend in refused:
        return choice
    said = "; ".join(f"{b} is not a candidate: {why}" for b, why in refused.items())
    return replace(choice, note=f"{choice.note}; {said}" if choice.note else said)


def _choose(
    path: Path,
    precision: str,
    threads: int | None,
    have: Sequence[str],
    refused: Mapping[str, str],
    split: bool,
) -> Choice:
    refusal = own_graph_refusal(path)
    if refusal is not None:
        note = f"{refusal}; llama.cpp runs it"
        if precision == "exact":
            raise ModelFormatError(
                f"{refusal}: --precision exact needs edge's own graph, which does not run this file",
                hint="use --precision fast (auto then runs it on llama.cpp)",
            )
        if "llamacpp" in refused:
            from edge.devices.native_check import REFUSED_HINT

            raise BackendUnavailableError(
                f"{refusal}; only llama.cpp runs this file, and {refused['llamacpp']}", hint=REFUSED_HINT
            )
        if "llamacpp" not in have:
            raise BackendUnavailableError(
                f"{refusal}; only llama.cpp runs this file, and llama-cpp-python is not installed",
                hint=INSTALL_LLAMACPP,
            )
        return Choice("llamacpp", "refused", "edge's own graphs do not run this file", note=note)
    # llama.cpp has one precision (int8 activations): it cannot answer an exact request
    candidates = [b for b in have if b in (GRAPH_BACKENDS if precision == "exact" else AUTO_BACKENDS)]
    if not candidates:
        raise BackendUnavailableError(
            "no backend that runs this model imports here (onnxruntime, openvino, llama-cpp-python)",
            hint="pip install edge-llm again; `edge devices` shows why each backend is unavailable",
        )
    if len(candidates) == 1:
        return Choice(candidates[0], "only", "the only backend installed that runs it here")
    # NOTE: hashing a file that is not in the catalog costs ~0.5 s/GB once: only when there are measurements
    sha = model_sha256(path) if _has_runs() else _catalog_sha256(path)
    found = None if sha is None else _measured(sha, machine_key(threads), precision)
    measured = None if found is None else _from_measurement(found, candidates, precision, split)
    if measured is not None:
        return measured
    if precision == "fast":
        choice = _from_prior(path, sha, candidates)
        if choice is not None:
            return choice
    why = (
        f"nothing measured at --precision {precision} on this machine; ONNX Runtime by default "
        "(`edge bench MODEL --backends all` measures)"
    )
    return Choice("ort" if "ort" in candidates else candidates[0], "default", why)


def _from_measurement(run: _Run, candidates: Sequence[str], precision: str, split: bool) -> Choice | None:
    """The fastest single backend the run measured (two or more candidates, else None), or the split by phase
    its halves allow where that measured faster by the margin (devices/auto_split.py)."""
    if sum(b in run.speeds for b in candidates) < 2:
        return None
    best = _fastest(run.speeds, candidates)
    verdict = None
    if split:
        table = phase_table(run.speeds, run.halves)
        halves = [k for k in table if _may_split(k, candidates, precision)]
        verdict = weigh_split(table, halves, best, run.speeds[best].request_s())
    if verdict is not None and verdict.chosen:
        why = f"split by phase, measured fastest on this machine ({run.source})"
        return Choice(verdict.label, "measured", why, run.speeds, split=verdict)
    why = f"fastest measured on this machine ({run.source})"
    return Choice(best, "measured", why, run.speeds, split=verdict)


def _may_split(half: str, candidates: Sequence[str], precision: str) -> bool:
    """Whether a half named `backend[:precision]` may run a split here: an own graph installed here, at the
    run's precision or, at fast, OpenVINO's bf16 (measured on this machine, whose key holds its instruction
    sets: it has a bf16 path)."""
    backend, _, own = half.partition(":")
    if backend not in GRAPH_BACKENDS or backend not in candidates:
        return False
    return not own or (own == BF16 and precision == "fast" and backend == "openvino")


def _from_prior(path: Path, sha: str | None, candidates: Sequence[str]) -> Choice | None:
    prior = _prior()
    models = prior.get("models")
    if not isinstance(models, dict) or not models:
        return None
    entry = models.get(sha) if sha is not None else None
    same = isinstance(entry, dict)
    if (
        not same
    ):  # the recorded model nearest in size (speed ratios follow size: bigger, more bandwidth-bound)
        size = max(path.stat().st_size, 1)
        entry = min(
            (m for m in models.values() if isinstance(m, dict) and m.get("size")),
            key=lambda m: abs(math.log(size / float(m["size"]))),
            default=None,
        )
    if not isinstance(entry, dict):
        return None
    speeds = {b: s for b, s in _parse_speeds(entry.get("backends")).items() if b in candidates}
    if len(speeds) < 2:
        return None
    m = prior.get("machine") or {}
    # NOTE: the prior's `source` is a file of the repository, which an installed edge does not have
    where = f"{m.get('cpu', '?')}, {m.get('threads', '?')} threads"
    what = "this file" if same else f"the recorded model nearest in size, {entry.get('name')}"
    why = (
        f"not measured on this machine: the speeds edge ships, recorded for {what} on {where}; "
        "`edge bench MODEL --backends all` measures it here"
    )
    return Choice(_fastest(speeds, list(speeds)), "prior", why, speeds)
