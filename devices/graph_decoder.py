"""`GraphDecoder`: edge's own ONNX decoder graph on ONNX Runtime or OpenVINO, with the ring-buffer KV cache.

The graph is built from the GGUF once and cached on disk (keyed by the file and the build options); the
backends cache their compiled form beside it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from edge.devices.base import Capabilities, Decoder
from edge.devices.batch import batched
from edge.devices.invariance import rows_invariant
from edge.devices.kquant import kquant_library
from edge.devices.mapped import drop_mapped_pages, mapped_sources, release_heap
from edge.devices.memory import check_slots_fit
from edge.devices.precision import BF16, check_precision, graph_precision
from edge.devices.ring_decoder import SLOT_GRAIN, RingDecoder
from edge.devices.runners import Runner, RunnerOptions, graph_runner
from edge.errors import DeviceError, ModelFormatError
from edge.kvcache import StepView
from edge.kvcache.staging import WINDOW, staged_feeds
from edge.models.arch import ArchConfig, check_tensor_shapes
from edge.models.build_progress import BuildTask, cached_note, opening
from edge.models.gguf_file import GGUFFile
from edge.models.onnx_safety import check_onnx_file
from edge.models.store import cache_dir, file_identity
from edge.models.transformer import BuildOptions, Embedder, build_decoder, build_steps

GRAPH_FORMAT = 17  # bump when the graph a builder emits changes, to invalidate cached graphs


@dataclass(frozen=True)
class GraphOptions:
    backend: str = "ort"  # ort | openvino
    device: str = "cpu"
    capacity: int = 4096  # KV slots of global layers (sliding-window layers hold their window)
    sink: int = 4  # attention-sink tokens kept when the ring wraps
    policy: str = "ring"  # ring | error | truncate (see kvcache)
    prefill_chunk: int = 256
    max_rollback: int = 16
    threads: int | None = None
    # exact: fp32 math on the file's own blocks; fast: int8 activations where the runtime has an int8 path
    # (ORT MatMulNBits accuracy level 4, OpenVINO's dynamic quantization), the weights imported the same way;
    # bf16 (openvino:cpu, a phase split's half): the exact graph with OpenVINO's bf16 hint (devices/precision.py)
    precision: str = "exact"
    lowering: str = "nbits_split"
    accuracy_level: int | None = None  # MatMulNBits level; None: from precision (exact 0, fast 4)
    head_accuracy_level: int | None = None  # the lm_head's; None: accuracy_level
    static_shapes: bool = False  # bind every KV slot each step (what static-shape devices need)
    fuse: bool = (
        True  # graph_opt's fusion passes for the backend (graph_opt/pipeline.py), weights as imported
    )
    spin: bool = True  # the runtime's threads spin between runs (devices.registry.DecoderOptions.spin)
    # staged attention (kvcache/staging.py; dynamic shapes only); None: on ORT at precision fast, where it makes
    # a forward's rows batch-invariant (tests/devices/test_batch_invariance.py). Elsewhere it would not: ORT's
    # exact fp32 MatMulNBits and OpenVINO's int8 kernels take another path for one row.
    staged: bool | None = None
    # attention per slot (models/transformer.BuildOptions.slot_axis): what `slots` packs then attends over each
    # slot's own past only; the load sets it where the model will be split into slots (--parallel)
    slot_axis: bool = False
    # the ring's element type, which the graph's K/V inputs take (models/transformer.BuildOptions.kv_dtype)
    kv_dtype: str = "f32"
    # K-quant linears on edge's kernels (models/transformer.BuildOptions.kquant, devices/kquant): None = where
    # they run (ORT on the CPU at precision fast, a file with K-quant linears, the kernels built here);
    # True requires them, False keeps MatMulNBits
    kquant: bool | None = None


def _graph_dir(gguf: GGUFFile, build: BuildOptions, target: str | None, fuse: bool, precision: str) -> Path:
    st = gguf.path.stat()
    fields = asdict(build)
    for name in ("slot_axis", "kv_dtype", "kquant"):  # the graphs cached before these options keep their keys
        if fields[name] == getattr(BuildOptions, name):
            del fields[name]
    key = json.dumps(
        [str(gguf.path.resolve()), st.st_size, st.st_mtime_ns, GRAPH_FORMAT, fields]
        + ([f"target:{target}", f"fuse:{fuse}", f"precision:{precision}"] if target else []),
        sort_keys=True,
    )
    return cache_dir() / "graphs" / hashlib.sha256(key.encode()).hexdigest()[:20]


def _files_record(folder: Path) -> dict[str, int]:
    return {
        f: (folder / f).stat().st_size for f in ("model.onnx", "model.onnx.data") if (folder / f).exists()
    }


def _entry_is_whole(folder: Path) -> bool:
    """A cache entry is used only when its DONE marker lists the sizes its files still have, and the graph
    parses with every external tensor in range: a cut-short or tampered entry is rebuilt, not loaded."""
    try:
        done = json.loads((folder / "DONE").read_text())
        if not isinstance(done, dict) or done.get("files") != _files_record(folder):
            return False
        check_onnx_file(folder / "model.onnx")
    except (OSError, ValueError, ModelFormatError):
        return False
    return True


def ensure_graph(
    gguf: GGUFFile,
    cfg: ArchConfig,
    build: BuildOptions,
    target: str | None = None,
    *,
    fuse: bool = True,
    precision: str = "exact",
) -> Path:
    """Path of the cached ONNX graph for (file, options); built and written atomically when missing or
    damaged (the build goes to a temporary folder renamed into place, so a killed build leaves no entry).
    With a target: graph_opt's fusions for it (fuse) and its weight lowerings (always, see LOWERINGS)."""
    final = _graph_dir(gguf, build, target, fuse, precision)
    model_path = final / "model.onnx"
    if _entry_is_whole(final):
        return model_path
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".", dir=final.parent))
    what = f"the {_BACKEND_NAMES.get(target or '', 'ONNX')} graph for {gguf.path.name}"
    try:
        # announced before the imports a build needs (graph_opt's passes: ~2 s on 2 cores); the passes'
        # steps are counted once they are known
        with BuildTask(what, cached_note(final.parent), build_steps(cfg, build) + 1) as task:  # + writing it
            task.add(len(_passes(target, fuse, precision)))
            # the GGUF's and the scratch files' pages a step read are read once: out of the RSS after it
            mapped = mapped_sources(files=[gguf.path], folders=[tmp])

            def step() -> None:
                drop_mapped_pages(mapped)
                task.step()

            _build_into(tmp, gguf, cfg, build, target, fuse, precision, step)
        done = {
            "source": gguf.path.name,
            "files": _files_record(tmp),
            # what `edge models`, `edge rm` and `edge cache --prune` read (devices/cache.py)
            "format": GRAPH_FORMAT,
            "model": file_identity(gguf.path),
            "target": target,
            "precision": precision,
        }
        (tmp / "DONE").write_text(json.dumps(done))
        if final.exists():  # an interrupted or stale build: replace it whole
            shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return model_path


