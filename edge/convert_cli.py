"""`edge convert MODEL --target ort|openvino|coreml [--quant keep|int8|int4] [--partitions N] [-o DIR]
[--explain]`: write an artifact directory (see models/artifact.py) and say what each pass did. With
`--target coreml` each partition graph is also exported as a Core ML `.mlpackage` (devices/coreml.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from edge.cli_args import add_precision

__all__ = ["add_parser", "cmd_convert", "explain_lines"]


def add_parser(sub: Any) -> None:
    conv = sub.add_parser("convert", help="optimize a model for a target: fused, quantized, partitioned ONNX")
    conv.add_argument("model", help="catalog name or .gguf path")
    conv.add_argument("--target", required=True, choices=("ort", "openvino", "coreml"))
    conv.add_argument("--quant", default="keep", choices=("keep", "int8", "int4"), help="default keep")
    conv.add_argument("--group", type=int, default=32, choices=(32, 64, 128), help="INT4 group size")
    conv.add_argument("--sym", action="store_true", help="symmetric weights (no zero points), for NPUs")
    conv.add_argument(
        "--sensitive-layers",
        type=float,
        default=0.1,
        help="with int4: share of decoder layers kept at INT8, the most sensitive by measured KL (default 0.1)",
    )
    conv.add_argument(
        "--kl-budget",
        type=float,
        default=None,
        help="with int4: keep the most sensitive layers at INT8 until the summed KL of the rest fits this",
    )
    conv.add_argument("--partitions", type=int, default=1, help="layer-range partitions (default 1)")
    conv.add_argument("--ranges", default=None, help="explicit layer ranges, e.g. 0-14,15-29")
    conv.add_argument("--static", action="store_true", help="fixed shapes (NPUs): prefill and decode graphs")
    conv.add_argument("--prefill-chunk", type=int, default=64, help="static prefill width (default 64)")
    conv.add_argument("--capacity", type=int, default=1024, help="static KV slots (default 1024)")
    conv.add_argument("--no-fuse", action="store_true", help="skip the fusion passes (for comparisons)")
    conv.add_argument(
        "--accuracy-level",
        type=int,
        default=None,
        help="MatMulNBits accuracy level: 0 fp32-exact, 4 int8 activations (default: from --precision)",
    )
    add_precision(conv)
    conv.add_argument("-o", "--output", type=Path, default=None, help="artifact directory")
    conv.add_argument("--explain", action="store_true", help="list the passes and their effect")
    conv.add_argument("--json", action="store_true", help="print one JSON object (the manifest's summary)")
    conv.set_defaults(func=cmd_convert)


def explain_lines(manifest: dict[str, Any]) -> list[str]:
    """The pass table of a manifest: what each pass matches and what it changed, summed over partitions."""
    mib = 1 << 20
    w = max([13, *(len(p["name"]) for p in manifest["passes"])])  # the name column fits the longest name
    lines = [f"{'pass':<{w}} {'rewrites':>8}  {'nodes':>13}  {'weights MiB':>15}  changes / what it matches"]
    for p in manifest["passes"]:
        if not p["applied"]:
            lines.append(f"{p['name']:<{w}} {'-':>8}  {'':>13}  {'':>15}  not for {manifest['target']}")
            continue
        (nb, na), (wb, wa) = p["nodes"], p["weight_bytes"]
        changes = ", ".join(
            [f"-{n} {op}" for op, n in p["ops_removed"].items()]
            + [f"+{n} {op}" for op, n in p["ops_added"].items()]
        )
        lines.append(
            f"{p['name']:<{w}} {p['rewrites']:>8}  {nb:>6}->{na:<6}  {wb / mib:>7.1f}->{wa / mib:<7.1f}  "
            + (changes or "-")
        )
        lines.append(f"{'':<{w}} {'':>8}  {'':>13}  {'':>15}  {p['doc']}")
    q = manifest["quant"]
    lines.append(
        f"quant: {q['mode']}"
        + (f" (linears {q['linears']}, INT8 layers {q['int8_layers']})" if q["mode"] != "keep" else "")
    )
    for i, part in enumerate(manifest["partitions"]):
        head = " + head" if part["head"] else ""
        lines.append(
            f"partition {i}: layers {part['first_layer']}-{part['last_layer'] - 1}{head}: {sorted(part['graphs'].values())}"
        )
        if part.get("mlpackages"):
            lines.append(f"{'':<13}Core ML: {sorted(part['mlpackages'].values())}")
    return lines


def cmd_convert(args: argparse.Namespace) -> int:
    from edge.graph_opt import QuantSpec
    from edge.models.catalog import CATALOG
    from edge.models.checked import check_model
    from edge.models.convert import ConvertOptions, convert

    quant = QuantSpec(
        args.quant, args.group, args.sym, sensitive_layers=args.sensitive_layers, kl_budget=args.kl_budget
    )
    opts = ConvertOptions(
        target=args.target,
        quant=quant,
        partitions=args.partitions,
        ranges=args.ranges,
        fuse=not args.no_fuse,
        static=args.static,
        prefill_chunk=args.prefill_chunk,
        capacity=args.capacity,
        accuracy_level=args.accuracy_level,
        precision=args.precision,
    )
    if args.target == "coreml":
        from edge.devices.coreml import check_available

        check_available()  # before the conversion, not after it
    checked = check_model(args.model)
    path = checked.path
    out = args.output or Path(f"{path.stem}-{args.target}-{args.quant}")
    quiet = args.json

    def log(msg: str) -> None:
        if not quiet and not args.explain:
            print(msg, file=sys.stderr)

    result = convert(checked, out, opts, source_name=args.model if args.model in CATALOG else None, log=log)
    m = result.manifest
    if args.target == "coreml":
        from edge.devices.coreml import export_artifact
        from edge.models.artifact import record_mlpackages

        # a dynamic artifact gets fixed-shape packages too (prefill chunk, decode step): see devices/coreml.py
        packages = export_artifact(
            result.path, prefill_chunk=args.prefill_chunk, capacity=args.capacity, log=log
        )
        m = record_mlpackages(result.path, packages)
    if args.json:
        print(
            json.dumps(
                {
                    "path": str(result.path),
                    "target": m["target"],
                    "quant": m["quant"],
                    "passes": m["passes"],
                    "partitions": m["partitions"],
                    "shapes": m["shapes"],
                }
            )
        )
    elif args.explain:
        print("\n".join(explain_lines(m)))
        print(f"wrote {result.path}")
    return 0
