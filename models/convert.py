"""`edge convert`: a GGUF -> an artifact directory of optimized ONNX partitions for one target.

    build (models/transformer.py, per partition: layer range, head) -> graph_opt pipeline for the target
    (fold, fusions, quantize by policy, lower, specialize) -> write partitions, embeddings, metadata, manifest

The quantization plan is decided once on the whole model (sensitivity measured on calibration text) and then
applied to every partition, so a partitioned artifact holds exactly the weights of an unpartitioned one.
Everything written is a function of (source bytes, options): converting twice gives byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from gguf.constants import GGMLQuantizationType

from edge import graph_opt
from edge.errors import EdgeError
from edge.graph_opt import LayerRange, PassRecord, QuantReport, QuantSpec
from edge.kvcache import LayerSpec, RingKVCache
from edge.models.arch import ArchConfig
from edge.models.artifact import FORMAT, MANIFEST, embed_scale, file_sha256, is_artifact
from edge.models.build_progress import BuildTask
from edge.models.calibration import CALIBRATION_TEXT
from edge.models.checked import CheckedModel, as_checked
from edge.models.gguf_file import GGUFFile
from edge.models.transformer import BuildOptions, Embedder, build_decoder, build_steps, layer_kinds

__all__ = ["ConvertOptions", "ConvertResult", "calibration_feeds", "convert", "static_dims"]

_EXTERNAL_MIN = 1024  # initializers at least this many bytes go to the weights file


@dataclass(frozen=True)
class ConvertOptions:
    target: str = "ort"
    quant: QuantSpec = field(default_factory=QuantSpec)
    partitions: int = 1
    ranges: str | None = None  # explicit layer ranges, e.g. "0-14,15-29" (overrides partitions)
    fuse: bool = True
    static: bool = False  # fixed shapes for NPUs: a prefill graph of prefill_chunk tokens and a decode graph
    prefill_chunk: int = 64
    capacity: int = 1024
    # fast: weight forms for the runtimes' int8 paths and int8 activations (MatMulNBits accuracy level 4);
    # exact: fp32 activations (level 0; ORT's 8-bit weights as two exact 4-bit halves)
    precision: str = "fast"
    # MatMulNBits accuracy level (0: fp32-exact activations, 4: int8 activations, as llama.cpp computes).
    # None: from precision (fast 4, exact 0).
    accuracy_level: int | None = None
    head_accuracy_level: int | None = None  # the lm_head's, when it should differ
    # 8-bit weights' level, when it should differ from the target's default (ORT's 8-bit kernels are fast
    # only with int8 activations; partitions a plan may put on ORT want 4 whatever the graph target)
    int8_accuracy_level: int | None = None
    calibration_steps: int = (
        5  # prefills of calibration text: the first ranks sensitivity, the rest feed GPTQ
    )
    calibration_tokens: int = 128

    def __post_init__(self) -> None:
        if self.target not in graph_opt.TARGETS:
            raise ValueError(f"--target must be one of {', '.join(graph_opt.TARGETS)}, not {self.target!r}")
        if self.precision not in ("fast", "exact"):
            raise ValueError(f"--precision must be fast or exact, not {self.precision!r}")
        if self.static and (self.prefill_chunk < 1 or self.capacity <= self.prefill_chunk):
            raise ValueError("static shapes need 1 <= prefill chunk < capacity")

    def levels(self) -> dict[str, int | None]:
        """Accuracy levels for the lower pass: body, 8-bit linears, head."""
        body = (4 if self.precision == "fast" else 0) if self.accuracy_level is None else self.accuracy_level
        int8 = body if self.int8_accuracy_level is None else self.int8_accuracy_level
        return {
            "accuracy_level": body,
            "int8_accuracy_level": int8,
            "head_accuracy_level": self.head_accuracy_level,
        }


@dataclass(frozen=True)
class ConvertResult:
    path: Path
    manifest: dict[str, Any]
    records: list[list[PassRecord]]  # per partition
    quant: QuantReport


# ---------------------------------------------------------------------------------------------------------


def calibration_feeds(
    gguf: GGUFFile, cfg: ArchConfig, steps: int = 4, tokens: int = 128
) -> list[dict[str, np.ndarray]]:
    """Calibration text (models/calibration.py) as `steps` prefills of `tokens` tokens, each from an empty
    cache: the whole graph's inputs."""
    from edge.models.tokenizer import load_tokenizer

    try:
        ids = load_tokenizer(gguf.metadata).encode(CALIBRATION_TEXT, parse_special=False)
    except Exception:  # a model whose tokenizer we cannot build still converts, on random ids
        ids = []
    if len(ids) < steps * tokens:
        ids = ids + np.random.default_rng(0).integers(0, cfg.n_vocab, steps * tokens - len(ids)).tolist()
    kinds = layer_kinds(cfg)
    specs = [
        LayerSpec(cfg.n_head_kv, cfg.head_dim, tokens + 1, cfg.sliding_window if k else None) for k in kinds
    ]
    view = RingKVCache(specs, sink=0).begin(tokens)
    masks = {f"mask_{k}": view.mask_prefix(kinds.index(k), 0) for k in sorted(set(kinds))}
    empty = np.zeros((1, 0, cfg.n_head_kv, cfg.head_dim), np.float32)
    embed = Embedder(gguf, cfg)
    out = []
    for step in range(steps):
        chunk = [int(i) % cfg.n_vocab for i in ids[step * tokens : (step + 1) * tokens]]
        feeds: dict[str, np.ndarray] = {
            "hidden": embed(chunk),
            "positions": view.positions,
            "logit_rows": np.arange(tokens, dtype=np.int64),
            **masks,
        }
        for i in range(cfg.n_layer):
            feeds[f"past_key_{i}"] = feeds[f"past_value_{i}"] = empty
        out.append(feeds)
    return out


