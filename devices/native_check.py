"""Whether llama.cpp computes right on this machine, found out before a user's process depends on it.

llama.cpp picks its kernels for the CPU it runs on, and a kernel can crash or miscompute where it was never
tried: on a Xeon with AMX, llama-cpp-python 0.3.36's AMX path (weights repacked into its "extra" buffer types)
segfaults on 512-token prompts and answers garbage on others, while the same build with `use_extra_bufts =
False` answers right (issue #29). So each configuration is checked in a child process (a SIGSEGV kills only
the child) on the check's own tiny files (devices/native_files.py: the catalog's widths and weight types): a
512-token prompt in one batch (the many-row kernels, where the AMX crash shows) and four one-token steps (the
one-row kernels), every row's logits compared with edge's exact graph (ONNX Runtime, fp32 on the file's
blocks). The first configuration that passes is the one edge runs; none passing refuses the backend.

The verdict is cached (native-check/llamacpp.json in edge's cache) per (llama-cpp-python version, its shared
libraries' paths, sizes and mtimes, the CPU, the configuration), so a machine pays the check once per build:
the child ~2-5 s and the parent's reference ~2-3 s on 2 busy cores (most of it llama.cpp's 512-token prompts
and the exact graphs' build).

Tolerance: llama.cpp quantizes activations to 8 bits, so its logits are near the exact graph's, not equal. The
measure is each row's relative error, |x - r| / |r| on logits centred per row (softmax ignores a shift).
Measured on a Zen 4 (AVX-512; the CPU repack buffer takes the Q4_0 / Q4_K weights, 2026-12-03), worst row
per file over five prompts, 1 and 2 threads, extra buffer types on and off: 0.009 (Q4_1), 0.013 (Q5_0 / Q8_0 /
Q6_K), 0.076 (Q4_K / Q6_K / Q4_0; its median row 0.019); the check's own prompt gives 0.048. Unrelated logits
are ~1.2-1.4 (the miscompute fault: 1.19), zero logits 1.0. TOLERANCE (0.25) is 3x the worst measured row.

Test seam: EDGE_NATIVE_CHECK_FAULT (e.g. `default=sigsegv,no-extra-bufts=miscompute`) injects a fault into
the named configurations: the child then dies by a real SIGSEGV after loading llama.cpp (sigsegv), runs
llama.cpp on a copy of each file whose embedding rows are rotated so its logits really differ (miscompute), or
sleeps past the timeout (hang). A faulted configuration is its own cache entry, so a test never poisons the
verdict of the healthy one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata, util
from pathlib import Path
from typing import Any

import numpy as np

from edge.errors import BackendUnavailableError
from edge.models.jsonstore import read_json, write_json

__all__ = [
    "CONFIGS",
    "FAULTS",
    "FAULT_ENV",
    "REFUSED_HINT",
    "TOLERANCE",
    "NativeConfig",
    "Outcome",
    "Verdict",
    "configurations",
    "llamacpp_config",
    "llamacpp_verdict",
    "relative_error",
]

CHECK_FORMAT = 1  # bump when the files, the prompt or the tolerance change: earlier verdicts no longer hold
TOLERANCE = 0.25  # a row's relative error from the exact graph (module docstring: measured 0.076 at worst)
PROMPT, STEPS = 512, 4  # one 512-token batch (many-row kernels), then one-token steps (one-row kernels)
N_CTX = 1024
TIMEOUT_S = 120.0  # the child takes ~2-5 s on 2 busy cores; a configuration that hangs fails
FAULT_ENV = "EDGE_NATIVE_CHECK_FAULT"
FAULTS = ("sigsegv", "miscompute", "hang")
REFUSED_HINT = (
    "use --backend ort or openvino; `edge devices --json` shows what failed (a llama-cpp-python built for "
    "this CPU, or another version, may pass)"
)


@dataclass(frozen=True)
class NativeConfig:
    """One way to load llama.cpp: its model parameters, as LlamaCppOptions takes them."""

    name: str
    extra_bufts: bool  # llama.cpp's use_extra_bufts: weights repacked for its kernels (AMX, CPU repack)
    label: str
    fault: str | None = None  # tests only (module docstring): sigsegv | miscompute | hang, in the child


# In order: llama.cpp as built, then its weights kept as in the file (issue #29: what answers right on AMX)
CONFIGS = (
    NativeConfig("default", True, "default, extra buffer types on"),
    NativeConfig("no-extra-bufts", False, "extra buffer types off"),
)


def configurations() -> tuple[NativeConfig, ...]:
    """CONFIGS, with the faults EDGE_NATIVE_CHECK_FAULT injects (`name=fault,...`; a test seam)."""
    spec = os.environ.get(FAULT_ENV, "").strip()
    faults: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, fault = item.partition("=")
        if name not in {c.name for c in CONFIGS} or fault not in FAULTS:
            names = ", ".join(c.name for c in CONFIGS)
            raise BackendUnavailableError(
                f"{FAULT_ENV}: {item!r} is not CONFIG=FAULT (configs {names}; faults {FAULTS})",
                hint=f"unset {FAULT_ENV}: it is a test seam",
            )
        faults[name] = fault
    return tuple(replace(c, fault=faults.get(c.name)) for c in CONFIGS)


@dataclass(frozen=True)
class Outcome:
    """One configuration's check: passed, or what failed (a signal, an exit, a timeout, logits off)."""

    config: str
    passed: bool
    failure: str = ""
    worst: float | None = None  # the worst row's relative error from the exact graph, when logits came back
    seconds: float = 0.0  # the child's wall time


