"""`edge models`, `edge rm` and `edge cache`: the catalog, what the cache holds and removing it (the cache's
layout and rules are devices/cache.py's). Registered on `edge`'s parser by `edge.cli.build_parser`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.filesize import decimal as size_text

if TYPE_CHECKING:
    from edge.devices.cache import Entry, Removal

# built entries listed in this order: graphs, then plans, then their compile caches
_KIND_ORDER = {"graphs": 0, "plans": 1, "compiled": 2}


def _built(entries: list[Entry]) -> dict[str, Any]:
    """The JSON of what was built from one model, and its labels for the table (`ort fast (2)`)."""
    entries = sorted(entries, key=lambda e: (_KIND_ORDER.get(e.kind, 3), e.label))
    counts: dict[str, int] = {}
    for e in entries:
        counts[e.label] = counts.get(e.label, 0) + 1
    labels = [f"{k} ({n})" if n > 1 else k for k, n in counts.items()]
    built = [{**e.to_dict(), "label": e.label} for e in entries]
    return {"built": built, "built_bytes": sum(e.bytes for e in entries), "labels": labels}


def _catalog_rows(entries: list[Entry]) -> list[dict[str, Any]]:
    from edge.devices.cache import entries_of
    from edge.models.catalog import CATALOG, DEFAULT_MODEL
    from edge.models.store import is_verified, model_path

    rows = []
    for e in CATALOG.values():
        local, path = is_verified(e), model_path(e)
        files = [path, path.with_name(path.name + ".verified.json")]
        built = _built(entries_of(entries, path, e.file))
        rows.append(
            {
                "name": e.name,
                "arch": e.arch,
                "file": e.file,
                "size": e.size or None,
                "sha256": e.sha256,
                "licence": e.licence,
                "chat_template": e.chat,
                "default": e.name == DEFAULT_MODEL,
                "packages": [f"{p.package}=={p.version}" for p in e.parts],
                "pulled": local,
                "path": str(path) if local else None,
                "description": e.description,
                "bytes_on_disk": sum(f.stat().st_size for f in files if f.is_file()),
                **built,
            }
        )
    return rows


def _other_sources(entries: list[Entry], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Files (or `edge convert` folders) outside the catalog that edge built something from."""
    listed = {b["path"] for r in rows for b in r["built"]}
    groups: dict[str, list[Entry]] = {}
    for e in entries:
        if e.model and not e.busy and str(e.path) not in listed:
            groups.setdefault(e.model, []).append(e)
    return [{"path": m, "present": Path(m).exists(), **_built(es)} for m, es in sorted(groups.items())]


def cmd_models(args: argparse.Namespace) -> int:
    from edge.devices.cache import scan
    from edge.models.store import cache_dir

    entries = scan()
    rows = _catalog_rows(entries)
    others = _other_sources(entries, rows)
    if args.json:
        print(json.dumps({"models": rows, "other_sources": others, "cache_dir": str(cache_dir())}))
        return 0
    from rich.console import Console

    console = Console()
    console.print(_catalog_table(rows))
    built = [(r["name"], r) for r in rows if r["built"]] + [(o["path"], o) for o in others]
    if built:
        console.print(_built_table(built))
    console.print(
        f"cache: {cache_dir()}; `edge rm NAME` removes a model and what was built from it, `edge cache` "
        "shows the whole cache",
        highlight=False,
    )
    return 0


def _table(*columns: Any) -> Any:
    from rich import box
    from rich.table import Table

    return Table(*columns, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)


def _catalog_table(rows: list[dict[str, Any]]) -> Any:
    from rich.table import Column

    # names are what the user types: never cut; a narrow terminal wraps the licence and description instead
    table = _table(
        Column("name", no_wrap=True, min_width=max(len(r["name"]) for r in rows)),
        Column("arch", no_wrap=True),
        Column("size", no_wrap=True, justify="right"),
        Column("local", no_wrap=True),
        Column("licence", overflow="fold", max_width=12),
        Column("description", overflow="fold", ratio=1),
    )
    for r in rows:
        size = f"{r['size'] / 1e6:.0f} MB" if r["size"] else "?"
        name = r["name"] + ("\n[dim](default)[/]" if r["default"] else "")
        table.add_row(name, r["arch"], size, "yes" if r["pulled"] else "no", r["licence"], r["description"])
    return table


