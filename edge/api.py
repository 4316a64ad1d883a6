"""`edge.load`: find the model (pulled and checked on first use), check the file, decide where it runs and that
it fits there, and open it as a `Model` (edge/model.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edge.devices.planned import DeviceRequest, PlannedOptions, resolve_request
from edge.drafters import verify_backend
from edge.errors import InsufficientMemoryError
from edge.model import Model, chat_template_of
from edge.models.build_progress import reporting
from edge.models.checked import CheckedModel, check_model
from edge.models.store import PullProgress
from edge.options import LoadOptions
from edge.speculative import open_speculative

__all__ = ["load", "load_default"]


def load(
    model: str | None = None,
    *,
    device: str = "cpu",
    backend: str | None = "auto",
    draft: str | None = "auto",
    fallback: bool | str = False,
    n_ctx: int = 4096,
    n_threads: int | None = None,
    draft_device: str = "cpu",
    draft_k: int = 16,
    emulate: bool = False,
    precision: str = "fast",
    available_memory: int | None = None,
    on_progress: PullProgress | None = None,
    parallel: int = 1,
    plan: str | None = None,
    kv_dtype: str = "auto",
) -> Model:
    """Load a catalog model (pulled and checked on first use) or a local .gguf file (or `edge convert` output).

    `device`: cpu | gpu | npu | auto | hetero:[backend:]device,... (e.g. "hetero:openvino:cpu,ort:cpu": the
    layers split into partitions across the listed devices by the planner); an absent device raises
    `edge.DeviceError` listing what exists, unless `fallback=True` (or a device kind, "cpu") — then
    `model.fallback` says what replaced what. `emulate=True` with device="npu" runs the NPU-shaped (static)
    graphs on the CPU. `backend`: auto (default: the backend that measures fastest for this model on this
    machine; `model.backend_choice` says why) | llamacpp | ort | openvino (`edge devices` lists them). `draft`:
    speculative decoding: "auto" (prompt lookup, plus a compatible draft model already pulled, on the target's
    own-graph backend; greedy generations are drafted only where drafting cannot change them: a decoder that
    proved itself batch-invariant, as ORT's at "fast", or precision "exact"), "none", "ngram" or a draft model on `draft_device` (`draft_k`: the most tokens drafted per step).
    `precision`: "fast" (int8 activations where a graph backend has them, as llama.cpp computes) or "exact"
    (fp32 math on the file's own blocks). The backend sizes the model first: `edge.InsufficientMemoryError`
    when it needs more than is free (`available_memory`: bytes to assume free instead of measuring).
    `parallel`: how many sequences the caller will run at once (`model.slots(n)` splits the model into that
    many, on one copy of the weights); above 1, auto chooses among the backends that batch them, and the own
    graphs are built with attention per slot (each slot's rows attend over its own KV only).
    `plan`: the model split by phase, "prefill=B:D[:P],decode=B:D[:P]" (e.g.
    "prefill=openvino:cpu:bf16,decode=ort:cpu": prompts in bf16 on the matrix engine, tokens on ORT's int8
    path; P is fast | exact | bf16, default `precision`), one KV cache between the halves, in place of
    `backend` and `device`; `edge.PlanError` when it does not parse or its halves cannot run together.
    `kv_dtype`: the KV cache's type, "auto" (f32 on the own graphs on a CPU, whose attention reads f32; f16
    on llama.cpp and OpenVINO's GPU; f16 too where only that fits in memory, said in `model.load_note`),
    "f32" or "f16" (half the KV memory at long contexts; keys and values rounded to fp16, as llama.cpp keeps
    them; not with precision "exact").
    `on_progress(done, total, phase)` sees what a first load waits for. The pull of a catalog model not
    downloaded yet, in bytes: phase "download" while it arrives, then "verified" once. Then, when the model's
    graph for this backend (or its device plan's partitions) is not built yet, the build, once per model and
    cached: phase "build" with done/total in the build's steps (one per layer, one for the head, one per graph
    pass, one per graph written; total may grow once as the build learns its passes), from (0, total) to (total,
    total). Then phase "compile", (0, 1) and (1, 1), around the runtime opening the graph (compiling it the first
    time, cached after). None shows them on stderr (a bar on a terminal, plain lines elsewhere).

    >>> import edge
    >>> with edge.load("smollm2-135m", device="cpu") as m:           # doctest: +SKIP
    ...     print(m.generate("Hello", max_tokens=8).text)
    """
    opts = LoadOptions(
        backend=backend,
        device=device,
        fallback=fallback,
        emulate=emulate,
        n_ctx=n_ctx,
        n_threads=n_threads,
        precision=precision,
        available_memory=available_memory,
        draft=draft,
        draft_device=draft_device,
        draft_k=draft_k,
        parallel=parallel,
        plan=plan,
        kv_dtype=kv_dtype,
    )
    checked = check_model(model, on_progress=on_progress)  # before any native code sees the file
    chat_template_of(checked)  # a template that cannot compile fails before a graph is built for it
    return _open(checked, opts, on_progress)


def _open(checked: CheckedModel, opts: LoadOptions, on_progress: PullProgress | None) -> Model:
    """Where the checked model runs (and that it fits there), opened as a Model with its drafters."""
    fallback = opts.fallback
    request = DeviceRequest(
        opts.backend,
        opts.device,
        "cpu" if fallback is True else (fallback or None),
        opts.emulate,
        phases=opts.plan,
    )
    popts = PlannedOptions(
        n_ctx=opts.n_ctx,
        threads=opts.n_threads,
        precision=opts.precision,
        available_memory=opts.available_memory,
        parallel=opts.parallel,
        kv_dtype=opts.kv_dtype,
    )
    with reporting(on_progress):  # the graph builds below (devices/graph_decoder.py, devices/planned.py)
        opening = resolve_request(checked, request, popts)  # where it runs, and whether it fits there
        decoder, placement = opening.open()  # auto may have moved to llama.cpp while building
    try:
        loaded = Model(checked, decoder, placement, device_plan=opening.plan, options=opts)
        with reporting(on_progress):  # a draft model's graph, when it is built for the first time
            loaded.speculative = open_speculative(
                opts.draft,
                decoder,
                checked.tokenizer,
                checked.name,
                target_backend=verify_backend(decoder, placement.backend),  # a split's decode half
                target_path=checked.path,
                draft_device=opts.draft_device,
                draft_k=opts.draft_k,
                n_ctx=opts.n_ctx,
                n_threads=opts.n_threads,
                precision=opts.precision,
                kv_dtype=opts.kv_dtype,
            )
        return loaded
    except BaseException:
        decoder.close()
        raise


def load_default(*, on_fallback: Callable[[str], None] | None = None, **options: Any) -> Model:
    """The default model (models/catalog.py DEFAULT_MODEL) with `load`'s `options`; where it needs more memory
    than is free, the largest smaller catalog chat model that fits, and `on_fallback` hears which and why.
    Raises the default's InsufficientMemoryError when none fits."""
    from edge.models.catalog import CATALOG, DEFAULT_MODEL

    limit = CATALOG[DEFAULT_MODEL].size
    fitting = sorted((e for e in CATALOG.values() if e.chat and e.size <= limit), key=lambda e: -e.size)
    first: InsufficientMemoryError | None = None
    for entry in fitting:
        try:
            loaded = load(entry.name, **options)
        except InsufficientMemoryError as err:
            first = first or err
            continue
        if first is not None and on_fallback is not None:
            on_fallback(
                f"the default model {DEFAULT_MODEL} needs about {first.needed >> 20} MiB, "
                f"{first.available >> 20} MiB free: running {entry.name}, the largest catalog chat model that fits"
            )
        return loaded
    assert first is not None  # the default itself is a chat model, so it was tried
    raise first