@dataclass(frozen=True)
class Verdict:
    """The configuration edge runs (the first that passed; None: every one failed) and each one's outcome."""

    config: NativeConfig | None
    outcomes: tuple[Outcome, ...]
    ran: bool = False  # a child ran in this call (False: every outcome came from the cache)
    configs: tuple[NativeConfig, ...] = field(default=CONFIGS, repr=False)

    def failures(self) -> str:
        """What failed: `SIGSEGV` for one configuration, `default: SIGSEGV; other: ...` for several."""
        failed = [o for o in self.outcomes if not o.passed]
        if len(failed) == 1:
            return failed[0].failure
        return "; ".join(f"{o.config}: {o.failure}" for o in failed)

    def note(self) -> str:
        """How llama.cpp runs here when not as built ("" when its default passed)."""
        if self.config is None:
            return f"failed its known-answer check in every configuration ({self.failures()})"
        if self.config.name == self.configs[0].name:
            return ""
        failed = ", ".join(o.config for o in self.outcomes if not o.passed)
        what = "the default" if failed == self.configs[0].name else f"the configurations {failed}"
        return f"{self.config.label}: {what} failed its known-answer check: {self.failures()}"

    def describe(self) -> str:
        """Which configuration runs and why, always (the note, or the default passing)."""
        if self.config is not None and not self.note():
            return f"{self.config.label}: passed its known-answer check"
        return self.note()

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": None if self.config is None else self.config.name,
            "label": None if self.config is None else self.config.label,
            "note": self.note() or None,
            "tolerance": TOLERANCE,
            "outcomes": [asdict(o) for o in self.outcomes],
        }


# -- the cache ---------------------------------------------------------------------------------------------
def _cache_file() -> Path:
    from edge.models.store import cache_dir

    # its own folder: tests share it across their private caches (tests/shared_cache.py), as they share models
    return cache_dir() / "native-check" / "llamacpp.json"


def _library() -> dict[str, Any]:
    """llama-cpp-python's version and its shared libraries (name, size, mtime): a rebuild is a new build."""
    try:
        spec = util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        spec = None
    pkg = Path(next(iter(spec.submodule_search_locations or ()))) if spec else None
    override = os.environ.get("LLAMA_CPP_LIB_PATH")  # where llama-cpp-python itself looks first
    lib = Path(override) if override else (pkg / "lib" if pkg else None)
    files = []
    if lib is not None and lib.is_dir():
        for p in sorted(lib.iterdir()):
            if p.is_file() and not p.is_symlink() and any(s in p.name for s in (".so", ".dylib", ".dll")):
                st = p.stat()
                files.append([str(p.resolve()), st.st_size, st.st_mtime_ns])
    try:
        version = metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        version = None
    return {"version": version, "libraries": files}


def _key(config: NativeConfig, library: dict[str, Any]) -> str:
    from edge.devices.cpu import probe_cpu

    cpu = probe_cpu()
    loaded = [config.name, config.extra_bufts, config.fault]  # what the child runs (the label is words)
    what = [CHECK_FORMAT, library, cpu.model, cpu.arch, sorted(cpu.isa.items()), loaded]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:24]


def _recall(key: str) -> Outcome | None:
    raw = read_json(_cache_file()).get(key)
    try:
        return Outcome(**raw) if isinstance(raw, dict) else None
    except TypeError:  # an older or damaged record: checked again
        return None