_BACKEND_NAMES = {"ort": "ORT", "openvino": "OpenVINO", "coreml": "Core ML"}
_SAVE_IN_FLIGHT = 64 << 20  # bytes onnx_ir may hold while it writes the external data (its default: 1 GiB)


def _passes(target: str | None, fuse: bool, precision: str) -> list[str]:
    if target is None:
        return []
    from edge.graph_opt import target_passes

    return target_passes(target, fuse=fuse, precision=precision)


def _build_into(
    folder: Path,
    gguf: GGUFFile,
    cfg: ArchConfig,
    build: BuildOptions,
    target: str | None,
    fuse: bool,
    precision: str,
    step: Callable[[], None],
) -> None:
    """model.onnx and model.onnx.data in `folder`, streamed: the builder writes each layer's weights to a
    scratch file as it goes, the passes read them from there mapped (and hold only the weights they rewrite),
    and the save writes tensor by tensor. Measured on qwen2.5-coder-1.5b (1.1 GB): peak RSS 5.3 GB when the
    whole model was a proto, copied into onnx_ir and back, then saved (benchmarks/results/build-memory-*)."""
    import onnx  # only a build needs them (~1.3 s of imports on 2 cores: after the build's first line)
    import onnx_ir as ir

    from edge.graph_opt import target_model
    from edge.graph_opt.spill import WeightSpill

    scratch = folder / "build.onnx"
    proto = build_decoder(gguf, cfg, build, external=folder / "build.onnx.data", on_step=step)
    onnx.save_model(proto, scratch)
    del proto
    model = ir.load(scratch)  # initializers: external tensors, read when a pass or the save touches them
    if target is not None:
        with WeightSpill(folder / "passes.data") as spill:
            target_model(model, target, fuse=fuse, precision=precision, on_pass=step, spill=spill)
    ir.save(
        model,
        folder / "model.onnx",
        external_data="model.onnx.data",
        size_threshold_bytes=1024,
        max_in_flight_bytes=_SAVE_IN_FLIGHT,
        alignment=64,
        align_threshold=1024,
    )
    del model
    # the passes leave reference cycles (onnx_ir graphs) and a fragmented heap; an ORT decoder opened on the
    # graph next should not sit on top of them
    release_heap()
    for name in ("build.onnx", "build.onnx.data", "passes.data"):
        (folder / name).unlink(missing_ok=True)
    step()