def static_dims(cfg: ArchConfig, q: int, capacity: int) -> dict[str, int]:
    """The graph's symbolic dims for a static step of q tokens over `capacity` KV slots (windowed kinds:
    their window, as the ring cache sizes them)."""
    dims = {"q": q, "r": q, "past0": capacity}
    if cfg.sliding_window is not None and any(layer_kinds(cfg)):
        dims["past1"] = min(capacity, cfg.sliding_window)
    return dims


def _save_graphs(models: Mapping[str, ir.Model], out: Path, stem: str) -> tuple[dict[str, str], str]:
    """Write each shape variant's graph; large initializers go once to <stem>.weights, shared by all. Tensor by
    tensor: each is read (a mapped external tensor is unmapped after), written and replaced by a reference."""
    weights_name = f"{stem}.weights"
    written: dict[str, tuple[int, int, bytes]] = {}  # name -> (offset, length, digest of bytes)
    files: dict[str, str] = {}
    with open(out / weights_name, "wb") as fh:
        for variant, model in models.items():
            for name, value in model.graph.initializers.items():
                tensor = value.const_value
                if tensor is None or tensor.nbytes < _EXTERNAL_MIN:
                    continue
                raw = tensor.tobytes()
                if isinstance(tensor, ir.ExternalTensor):
                    tensor.release()
                digest = hashlib.sha256(raw).digest()
                if name not in written or written[name][2] != digest:
                    offset = fh.tell()
                    offset += (-offset) % 64  # aligned, so runtimes may map tensors in place
                    fh.seek(offset)
                    fh.write(raw)
                    written[name] = (offset, len(raw), digest)
                del raw
                offset, length, _ = written[name]
                value.const_value = ir.ExternalTensor(
                    weights_name, offset, length, tensor.dtype, shape=tensor.shape, name=name, base_dir=out
                )
            fh.flush()
            proto = ir.serde.serialize_model(model)
            del proto.graph.value_info[:]  # intermediate shapes: partial, and not needed by any runtime
            name = f"{stem}.{variant}.onnx"
            (out / name).write_bytes(proto.SerializeToString(deterministic=True))
            files[variant] = name
    return files, weights_name


def _write_embed(gguf: GGUFFile, cfg: ArchConfig, spec: QuantSpec, out: Path) -> dict[str, Any]:
    """token_embd rows for the numpy embed partition: kept as stored, or at INT8 (Q8_0) under --quant."""
    from gguf.quants import quantize

    from edge.models.weights import dequantize_tensor

    info = gguf.tensors["token_embd.weight"]
    qtype = GGMLQuantizationType(info.ggml_type)
    k, n = int(info.shape[0]), int(info.shape[1])
    keep = spec.mode == "keep" or qtype == GGMLQuantizationType.Q8_0 or k % 32
    if keep:
        raw = np.asarray(gguf.tensor_bytes("token_embd.weight")).reshape(n, -1)
    else:
        qtype = GGMLQuantizationType.Q8_0
        rows = dequantize_tensor(gguf, "token_embd.weight")  # [n, k]
        raw = np.concatenate([quantize(rows[i : i + 8192], qtype) for i in range(0, n, 8192)]).reshape(n, -1)
    np.save(out / "embed.npy", np.ascontiguousarray(raw, dtype=np.uint8))
    return {"file": "embed.npy", "ggml_type": qtype.name, "shape": [k, n], "scale": embed_scale(cfg)}


