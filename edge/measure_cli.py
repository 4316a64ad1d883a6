"""`edge bench` and `edge eval`: the measuring commands (speed and memory side by side; perplexity and KL against a
reference). Registered on `edge`'s parser by `edge.cli.build_parser`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge.cli_args import PHASE_PLAN_HELP, add_ctx_size, add_device_args
from edge.errors import EdgeError

if TYPE_CHECKING:
    from edge.bench import BenchConfig


def cmd_bench(args: argparse.Namespace) -> int:
    if args.embed:  # an embedding model: its own figures (edge/bench_embed.py)
        return _bench_embed(args)
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from edge.bench import run_bench, total_steps
    from edge.bench_report import (
        batch_lines,
        bench_table,
        bytes_lines,
        check_plot,
        partition_lines,
        write_plot,
    )

    if args.plot:
        check_plot()
    cfg = _bench_config(args)
    err = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"))
    with Progress(
        *columns,
        TimeElapsedColumn(),
        console=err,
        transient=True,
        refresh_per_second=2,  # a quiet redraw thread: it shares the cores being measured
        disable=not err.is_terminal,
    ) as bar:
        task = bar.add_task("bench", total=total_steps(cfg))

        def step(what: str, done: int) -> None:
            bar.update(task, description=what, completed=done)

        bench = run_bench(args.model, cfg, on_step=step)
    report = bench.to_dict()
    (err if args.json == "-" else Console()).print(bench_table(report))
    for line in bytes_lines(report) + batch_lines(report) + partition_lines(report):
        (err if args.json == "-" else Console()).print(line, highlight=False)
    if bench.draft is not None:
        (err if args.json == "-" else Console()).print(bench.draft.summary(), highlight=False)
    for r in report["results"]:
        if "ratio_constrained_decode" in r:
            line = (
                f"{r['backend']}: decode under the grammar's mask {r['constrained_decode_tok_s']:.1f} tok/s, "
                f"{r['ratio_constrained_decode']:.3f}x the plain decode's same steps"
            )
            (err if args.json == "-" else Console()).print(line, highlight=False)
        if "ratio_fast_forward" in r:
            same = "same tokens" if r["fast_forward_identical"] else "outputs DIFFER"
            line = (
                f"{r['backend']}: fast-forward of the grammar's {r['forced_tokens']} forced tokens "
                f"{r['fast_forward_tok_s']:.1f} tok/s, {r['ratio_fast_forward']:.3f}x one step each ({same})"
            )
            (err if args.json == "-" else Console()).print(line, highlight=False)
    for key in ("auto", "auto_record", "depth"):  # auto's choice and record; what a depth does to the figures
        if key in bench.notes:
            err.print(bench.notes[key], highlight=False)
    if args.plot:
        write_plot(report, args.plot)
        err.print(f"plot written to {args.plot}")
    if args.json == "-":
        print(json.dumps(report))
    elif args.json:
        _write_json(args.json, report)
        err.print(f"JSON written to {args.json}")
    return 0


def _bench_config(args: argparse.Namespace) -> BenchConfig:
    """What `edge bench` was asked, checked (`all` in --backends: every installed backend auto chooses from)."""
    from edge.bench import BenchConfig
    from edge.grammar import cli_grammar

    backends = tuple(b.strip() for b in args.backends.split(",") if b.strip())
    if "all" in backends:  # every backend --backend auto chooses between that runs here
        from edge.devices.auto import available_backends

        backends = tuple(
            dict.fromkeys(x for b in backends for x in (available_backends() if b == "all" else [b]))
        )
    return BenchConfig(
        backends=backends,
        against=args.against,
        device=args.device,
        prompt_tokens=args.prompt_tokens,
        gen_tokens=args.gen_tokens,
        repeat=args.repeat,
        threads=args.threads,
        draft=args.draft,
        draft_device=args.draft_device,
        draft_k=args.draft_k,
        plans=tuple(args.plan or ()),
        precision=args.precision,
        kv_dtype=args.kv_dtype,
        grammar=cli_grammar(args.json_schema, args.json_object),
        depth=args.depth,
        ctx_size=args.ctx_size,
    )


def cmd_eval(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress

    from edge.evaluate import EvalConfig, evaluate

    cfg = EvalConfig(
        backend=args.backend,
        reference=args.reference,
        device=args.device,
        tokens=args.tokens,
        text=args.text,
        threads=args.threads,
        test_chunk=args.test_chunk,
        precision=args.precision,
        kv_dtype=args.kv_dtype,
        reference_precision=args.reference_precision,
        plan=args.plan,
        test_prompt=args.test_prompt,
    )
    err = Console(stderr=True)
    with Progress(console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task("teacher-forcing", total=cfg.tokens)
        result = evaluate(args.model, cfg, lambda done, _total: bar.update(task, completed=done))
    out = result.to_dict()
    if args.json:
        print(json.dumps(out))
        return 0
    m = result.metrics
    fed = f"{result.test_chunk} token(s) per forward"
    if result.test_prompt is not None:
        fed = f"a {result.test_prompt}-token prompt, then {fed}"
    print(
        f"{out['model']}: {result.backend} ({fed}) vs {cfg.reference} "
        f"({cfg.chunk} per forward) over {m.tokens} tokens of {out['text']}\n"
        f"  perplexity    {m.ppl:.4f} (reference {m.ppl_ref:.4f})\n"
        f"  KL(ref||test) mean {m.kl_mean:.3g} nats, p99 {m.kl_p99:.3g}\n"
        f"  top-1 agree   {100 * m.top1_agree:.2f}%\n"
        f"  RMS dp        {m.rms_dp:.3g} (change of the correct token's probability)"
    )
    for name, part in (("prompt rows", result.prompt), ("rows after", result.after)):
        if part is not None:
            print(
                f"  {name:<13} {part.tokens} tokens: KL mean {part.kl_mean:.3g}, p99 {part.kl_p99:.3g}, "
                f"top-1 {100 * part.top1_agree:.2f}%"
            )
    return 0


def _write_json(path: str, obj: object) -> None:
    try:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(obj, fh, indent=2)
            fh.write("\n")
    except OSError as exc:
        raise EdgeError(f"cannot write {path}: {exc}") from None


# -- parser ----------------------------------------------------------------------------------------


def add_parsers(sub: Any) -> None:
    _add_bench(sub)
    _add_eval(sub)


def _bench_embed(args: argparse.Namespace) -> int:

    from edge.bench_embed import BACKENDS, run_embed_bench, to_dict

    backends = BACKENDS if args.backends in ("auto", "all") else tuple(args.backends.split(","))
    results = run_embed_bench(
        args.model, backends, sentences=args.sentences, threads=args.threads, precision=args.precision,
        repeat=args.repeat,
    )  # fmt: skip
    report = to_dict(args.model, results, args.sentences, args.threads)
    if args.json:
        text = json.dumps(report)
        if args.json == "-":
            print(text)
            return 0
        Path(args.json).write_text(text + "\n")
    base = results[0]
    print(f"{args.model}: {args.sentences} short sentences, threads {args.threads or 'default'}")
    for r in results:
        print(
            f"  {r.backend:<9} {r.sentences_s:8.0f} sentences/s ({r.sentences_s / base.sentences_s:4.2f}x) "
            f"{r.tokens_s:9.0f} tokens/s  query {r.query_ms:6.2f} ms  load {r.load_s:5.2f} s"
        )
    return 0


def _add_bench(sub: Any) -> None:
    ben = sub.add_parser("bench", help="speed and memory of backends on a model, side by side")
    ben.add_argument("model", help="catalog name or .gguf path")
    ben.add_argument(
        "--backends",
        default="auto",
        help="comma-separated; auto: the one --backend auto runs the model on (default); all: llamacpp, ort "
        "and openvino where installed. A run of two or more of them is what --backend auto decides by",
    )
    ben.add_argument(
        "--against",
        default=None,
        help="backend the ratios are relative to (default: the first of --backends)",
    )
    ben.add_argument(
        "--plan",
        action="append",
        metavar="PLAN",
        help="also measure a device plan, e.g. hetero:openvino:cpu,ort:cpu or npu-emulated (repeatable; "
        "reports each partition's time), or a phase plan: " + PHASE_PLAN_HELP,
    )
    add_ctx_size(add_device_args(ben), default=None)
    ben.add_argument(
        "--embed",
        action="store_true",
        help="an embedding model: sentences/s, tokens/s and one query's latency per backend (default "
        "backends ort,openvino,llamacpp; llama.cpp on the same weights as an f16 GGUF)",
    )
    ben.add_argument("--sentences", type=int, default=512, help="--embed: short sentences per run (512)")
    ben.add_argument("--prompt-tokens", type=int, default=128)
    ben.add_argument("--gen-tokens", type=int, default=128)
    ben.add_argument(
        "--depth",
        type=int,
        default=0,
        metavar="N",
        help="measure prefill and decode with N tokens of context already in the KV, on every backend "
        "(their prefill untimed, as llama-bench -d); --ctx-size must hold N + prompt + gen + 16",
    )
    ben.add_argument("--repeat", type=int, default=5, help="rounds, backends interleaved (default 5)")
    ben.add_argument(
        "--draft", default=None, help="also decode with this draft model (or 'ngram') vs without, same run"
    )
    ben.add_argument("--draft-device", default="cpu", help="[backend:]device of the draft (default cpu)")
    ben.add_argument("--draft-k", type=int, default=16, help="most tokens drafted per step (default 16)")
    ben.add_argument(
        "--json", metavar="FILE", default=None, help="write one JSON object to FILE ('-': stdout)"
    )
    ben.add_argument("--plot", metavar="FILE", default=None, help="write a PNG bar chart to FILE")
    shape = ben.add_mutually_exclusive_group()
    shape.add_argument(
        "--json-schema",
        metavar="FILE",
        default=None,
        help="also decode greedily under this JSON Schema's mask, same round (the masking cost)",
    )
    shape.add_argument("--json-object", action="store_true", help="the same for any JSON object")
    ben.set_defaults(func=cmd_bench)


def _add_eval(sub: Any) -> None:
    ev = sub.add_parser("eval", help="perplexity and KL of a backend against a reference backend")
    ev.add_argument("model", help="catalog name, .gguf path or artifact directory (edge convert -o DIR)")
    ev.add_argument("--backend", default=None, help="default llamacpp; an artifact: its target")
    ev.add_argument(
        "--reference",
        default="llamacpp",
        help="a backend, or an artifact directory of the same model (any quantization: same tokenizer)",
    )
    add_device_args(ev)
    ev.add_argument(
        "--reference-precision",
        choices=("fast", "exact"),
        default="fast",
        help="the reference backend's precision (default fast)",
    )
    ev.add_argument("--text", type=Path, default=None, help="UTF-8 text file (default: the shipped eval.txt)")
    ev.add_argument("--tokens", type=int, default=1024, help="tokens of the text to score (default 1024)")
    ev.add_argument(
        "--test-chunk",
        type=int,
        default=None,
        metavar="N",
        help="feed the tested backend N tokens per forward (1: its decode path; the reference stays batched)",
    )
    ev.add_argument(
        "--test-prompt",
        type=int,
        default=None,
        metavar="N",
        help="feed the tested backend each window's first N tokens in one forward, as a prompt, then the rest "
        "in --test-chunk pieces over its K/V; also reports the prompt's rows and the rows after apart",
    )
    ev.add_argument(
        "--plan",
        default=None,
        metavar="PHASES",
        help="test a phase split in place of --backend (with --test-prompt above its 32-token threshold, the "
        "prompt runs on the prefill half): " + PHASE_PLAN_HELP,
    )
    ev.add_argument("--json", action="store_true", help="print one JSON object")
    ev.set_defaults(func=cmd_eval)
