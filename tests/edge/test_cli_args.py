"""Every command that loads a model takes the same model-loading options, declared once (edge/cli_args.py)."""

from __future__ import annotations

import argparse

from edge.cli import build_parser

LOAD = {
    "--device",
    "--precision",
    "--kv-dtype",
    "--threads",
    "--backend",
    "--fallback",
    "--emulate",
    "--ctx-size",
    "--draft",
    "--draft-device",
    "--draft-k",
}
CORE = {"--device", "--precision", "--kv-dtype", "--threads"}


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _options(p: argparse.ArgumentParser, names: set[str]) -> dict[str, tuple[object, ...]]:
    """Each option's definition as a user meets it: its names, default, choices, nargs and help."""
    out = {}
    for a in p._actions:
        for flag in a.option_strings:
            if flag in names:
                out[flag] = (tuple(a.option_strings), a.dest, a.default, a.choices, a.nargs, a.const, a.help)
    return out


def test_run_chat_and_serve_take_every_load_option_alike() -> None:
    cmds = _commands()
    seen = [_options(cmds[name], LOAD) for name in ("run", "chat", "serve")]
    assert set(seen[0]) == LOAD
    assert seen[0] == seen[1] == seen[2]


def test_bench_and_eval_take_the_device_options_alike() -> None:
    # bench measures --backends (plural) and a --draft against none; eval a --backend against a --reference:
    # the rest of what loads the model is the same option as run's
    cmds = _commands()
    run = _options(cmds["run"], CORE)
    for name in ("bench", "eval"):
        assert _options(cmds[name], CORE) == run, name


def test_serve_passes_them_to_load() -> None:
    from edge.cli_args import load_kwargs

    argv = ["serve", "m.gguf", "--draft-k", "4", "--emulate", "--ctx-size", "512", "--kv-dtype", "f16"]
    kw = load_kwargs(build_parser().parse_args(argv))
    assert kw["draft_k"] == 4 and kw["emulate"] is True and kw["n_ctx"] == 512 and kw["kv_dtype"] == "f16"
    import inspect

    from edge.options import LoadOptions

    fields = set(inspect.signature(LoadOptions).parameters)
    assert set(kw) <= fields  # every keyword is an edge.load option
    from edge.server.config import LoadSettings

    assert LoadSettings(**kw).kv_dtype == "f16"  # and the server's settings take each of them
    from edge.apps.tui.settings import ChatSettings

    chat = load_kwargs(build_parser().parse_args(["chat", "--kv-dtype", "f16"]))
    assert ChatSettings(**chat).kv_dtype == "f16"  # as edge chat's do (edge.apps.tui.main)
