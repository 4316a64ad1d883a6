"""Run `edge bench` over the catalog models; write results/run-catalog-<date>-<machine>.json and .md and the table
of docs/performance.md.

    python -m benchmarks.run_catalog                      # all four models, 3 rounds each
    python -m benchmarks.run_catalog --models smollm2-135m --repeat 5 --no-docs

Each model runs in its own `edge bench` process, so one model's memory never counts against the next.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PERFORMANCE = ROOT / "docs" / "performance.md"
SECTION = "## The catalog on llama.cpp"
CATALOG_ORDER = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")


def bench(model: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        cmd = [sys.executable, "-m", "edge.cli", "bench", model, "--backends", args.backends]
        cmd += ["--against", args.against, "--repeat", str(args.repeat)]
        cmd += ["--prompt-tokens", str(args.prompt_tokens), "--gen-tokens", str(args.gen_tokens)]
        cmd += ["--json", str(out)] + (["--threads", str(args.threads)] if args.threads else [])
        print("$ edge " + " ".join(cmd[3:]), file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True)  # the table goes to our stdout as it comes
        return json.loads(out.read_text())


def machine_slug(machine: dict[str, Any]) -> str:
    cpu = re.sub(r"\(r\)|\(tm\)|cpu|processor|@.*", "", machine["cpu"].lower())
    words = re.findall(r"[a-z0-9]+", cpu)
    return "-".join([*words[:5], f"{machine['physical_cores']}c"])


def _range(r: dict[str, Any], key: str, fmt: str) -> str:
    if r["rounds"] == 1:
        return f"{r[key]:{fmt}}"
    return f"{r[key]:{fmt}} ({r[key + '_min']:{fmt}}-{r[key + '_max']:{fmt}})"


def markdown(runs: list[dict[str, Any]], date: str) -> str:
    """The table and the machine it was measured on (the body of docs/performance.md's catalog section)."""
    m, s = runs[0]["machine"], runs[0]["settings"]
    v = m["versions"]
    bw = ", ".join(f"{r['roofline']['bandwidth_gb_s']:.1f}" for r in runs)
    lines = [
        f"Measured {date} with `python -m benchmarks.run_catalog --repeat {s['repeat']}` on: {m['cpu']} "
        f"({m['arch']}, ISA {' '.join(m['isa']) or 'baseline'}), {m['physical_cores']} cores, "
        f"{s['threads']} threads used, {m['memory_total_mb'] / 1024:.0f} GiB RAM, {m['os']}; Python "
        f"{v['python']}, llama-cpp-python {v.get('llamacpp', '?')}. Read bandwidth measured with numpy: "
        f"{bw} GB/s (one measurement per model run).",
        "",
        f"Prompt {s['prompt_tokens']} tokens, {s['gen_tokens']} tokens decoded greedily, {s['repeat']} round(s) "
        "per model: median (min-max). Load: first in the process / later ones (the file is in the OS page "
        "cache either way); RSS is the process "
        "peak during the run (+ growth over the RSS before the load). Roofline = read bandwidth / bytes of "
        "weights read per token (the token embedding table is excluded where the model has a separate "
        "output head; tied embeddings are read in full as the head).",
        "",
        "| model | backend | load s cold / warm | TTFT ms | prefill tok/s | decode tok/s | roofline tok/s "
        "| decode / roofline | RSS MB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        roof = run["roofline"]
        for r in run["results"]:
            lines.append(
                f"| {run['model']} | {r['backend']}:{r['device']} | {r['load_cold_s']:.2f} / {r['load_s']:.2f} "
                f"| {_range(r, 'ttft_ms', '.0f')} | {_range(r, 'prefill_tok_s', '.0f')} "
                f"| {_range(r, 'decode_tok_s', '.1f')} | {roof['bound_tok_s']:.0f} "
                f"| {100 * r['decode_roofline_fraction']:.0f}% "
                f"| {r['peak_rss_mb']:.0f} (+{r['rss_growth_mb']:.0f}) |"
            )
    return "\n".join(lines) + "\n"


def update_docs(body: str, json_name: str) -> None:
    """Replace the body of docs/performance.md's catalog section (or add the section at the end)."""
    text = PERFORMANCE.read_text(encoding="utf-8")
    section = f"{SECTION}\n\n{body}\nFull figures: `benchmarks/results/{json_name}`.\n\n"
    match = re.search(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", text, flags=re.M | re.S)
    if match:
        text = text[: match.start()] + section + text[match.end() :]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    PERFORMANCE.write_text(text.rstrip("\n") + "\n", encoding="utf-8")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(CATALOG_ORDER), help="comma-separated catalog names")
    p.add_argument("--backends", default="llamacpp")
    p.add_argument("--against", default="llamacpp")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-docs", action="store_true", help="do not replace the table in docs/performance.md")
    args = p.parse_args()

    runs = [bench(m.strip(), args) for m in args.models.split(",") if m.strip()]
    date = dt.date.today().isoformat()
    name = f"run-catalog-{date}-{machine_slug(runs[0]['machine'])}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"date": date, "command": " ".join(sys.argv), "runs": runs}
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    body = markdown(runs, date)
    (RESULTS / f"{name}.md").write_text(f"# edge bench over the catalog: {name}\n\n{body}", encoding="utf-8")
    print(f"wrote {RESULTS / name}.json and .md", file=sys.stderr)
    if not args.no_docs:
        update_docs(body, f"{name}.json")
        print(f"{PERFORMANCE.relative_to(ROOT)}: catalog table updated", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
