"""The command-line options that load a model, declared once: `edge run`, `chat` and `serve` take all of them
(`add_load_args`, read back by `load_kwargs`), `bench` and `eval` the device, precision and threads
(`add_device_args`), each with the same names, defaults and help. A leaf module: every CLI imports it, it imports
nothing of edge's."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = [
    "DRAFT_HELP",
    "PHASE_PLAN_HELP",
    "add_ctx_size",
    "add_device_args",
    "add_load_args",
    "add_precision",
    "load_kwargs",
]

DRAFT_HELP = (
    "speculative decoding: auto (default: prompt lookup, plus a compatible draft model already pulled, on the "
    "own-graph backends ort/openvino; greedy generations are drafted only where that cannot change them: "
    "ort at --precision fast, checked batch-invariant, or --precision exact), none, ngram, "
    "or a draft model (catalog name or .gguf path)"
)


PHASE_PLAN_HELP = (
    "split the model by phase: prefill=BACKEND:DEVICE[:PRECISION],decode=BACKEND:DEVICE[:PRECISION] (e.g. "
    "prefill=openvino:cpu:bf16,decode=ort:cpu: prompts in bf16 on the CPU's matrix engine, tokens on ORT's "
    "int8 path, one KV cache); PRECISION fast | exact | bf16 (openvino:cpu only), default --precision; "
    "prefill=openvino:npu: prompts on the NPU-shaped graphs (--emulate: compiled on the CPU)"
)


KV_CHOICES = ("auto", "f32", "f16")


def add_precision(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--precision",
        choices=("fast", "exact"),
        default="fast",
        help="fast: int8 activations where a backend has them, as llama.cpp computes (default); "
        "exact: fp32 math on the file's own blocks",
    )


def add_ctx_size(p: argparse.ArgumentParser | argparse._ArgumentGroup, default: int | None = 4096) -> None:
    """--ctx-size: the KV's tokens (`edge bench`: default None, what the run needs)."""
    p.add_argument(
        "--ctx-size",
        type=int,
        default=default,
        help=f"context length in tokens (default {default or 'what the run holds, rounded up to 256'})",
    )


def add_device_args(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """--device, --precision and --threads: what every command that runs a model takes."""
    group = p.add_argument_group("model loading")
    group.add_argument(
        "--device",
        default="cpu",
        help="cpu | gpu | gpu.N (the runtime's GPU.N) | npu | auto | hetero:[backend:]device,... (default cpu)",
    )
    add_precision(group)
    group.add_argument(
        "--kv-dtype",
        choices=KV_CHOICES,  # devices/precision.KV_CHOICES (this module imports no numpy: --help stays quick)
        default="auto",
        help="the KV cache's type: auto (f32 on edge's graphs on a CPU, f16 on llama.cpp and OpenVINO's GPU), f32, or "
        "f16 (half the KV memory; keys and values rounded to fp16, as llama.cpp keeps them; not with "
        "--precision exact)",
    )
    group.add_argument("--threads", type=int, default=None, help="CPU threads (default: physical cores)")
    return group


def add_load_args(p: argparse.ArgumentParser, *, phases: bool = False) -> None:
    """Every option of `edge.load` (LoadOptions), for the commands that load one model to answer with it;
    `phases`: --plan too (edge run, chat, serve)."""
    group = add_device_args(p)
    if phases:
        group.add_argument("--plan", default=None, metavar="PHASES", help=PHASE_PLAN_HELP)
    group.add_argument(
        "--backend",
        default="auto",
        help="auto, or a backend `edge devices` lists as ready: llamacpp | ort | openvino (default auto: the "
        "backend measured fastest for the model here; --explain says why)",
    )
    group.add_argument(
        "--fallback",
        nargs="?",
        const="cpu",
        default=None,
        metavar="DEVICE",
        help="run on DEVICE (default cpu) if the asked-for one is absent (announced)",
    )
    group.add_argument(
        "--emulate", action="store_true", help="--device npu: the NPU-shaped static graphs, run on the CPU"
    )
    add_ctx_size(group)
    group.add_argument("--draft", default="auto", help=DRAFT_HELP)
    group.add_argument(
        "--draft-device", default="cpu", help="[backend:]device of the draft model (default cpu)"
    )
    group.add_argument("--draft-k", type=int, default=16, help="most tokens drafted per step (default 16)")


def load_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """`edge.load`'s keywords from what `add_load_args` declared."""
    plan = vars(args).get("plan")  # declared by the commands that take it
    return {
        **({} if plan is None else {"plan": plan}),
        "device": args.device,
        "backend": args.backend,
        "fallback": args.fallback or False,
        "emulate": args.emulate,
        "n_ctx": args.ctx_size,
        "n_threads": args.threads,
        "precision": args.precision,
        "kv_dtype": args.kv_dtype,
        "draft": args.draft,
        "draft_device": args.draft_device,
        "draft_k": args.draft_k,
    }