def graph_weight_bytes(model_path: Path) -> int:
    """Bytes of weights a one-token forward of the graph reads: its external data (every linear, norm and
    bias; the embedding table is not in the graph, its rows are gathered from the file)."""
    data = model_path.with_name(model_path.name + ".data")
    return data.stat().st_size if data.exists() else model_path.stat().st_size


def build_options(cfg: ArchConfig, opts: GraphOptions, kquant: bool = False) -> BuildOptions:
    """The builder's options for a GraphDecoder's graph (what `ensure_graph` is called with); `kquant` as
    `devices.kquant.kquant_library` decided it."""
    level = opts.accuracy_level
    if level is None:
        level = 0 if graph_precision(opts.precision) == "exact" else 4
    return BuildOptions(
        lowering=opts.lowering,
        accuracy_level=level,
        head_accuracy_level=opts.head_accuracy_level,
        long_rope=cfg.long_rope(opts.capacity),
        staged=GraphDecoder._staged(opts),
        slot_axis=opts.slot_axis and not opts.static_shapes,
        kv_dtype=opts.kv_dtype,
        kquant=kquant,
    )


class GraphDecoder(RingDecoder):
    """`Decoder` over edge's own whole-model graph on one backend and device (the ring, the chunked forward
    and rollback are RingDecoder's)."""

    def __init__(self, gguf: GGUFFile, options: GraphOptions | None = None) -> None:
        opts = options or GraphOptions()
        make_runner = graph_runner(opts.backend)  # an unknown backend fails before the graph is built
        self.options = opts
        self._batched = False  # split into slots (`slots`): the batch engine runs the graph from then on
        cfg = ArchConfig.from_gguf(gguf.metadata, set(gguf.tensors))
        check_tensor_shapes(cfg, {name: t.shape for name, t in gguf.tensors.items()})
        self.backend, self.device = opts.backend, opts.device
        self._init_ring_of(cfg, opts)
        check_precision(opts.precision, half=True)
        if opts.precision == BF16 and (opts.backend, opts.device) != ("openvino", "cpu"):
            raise ValueError(f"precision bf16 runs on openvino:cpu only, not {opts.backend}:{opts.device}")
        built = graph_precision(opts.precision)  # bf16: the exact graph, rounded by the runtime
        kernels = kquant_library(gguf, opts)
        build = build_options(cfg, opts, kquant=kernels is not None)
        self.kquant = kernels is not None  # K-quant linears run on edge's kernels
        self.staged, self.slot_axis = build.staged, build.slot_axis
        model_path = ensure_graph(gguf, cfg, build, opts.backend, fuse=opts.fuse, precision=built)
        self.graph_path = model_path  # the cached ONNX graph the runner compiled
        runner_opts = RunnerOptions(
            opts.device,
            opts.threads,
            opts.precision,
            model_path.parent,
            opts.spin,
            custom_ops=() if kernels is None else (kernels,),
        )
        where = f"{_BACKEND_NAMES.get(opts.backend, opts.backend)} on {opts.device}"
        with opening(f"the graph for {gguf.path.name} with {where}"):
            self.runner: Runner = make_runner(model_path, runner_opts)
        self.first_run_costs = self.runner.prepares_on_first_run
        self.weights_read = graph_weight_bytes(model_path)
        self.embed = Embedder(gguf, cfg)
        self._outputs = ["logits"] + [f"new_{n}_{i}" for i in range(cfg.n_layer) for n in ("key", "value")]
        # the claim's static conditions, then a run of this graph on this machine (devices/invariance.py)
        self._invariant = self._claimable(opts) and rows_invariant(self, model_path, opts.backend)

    @staticmethod
    def _staged(opts: GraphOptions) -> bool:
        invariant = opts.backend == "ort" and opts.precision == "fast"
        staged = (invariant and not opts.static_shapes) if opts.staged is None else opts.staged
        if staged and opts.static_shapes:
            raise ValueError("staged attention needs dynamic shapes; static_shapes graphs are unstaged")
        return staged

    @staticmethod
    def _int8_rows(opts: GraphOptions) -> bool:
        """Whether every MatMulNBits rounds a row alike at any row count: the int8 level (4) for body and head,
        and not ORT's float-zero-point path. Measured (test_batch_invariance.py): level 0 and nbits_fzp on Q4_1
        take another kernel for one row."""
        level = 4 if opts.accuracy_level is None else opts.accuracy_level
        head = level if opts.head_accuracy_level is None else opts.head_accuracy_level
        return level == head == 4 and opts.lowering != "nbits_fzp"

    def _claimable(self, opts: GraphOptions) -> bool:
        # NOTE: only windowed forwards (<= WINDOW tokens) are invariant, and a verify carries up to max_rollback
        # + 1 tokens (speculation drafts at most what it can roll back): a larger undo log voids the claim
        return (
            self.staged
            and self.backend == "ort"
            and opts.precision == "fast"
            and self.max_rollback < WINDOW
            and self._int8_rows(opts)
        )

    def capabilities(self) -> Capabilities:
        batching = None if self.options.static_shapes else self  # packed steps take dynamic shapes
        return replace(super().capabilities(), batch_invariant=self._invariant, batching=batching)

    def _step(
        self, ids: Sequence[int], last_only: bool, *, window: bool = False, score: bool = True
    ) -> np.ndarray:
        if self._batched:  # its graph is the batch engine's now: two threads on one runner would race
            raise DeviceError("this decoder was split into slots; use the slots", hint="see Model.slots")
        view = self.cache.begin(len(ids))
        if view.dropped:
            raise self._overflowed()
        feeds = self.step_feeds(self, view, ids, last_only, window=window, score=score)
        out = self.run(feeds)
        self.cache.commit(out[1::2], out[2::2])
        return out[0][0]  # [r, vocab]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """One run of the graph: logits, then new_key_i, new_value_i per layer."""
        return self._run(self.runner, feeds, self._outputs)

    def slots(self, n: int) -> list[Decoder]:
        """`Batching`: n decoders, each its own KV, sharing this graph (devices/batch.py). Once: this decoder
        no longer steps on its own (the engine's thread runs its graph), and its own KV is freed."""
        if self._batched:
            raise DeviceError("this decoder was split into slots already", hint="load the model again")
        check_slots_fit(n, self.cache.nbytes)
        slots = batched(self, n)
        self._batched = True
        self.cache = self._new_cache(self.cache.sink)  # NOTE: a fresh ring's buffers are untouched zero pages
        return slots

    def step_feeds(
        self,
        ring: RingDecoder,
        view: StepView,
        ids: Sequence[int],
        last_only: bool,
        *,
        window: bool,
        score: bool,
    ) -> dict[str, np.ndarray]:
        """This graph's inputs for the step `view` began on `ring`'s cache (this decoder's own, or a batch
        slot's of the same geometry: devices/batch.py)."""
        cache = ring.cache
        # no rows: the head is skipped (a 512-token prompt in 256-token chunks: gemma3-270m's 262k-row head
        # is ~1% of the prefill per chunk)
        picked = range(len(ids)) if not last_only else [len(ids) - 1] if score else []
        rows = np.array(picked, dtype=np.int64)
        feeds: dict[str, np.ndarray] = {
            "hidden": self.embed(ids),
            "positions": view.positions,
            "logit_rows": rows,
        }
        layers = range(self.cfg.n_layer)
        if self.staged:
            st = staged_feeds(cache, view, ring._mask_layer, SLOT_GRAIN, window=window)
            feeds.update(st.masks, **ring._past_feeds(layers, st.past), stage_index=st.index)
            for i in layers:
                feeds[f"stage_key_{i}"], feeds[f"stage_value_{i}"] = st.stage_keys[i], st.stage_values[i]
        else:
            masks, bound = ring._bindings(view)
            feeds.update(masks, **ring._past_feeds(layers, bound))
        if self.slot_axis:  # one slot: its rows in order (staged: the padding row repeats the last)
            q = len(ids)
            rows_of = np.arange(q + self.staged, dtype=np.int64)
            rows_of[q:] = q - 1
            feeds["slot_rows"], feeds["row_back"] = rows_of[None], np.arange(q, dtype=np.int64)[None]
            if self.staged:
                feeds["stage_index"] = feeds["stage_index"][:, rows_of]
        return feeds

    def close(self) -> None:
        runner, self.runner = self.runner, None  # type: ignore[assignment]
        if runner is not None:
            runner.close()
