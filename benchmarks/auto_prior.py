"""The prior of `--backend auto` (devices/auto_prior.json): each backend's recorded speed per catalog model, taken
from an `edge bench` results file, for the models nothing has been measured on yet on this machine.

    python -m benchmarks.auto_prior                                    # from the default results file
    python -m benchmarks.auto_prior benchmarks/results/fast-graphs-YYYY-MM-DD.json

The input is what benchmarks/fast_graphs.py writes ({model: {"bench": edge bench JSON, ...}}); only the
backends `--backend auto` can choose (llamacpp, ort, openvino) are kept, with the machine they ran on.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edge.devices.auto import AUTO_BACKENDS
from edge.models.catalog import CATALOG

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "benchmarks" / "results" / "fast-graphs-2026-12-01-quiet.json"
OUT = ROOT / "devices" / "auto_prior.json"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="?", type=Path, default=DEFAULT)
    args = ap.parse_args()
    runs = json.loads(args.results.read_text(encoding="utf-8"))
    models, machine = {}, None
    for name, run in runs.items():
        bench = run["bench"]
        if bench["settings"]["device"] != "cpu":
            continue
        entry = CATALOG[name]
        m = bench["machine"]
        machine = machine or {
            "cpu": m["cpu"],
            "isa": m["isa"],
            "threads": bench["settings"]["threads"],
            "versions": {k: v for k, v in m["versions"].items() if k in AUTO_BACKENDS},
        }
        speeds = {
            r["backend"]: {"prefill_tok_s": r["prefill_tok_s"], "decode_tok_s": r["decode_tok_s"]}
            for r in bench["results"]
            if r["backend"] in AUTO_BACKENDS
        }
        models[entry.sha256] = {"name": name, "size": entry.size, "backends": speeds}
    first = next(iter(runs.values()))["bench"]["settings"]
    prior = {
        "source": str(args.results.relative_to(ROOT)),
        "precision": "fast",
        "prompt_tokens": first["prompt_tokens"],
        "gen_tokens": first["gen_tokens"],
        "rounds": first["repeat"],
        "machine": machine,
        "models": models,
    }
    OUT.write_text(json.dumps(prior, indent=1) + "\n", encoding="utf-8")
    print(
        f"wrote {OUT.relative_to(ROOT)} from {args.results.name}: {', '.join(m['name'] for m in models.values())}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