def _write_metadata(src: Path, out: Path) -> str:
    """The source's metadata in a tensor-less GGUF (tokenizer, template, hyper-parameters)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(str(src))
    arch = str(reader.fields["general.architecture"].contents())
    name = "metadata.gguf"
    w = GGUFWriter(str(out / name), arch)
    for fld in reader.fields.values():
        if fld.name.startswith("GGUF.") or fld.name == "general.architecture":
            continue
        vtype = fld.types[0]
        sub = fld.types[-1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(fld.name, fld.contents(), vtype, sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return name


def _ranges(cfg: ArchConfig, options: ConvertOptions) -> list[LayerRange]:
    if options.ranges:
        return graph_opt.parse_ranges(options.ranges, cfg.n_layer)
    return graph_opt.plan_partitions(cfg.n_layer, options.partitions)


def _aggregate(records: Sequence[Sequence[PassRecord]]) -> list[dict[str, Any]]:
    """Per pass position, the sums over partitions (the whole model's numbers)."""
    out = []
    for recs in zip(*records, strict=True):
        first = recs[0]
        removed: dict[str, int] = {}
        added: dict[str, int] = {}
        for r in recs:
            for op, n in r.ops_removed.items():
                removed[op] = removed.get(op, 0) + n
            for op, n in r.ops_added.items():
                added[op] = added.get(op, 0) + n
        out.append(
            {
                "name": first.name,
                "doc": first.doc,
                "applied": first.applied,
                "rewrites": sum(r.rewrites for r in recs),
                "nodes": [sum(r.nodes_before for r in recs), sum(r.nodes_after for r in recs)],
                "weight_bytes": [
                    sum(r.weight_bytes_before for r in recs),
                    sum(r.weight_bytes_after for r in recs),
                ],
                "ops_removed": dict(sorted(removed.items())),
                "ops_added": dict(sorted(added.items())),
            }
        )
    return out


def convert(
    model: CheckedModel | Path,
    out: Path,
    options: ConvertOptions | None = None,
    *,
    source_name: str | None = None,
    log: Callable[[str], None] | None = None,
) -> ConvertResult:
    """Convert the GGUF `model` (checked: models/checked.py; a path is checked here) into the artifact directory
    `out` (replacing an artifact already there)."""
    checked = as_checked(model)
    opts = options or ConvertOptions()
    say = log or (lambda _msg: None)
    out = Path(out)
    cfg = _convertible(checked, out)
    gguf = checked.gguf
    ranges = _ranges(cfg, opts)
    say(
        f"source {checked.path.name}: {cfg.arch}, {cfg.n_layer} layers; target {opts.target}; "
        f"quant {opts.quant.mode}"
    )

    report = QuantReport(opts.quant)
    if opts.quant.mode != "keep":
        whole = ir.serde.deserialize_model(build_decoder(gguf, cfg, BuildOptions()))
        calibration = calibration_feeds(gguf, cfg, opts.calibration_steps, opts.calibration_tokens)
        report = graph_opt.plan_quantization(whole, opts.quant, calibration, log=say)
        del whole

    parent = out.parent if str(out.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=parent))
    builds = [BuildOptions(first_layer=r.first, last_layer=r.last, head=r.head) for r in ranges]
    n_passes = len(graph_opt.pipeline(opts.target, fuse=opts.fuse, precision=opts.precision))
    total = sum(build_steps(cfg, b) + n_passes + 1 for b in builds) + 1  # + the embed and metadata
    label = f"{len(ranges)} {opts.target} partition(s) of {checked.name}"
    with BuildTask(label, f"into {out}", total) as task:
        try:
            records: list[list[PassRecord]] = []
            parts: list[dict[str, Any]] = []
            for index, (rng, build) in enumerate(zip(ranges, builds, strict=True)):
                say(f"partition {index}: {rng}")
                stem = tmp / f"part{index}"
                part, part_records = _convert_partition(gguf, cfg, rng, build, opts, report, stem, say, task)
                records.append(part_records)
                parts.append(part)
            embed = _write_embed(gguf, cfg, opts.quant, tmp)
            task.step()
            metadata = _write_metadata(Path(gguf.path), tmp)
            manifest = _manifest(gguf, cfg, opts, source_name, report, records, parts)
            manifest |= {"embed": embed, "metadata": metadata}
            text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
            (tmp / MANIFEST).write_text(text, encoding="utf-8")
            if out.exists():
                shutil.rmtree(out)
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    say(f"wrote {out}")
    return ConvertResult(out, manifest, records, report)