def _built_table(built: list[tuple[str, dict[str, Any]]]) -> Any:
    from rich.table import Column

    table = _table(
        Column("built from", overflow="fold"),
        Column("built (backend precision)", overflow="fold", ratio=1),
        Column("on disk", no_wrap=True, justify="right"),
    )
    for name, r in built:
        gone = "" if r.get("present", True) else " [dim](file gone)[/]"
        table.add_row(name + gone, ", ".join(r["labels"]), size_text(r["built_bytes"]))
    return table


def _removal_lines(removal: Removal, root: Path) -> list[str]:
    lines = []
    for path, n, why in removal.removed:
        shown = path.relative_to(root) if path.is_relative_to(root) else path
        lines.append(f"removed {shown} ({size_text(n)}): {why}")
    lines += [
        f"left {e.path.relative_to(root)}: being written (changed in the last hour)" for e in removal.skipped
    ]
    return lines


def cmd_rm(args: argparse.Namespace) -> int:
    from edge.devices.cache import remove_model
    from edge.models.store import cache_dir

    removal = remove_model(args.model)
    if args.json:
        print(json.dumps({"model": args.model, **removal.to_dict()}))
        return 0
    if not removal.removed:
        from edge.models.catalog import CATALOG

        why = (
            "is not pulled and nothing was built from it"
            if args.model in CATALOG
            else "has nothing built from it"
        )
        print(f"nothing to remove for {args.model}: it {why} in {cache_dir()}")
        return 0
    for line in _removal_lines(removal, cache_dir()):
        print(line)
    print(f"freed {size_text(removal.freed)}")
    return 0


def _entries(n: int) -> str:
    return f"{n} entr{'y' if n == 1 else 'ies'}"


def cmd_cache(args: argparse.Namespace) -> int:
    from edge.devices.cache import KINDS, prune, scan, usage
    from edge.models.store import cache_dir

    root = cache_dir()
    if args.prune:
        removal = prune()
        if args.json:
            print(json.dumps(removal.to_dict()))
            return 0
        for line in _removal_lines(removal, root):
            print(line)
        print(f"freed {size_text(removal.freed)}" if removal.removed else "nothing to prune")
        return 0
    sizes, entries = usage(), scan()
    stale = [e for e in entries if e.stale is not None and not e.busy]
    if args.json:
        out = {
            "cache_dir": str(root),
            "bytes": sizes,
            "total_bytes": sum(sizes.values()),
            "entries": [e.to_dict() for e in entries],
            "stale_bytes": sum(e.bytes for e in stale),
        }
        print(json.dumps(out))
        return 0
    print(f"cache: {root} (EDGE_CACHE_DIR sets another)")
    for kind in KINDS:
        mine = [e for e in entries if e.kind == kind]
        n_stale = sum(1 for e in mine if e in stale)
        count = f"  {_entries(len(mine))}" + (f", {n_stale} stale" if n_stale else "") if mine else ""
        print(f"  {kind:<9}{size_text(sizes[kind]):>10}{count}")
    print(f"  {'total':<9}{size_text(sum(sizes.values())):>10}")
    if stale:
        print(
            f"stale: {_entries(len(stale))}, {size_text(sum(e.bytes for e in stale))} (`edge cache --prune` removes them)"
        )
    return 0


def add_parsers(sub: Any) -> None:
    mod = sub.add_parser("models", help="the catalog, what is pulled and what was built from it")
    mod.add_argument("--json", action="store_true")
    mod.set_defaults(func=cmd_models)

    rm = sub.add_parser("rm", help="remove a pulled model and what was built from it")
    rm.add_argument(
        "model", help="catalog name, or a .gguf path (then only what edge built from it; never the file)"
    )
    rm.add_argument("--json", action="store_true")
    rm.set_defaults(func=cmd_rm)

    cache = sub.add_parser("cache", help="where the cache is and what it holds, by kind")
    cache.add_argument(
        "--prune",
        action="store_true",
        help="remove graphs and plans of older formats or of models gone, and leftovers of killed writes",
    )
    cache.add_argument("--json", action="store_true")
    cache.set_defaults(func=cmd_cache)
