"""Showing a bench report: a rich table for the terminal and a PNG bar chart (matplotlib, Agg)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table

from edge.errors import EdgeError

__all__ = ["batch_lines", "bench_table", "bytes_lines", "check_plot", "partition_lines", "write_plot"]


def _num(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.3g}"


def _fmt(r: dict[str, Any], key: str) -> str:
    """Median, and min-max dimmed on a second line."""
    return f"{_num(r[key])}\n[dim]{_num(r[key + '_min'])}-{_num(r[key + '_max'])}[/]"


def _depth(settings: dict[str, Any]) -> str:
    """`--depth N`: the context in the KV before the prompt, named before it (absent in older reports)."""
    depth, kv = settings.get("depth", 0), settings.get("kv_dtype", "auto")
    return ("" if kv == "auto" else f"KV {kv}, ") + (f"depth {depth}, " if depth else "")


def bench_table(report: dict[str, Any]) -> Table:
    """The figures of `BenchReport.to_dict()`: median over min-max per metric, ratios to --against."""
    s, roof = report["settings"], report["roofline"]
    table = Table(
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        show_edge=False,
        title=f"{report['model']}: {_depth(s)}prompt {s['prompt_tokens']}, gen {s['gen_tokens']}, "
        f"{s['repeat']} rounds, {s['threads']} threads",
        caption=f"median over min-max; x = ratio to {s['against']}; roofline {roof['bound_tok_s']:.0f} tok/s "
        f"= {roof['bandwidth_gb_s']:.1f} GB/s / {roof['weight_bytes_per_token'] / 1e6:.1f} MB per token",
    )
    warm = s["repeat"] > 1  # one round has only the cold load
    table.add_column("backend")
    load_col = "load s\ncold/\nwarm" if warm else "load s\ncold"
    for col in (
        load_col,
        "TTFT\nms",
        "prefill\ntok/s",
        "warm\nprefill",
        "decode\ntok/s",
        "% roof-\nline",
    ):
        table.add_column(col, justify="right")
    for col in ("RSS MB\n+growth", "x pre-\nfill", "x de-\ncode"):
        table.add_column(col, justify="right")
    for r in report["results"]:
        table.add_row(
            f"{r['backend']}\n{r['device']}",
            f"{r['load_cold_s']:.3f}\n{r['load_s']:.3f}" if warm else f"{r['load_cold_s']:.3f}",
            _fmt(r, "ttft_ms"),
            _fmt(r, "prefill_tok_s"),
            _fmt(r, "prefill_warm_tok_s"),
            _fmt(r, "decode_tok_s"),
            f"{100 * r['decode_roofline_fraction']:.0f}%",
            f"{r['peak_rss_mb']:.0f}\n+{r['rss_growth_mb']:.0f}",
            f"{r['ratio_prefill']:.2f}",
            f"{r['ratio_decode']:.2f}",
        )
    return table


def bytes_lines(report: dict[str, Any]) -> list[str]:
    """The weight bytes a decode step reads against the file's, and the rate decode read them at against the
    measured read bandwidth (absent in older reports)."""
    bw = report["roofline"]["bandwidth_gb_s"]
    return [
        f"{r['backend']}: reads {r['weight_bytes_ratio_to_file']:.2f}x the file's weight bytes a token "
        f"({r['weight_bytes_read_per_token'] / 1e6:.0f} MB); decode read {r['decode_read_gb_s']:.1f} GB/s, "
        f"{100 * r['decode_bandwidth_fraction']:.0f}% of the measured {bw:.1f} GB/s"
        for r in report["results"]
        if "weight_bytes_ratio_to_file" in r
    ]


def batch_lines(report: dict[str, Any]) -> list[str]:
    """What a forward of k tokens costs in one-token decode steps (a speculative verify's price)."""
    return [
        f"{r['backend']}: a forward of k tokens costs "
        + ", ".join(f"k={k}: {v:.2f}" for k, v in r["batch_cost_steps"].items())
        + " decode steps"
        for r in report["results"]
        if "batch_cost_steps" in r
    ]


def partition_lines(report: dict[str, Any]) -> list[str]:
    """Per-partition time of each plan measured (`edge bench --plan`): where a token's time goes."""
    lines = []
    for r in report["results"]:
        for p in r.get("partitions", []):
            lines.append(
                f"{r['backend']}: partition {p['partition']}: prefill {p['prefill_ms']:.1f} ms, "
                f"decode {p['decode_ms_per_token']:.2f} ms/token"
            )
    return lines


# (key, panel title, unit, higher is better, ratio key)
_PANELS = (
    ("prefill_tok_s", "Prefill", "tok/s", True, "ratio_prefill"),
    ("decode_tok_s", "Decode", "tok/s", True, "ratio_decode"),
    ("ttft_ms", "Time to first token", "ms", False, "ratio_ttft"),
    ("load_s", "Load: warm (bar), cold (diamond)", "s", False, None),
    ("rss_growth_mb", "Memory: RSS growth", "MB", False, None),
)


PLOT_HINT = 'pip install "edge-llm[plot]"'


def check_plot() -> None:
    """--plot needs matplotlib, an extra: said before the bench runs, not after its minutes of measuring."""
    if importlib.util.find_spec("matplotlib") is None:
        raise EdgeError("--plot needs matplotlib, which is not installed", hint=PLOT_HINT)


def write_plot(report: dict[str, Any], path: str | Path) -> None:
    """Bar chart, one panel per metric, one bar per backend with min-max whiskers and its value written on."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise EdgeError("--plot needs matplotlib, which is not installed", hint=PLOT_HINT) from None

    results, s, roof, m = report["results"], report["settings"], report["roofline"], report["machine"]
    names = [f"{r['backend']}\n{r['device']}" for r in results]
    colors = [plt.get_cmap("tab10")(i % 10) for i in range(len(results))]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7.5), layout="constrained")
    warm = s["repeat"] > 1  # one round has only the cold load: its bar is that one
    for ax, (key, title, unit, higher, ratio) in zip(axes.flat, _PANELS, strict=False):
        med = [r[key] for r in results]
        lo = [r[key] - r[f"{key}_min"] for r in results]
        hi = [r[f"{key}_max"] - r[key] for r in results]
        ax.bar(names, med, yerr=[lo, hi], capsize=6, color=colors, width=0.6, ecolor="0.25")
        top = max(r[f"{key}_max"] for r in results)
        if key == "load_s" and not warm:
            title = "Load: cold (one round)"
        if key == "load_s" and warm:
            ax.plot(names, [r["load_cold_s"] for r in results], "kD", markersize=8)
            top = max(top, *(r["load_cold_s"] for r in results))
        for x, r in enumerate(results):
            label = f"{_num(r[key])} {unit}"
            if key == "load_s":
                label = f"warm {label}\ncold {_num(r['load_cold_s'])} {unit}" if warm else f"cold {label}"
            if key == "decode_tok_s":
                label += f"\n{100 * r['decode_roofline_fraction']:.0f}% roofline"
            if ratio and r["backend"] != s["against"]:
                label += f"\nx{r[ratio]:.2f}"
            above = max(r[f"{key}_max"], r["load_cold_s"] if key == "load_s" else 0.0)
            ax.annotate(
                label,
                (x, above),
                xytext=(0, 6),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=9,
                fontweight="bold",
            )
        if key == "decode_tok_s":
            title += f" (roofline {roof['bound_tok_s']:,.0f} tok/s)"
        ax.set_title(f"{title}\n{'higher' if higher else 'lower'} is better", fontsize=11)
        ax.set_ylabel(unit)
        ax.set_ylim(0, top * 1.4 or 1)  # room for the labels above the whiskers
        ax.grid(axis="y", alpha=0.3)
    info = axes.flat[-1]
    info.axis("off")
    lines = [
        f"model: {report['model']}",
        f"{_depth(s)}prompt {s['prompt_tokens']} tokens, {s['gen_tokens']} decoded (greedy)",
        f"{s['repeat']} rounds, backends interleaved",
        "bar = median, whiskers = min..max",
        f"xN = ratio to {s['against']} (median / median)",
        "",
        f"CPU: {m['cpu']} ({m['arch']})",
        f"{m['physical_cores']} cores, {s['threads']} threads, {m['memory_total_mb'] / 1024:.0f} GiB RAM",
        f"{m['os']}, load avg {m['load_avg_1m']['start']:.2f} -> {m['load_avg_1m']['end']:.2f}",
        f"read bandwidth: {roof['bandwidth_gb_s']:.1f} GB/s (numpy)",
        f"weights per token: {roof['weight_bytes_per_token'] / 1e6:.1f} MB",
        f"roofline: {roof['bound_tok_s']:,.0f} tok/s",
    ]
    info.text(0.0, 1.0, "\n".join(lines), va="top", fontsize=10, family="monospace")
    fig.suptitle(f"edge bench: {report['model']}", fontsize=14, fontweight="bold")
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise EdgeError(f"cannot write the plot to {path}: {exc}") from None
    finally:
        plt.close(fig)