def _convertible(checked: CheckedModel, out: Path) -> ArchConfig:
    """The GGUF's architecture, once it is clear an artifact can be made from it into `out`."""
    if checked.artifact is not None:
        raise EdgeError(f"{checked.path} is an edge artifact already", hint="convert the GGUF it came from")
    if out.exists() and not is_artifact(out) and (not out.is_dir() or any(out.iterdir())):
        raise EdgeError(f"{out} exists and is not an edge artifact", hint="choose another -o DIR")
    gguf = checked.gguf
    cfg = ArchConfig.from_gguf(gguf.metadata, set(gguf.tensors))
    if cfg.rope_factor_tensor(gguf.tensors, True) != cfg.rope_factor_tensor(gguf.tensors, False):
        # LongRoPE's table depends on the context the artifact will run with, which it does not record
        raise EdgeError(
            f"{checked.path.name} carries LongRoPE long and short factor tables: an artifact would fix one of them",
            hint="run the GGUF itself (--backend ort|openvino picks the table from the context, as llama.cpp)",
        )
    return cfg


def _convert_partition(
    gguf: GGUFFile,
    cfg: ArchConfig,
    rng: LayerRange,
    build: BuildOptions,
    opts: ConvertOptions,
    report: QuantReport,
    stem: Path,
    say: Callable[[str], None],
    task: BuildTask,
) -> tuple[dict[str, Any], list[PassRecord]]:
    """One partition's graphs (dynamic, or static prefill + decode) optimized for the target and saved as
    `stem`*: its manifest entry and the passes' records. Streamed as devices/graph_decoder.ensure_graph builds:
    weights in scratch files beside the artifact's (one layer's, then one linear's, in memory), removed once
    it is written."""
    scratch = stem.parent / f".{stem.name}.scratch"
    scratch.mkdir()
    proto = build_decoder(gguf, cfg, build, external=scratch / "build.data", on_step=task.step)
    onnx.save_model(proto, scratch / "build.onnx")
    del proto
    m = ir.load(scratch / "build.onnx")
    with graph_opt.WeightSpill(scratch / "passes.data") as spill:
        res = graph_opt.optimize(
            m,
            opts.target,
            quant=opts.quant,
            fuse=opts.fuse,
            precision=opts.precision,
            quant_report=report,
            on_pass=task.step,
            spill=spill,
            **opts.levels(),
        )
    for rec in res.records:
        say("  " + rec.line())
    variants: dict[str, ir.Model] = {}
    if opts.static:
        ir.save(m, scratch / "optimized.onnx")  # its external tensors stay where they are
        del m
        for variant, q in (("prefill", opts.prefill_chunk), ("decode", 1)):
            v = ir.load(scratch / "optimized.onnx")
            graph_opt.specialize_shapes(v, static_dims(cfg, q, opts.capacity))
            variants[variant] = v
    else:
        variants["dynamic"] = m
    files, weights = _save_graphs(variants, stem.parent, stem.name)
    del variants
    shutil.rmtree(scratch)
    task.step()
    if opts.target == "coreml":
        for name in files.values():
            onnx.checker.check_model(str(stem.parent / name), full_check=True)
    return {**rng.to_dict(), "graphs": files, "weights": weights}, res.records


def _manifest(
    gguf: GGUFFile,
    cfg: ArchConfig,
    opts: ConvertOptions,
    source_name: str | None,
    report: QuantReport,
    records: list[list[PassRecord]],
    parts: list[dict[str, Any]],
) -> dict[str, Any]:
    """The artifact's manifest: where it came from, the architecture, what was done to it, its partitions."""
    source = Path(gguf.path)
    return {
        "format": FORMAT,
        "source": {
            "name": source_name,
            "file": source.name,
            "path": None if source_name else str(source.resolve()),
            "sha256": file_sha256(source),
            "size": source.stat().st_size,
        },
        "arch": {
            "arch": cfg.arch,
            "n_layer": cfg.n_layer,
            "n_embd": cfg.n_embd,
            "n_head": cfg.n_head,
            "n_head_kv": cfg.n_head_kv,
            "head_dim": cfg.head_dim,
            "n_vocab": cfg.n_vocab,
            "context_length": cfg.context_length,
        },
        "target": opts.target,
        "fused": opts.fuse,
        "quant": report.to_dict(),
        "accuracy_levels": opts.levels(),
        "passes": _aggregate(records),
        "partitions": parts,
        "shapes": {
            "static": opts.static,
            "prefill_chunk": opts.prefill_chunk if opts.static else None,
            "capacity": opts.capacity if opts.static else None,
        },
        "tensor_names": sorted(gguf.tensors),
    }