def _remember(key: str, outcome: Outcome) -> None:
    with contextlib.suppress(OSError):  # a read-only cache only costs a check next time
        write_json(_cache_file(), {**read_json(_cache_file()), key: asdict(outcome)})


# -- the check ---------------------------------------------------------------------------------------------
def _ids() -> list[int]:
    from edge.devices.native_files import N_VOCAB

    return [int(t) for t in np.random.default_rng(29).integers(3, N_VOCAB, PROMPT + STEPS)]


def relative_error(logits: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Each row's |x - r| / |r|, both centred per row: [rows]."""
    x = logits - logits.mean(axis=-1, keepdims=True)
    r = ref - ref.mean(axis=-1, keepdims=True)
    return np.linalg.norm(x - r, axis=-1) / np.maximum(np.linalg.norm(r, axis=-1), 1e-30)


def _reference(path: Path, ids: list[int]) -> np.ndarray:
    """edge's exact graph on `path` (ONNX Runtime, fp32 on the blocks): the prompt's rows, then each step's."""
    import shutil

    from edge.devices.graph_decoder import GraphDecoder, GraphOptions
    from edge.models.build_progress import reporting
    from edge.models.gguf_file import open_gguf

    with reporting(lambda *_: None):  # the check's own tiny graphs: not the user's model, and ~1 s
        dec = GraphDecoder(open_gguf(path), GraphOptions(backend="ort", precision="exact", capacity=N_CTX))
    try:
        rows = [dec.forward(ids[:PROMPT])] + [dec.forward([t]) for t in ids[PROMPT:]]
    finally:
        dec.close()
        shutil.rmtree(dec.graph_path.parent, ignore_errors=True)  # a graph of a temporary file: not kept
    return np.concatenate(rows)


class _Work:
    """The check's files and their exact logits, made once per check and only when a child runs."""

    def __init__(self, folder: Path) -> None:
        from edge.devices.native_files import CHECK_MODELS, write_check_model

        self.folder = folder
        self.ids = _ids()
        self.files = [write_check_model(folder / f"{m.name}.gguf", m) for m in CHECK_MODELS]
        self._refs: dict[str, np.ndarray] = {}

    def reference(self, path: Path) -> np.ndarray:
        if path.name not in self._refs:
            self._refs[path.name] = _reference(path, self.ids)
        return self._refs[path.name]


def _failure(proc: subprocess.CompletedProcess[str]) -> str:
    if proc.returncode < 0:
        try:
            return signal.Signals(-proc.returncode).name
        except ValueError:
            return f"signal {-proc.returncode}"
    last = next((ln for ln in reversed(proc.stderr.splitlines()) if ln.strip()), "")
    return f"exit {proc.returncode}" + (f": {last.strip()[:200]}" if last else "")


def _run_one(config: NativeConfig, work: _Work, timeout: float) -> Outcome:
    out = work.folder / f"out-{config.name}"
    out.mkdir(exist_ok=True)
    job = {"config": asdict(config), "files": [str(p) for p in work.files], "ids": work.ids, "out": str(out)}
    cmd = [sys.executable, "-c", _CHILD, json.dumps(sys.path), json.dumps(job)]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:  # subprocess.run has killed it
        return Outcome(config.name, False, f"timeout after {timeout:.0f} s", None, round(timeout, 2))
    seconds = round(time.perf_counter() - start, 2)
    if proc.returncode != 0:
        return Outcome(config.name, False, _failure(proc), None, seconds)
    worst = 0.0
    for path in work.files:
        try:
            logits = np.load(out / f"{path.stem}.npy")
        except (OSError, ValueError) as exc:
            return Outcome(config.name, False, f"no logits for {path.stem}: {exc}", None, seconds)
        ref = work.reference(path)
        if logits.shape != ref.shape or not np.isfinite(logits).all():
            why = f"logits off on {path.stem}: shape {logits.shape} or non-finite values"
            return Outcome(config.name, False, why, None, seconds)
        err = float(relative_error(logits, ref).max())
        worst = max(worst, err)
        if err > TOLERANCE:
            why = f"logits off on {path.stem}: worst row {err:.3g} from the exact graph (bound {TOLERANCE})"
            return Outcome(config.name, False, why, round(err, 5), seconds)
    return Outcome(config.name, True, "", round(worst, 5), seconds)


# what a build does again on this CPU: a crash by one of these signals, or logits off. A timeout, a kill
# (the OOM killer's SIGKILL) or an exit status (an import failing) may be the moment's, so it is checked again
LASTING_SIGNALS = ("SIGSEGV", "SIGBUS", "SIGILL", "SIGABRT", "SIGFPE")


def _lasting(outcome: Outcome) -> bool:
    return outcome.passed or outcome.failure in LASTING_SIGNALS or outcome.failure.startswith("logits off")


_LOCK = threading.Lock()  # one check at a time in a process (the server opens models from threads)
CHECKING = "edge: checking llama.cpp on this CPU (once per machine, ~5 s)..."


def _announce() -> None:
    """One line on a terminal's stderr when a check starts: the first `edge devices` or load on a machine
    otherwise sits silent for seconds. Not on a pipe or a file (logs, --json consumers read stdout anyway)."""
    if sys.stderr is not None and sys.stderr.isatty():
        print(CHECKING, file=sys.stderr, flush=True)


def llamacpp_verdict(configs: Sequence[NativeConfig] | None = None, *, timeout: float = TIMEOUT_S) -> Verdict:
    """Check (or recall) each configuration in order until one passes. `configs`: CONFIGS with the faults
    EDGE_NATIVE_CHECK_FAULT names, by default (tests pass their own table)."""
    table = tuple(configurations() if configs is None else configs)
    with _LOCK:
        library = _library()
        outcomes: list[Outcome] = []
        ran = False
        with contextlib.ExitStack() as stack:
            work: _Work | None = None
            for config in table:
                key = _key(config, library)
                outcome = _recall(key)
                if outcome is None:
                    if work is None:
                        _announce()
                        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="edge-native-"))
                        work = _Work(Path(folder))
                    outcome, ran = _run_one(config, work, timeout), True
                    if _lasting(outcome):
                        _remember(key, outcome)
                outcomes.append(outcome)
                if outcome.passed:
                    return Verdict(config, tuple(outcomes), ran, table)
        return Verdict(None, tuple(outcomes), ran, table)


def llamacpp_config() -> NativeConfig:
    """The configuration llama.cpp loads with here; BackendUnavailableError when every one failed."""
    from edge.devices.llamacpp import import_llama_cpp

    import_llama_cpp()  # not installed: the usual error, before any check
    verdict = llamacpp_verdict()
    if verdict.config is None:
        raise BackendUnavailableError(
            f"llama.cpp is refused on this machine: it {verdict.note()}", hint=REFUSED_HINT
        )
    return verdict.config


# -- the child ---------------------------------------------------------------------------------------------
def _rotated(src: Path, folder: Path) -> Path:
    """A copy of `src` whose token embedding rows are rotated by one: llama.cpp computes other logits."""
    import gguf

    t = next(t for t in gguf.GGUFReader(src).tensors if t.name == "token_embd.weight")
    data = bytearray(src.read_bytes())
    start, n = int(t.data_offset), int(t.n_bytes)
    rows = np.frombuffer(bytes(data[start : start + n]), np.uint8).reshape(int(t.shape[1]), -1)
    data[start : start + n] = np.roll(rows, 1, axis=0).tobytes()
    dst = folder / f"rotated-{src.name}"
    dst.write_bytes(bytes(data))
    return dst


def _child(job: dict[str, Any]) -> None:
    """Run llama.cpp in `job`'s configuration on each file; its logits go to `out`/<file>.npy."""
    import faulthandler

    from edge.devices.llamacpp import LlamaCppDecoder, LlamaCppOptions

    with contextlib.suppress(ImportError, ValueError, OSError):  # POSIX only
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash here is a verdict, not a core file
    faulthandler.enable()  # a crash's native frames on stderr, which the parent keeps
    config = NativeConfig(**job["config"])
    out, ids = Path(job["out"]), [int(t) for t in job["ids"]]
    opts = LlamaCppOptions(n_ctx=N_CTX, n_batch=PROMPT, extra_bufts=config.extra_bufts)
    for name in job["files"]:
        path = Path(name)
        src = _rotated(path, out) if config.fault == "miscompute" else path
        with LlamaCppDecoder(src, opts) as dec:
            if config.fault == "sigsegv":
                faulthandler._sigsegv()  # a real segmentation fault, as the AMX kernels die
            if config.fault == "hang":
                time.sleep(10 * TIMEOUT_S)
            rows = [dec.forward(ids[:PROMPT])] + [dec.forward([t]) for t in ids[PROMPT:]]
        np.save(out / f"{path.stem}.npy", np.concatenate(rows))


# the child imports edge from where the parent did (its sys.path), whatever put it there
_CHILD = """
import json, sys
sys.path[:] = json.loads(sys.argv[1])
from edge.devices.native_check import _child
_child(json.loads(sys.argv[2]))
"""
