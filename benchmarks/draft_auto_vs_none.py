"""`--draft auto` vs `--draft none` where drafts are mostly rejected: sampled chat answers (temperature 0.7),
own ORT graph, 4 prompts x 3 rounds x 128 tokens, the two variants alternating which goes first.

    python benchmarks/draft_auto_vs_none.py smollm2-135m
    python benchmarks/draft_auto_vs_none.py qwen2.5-coder-1.5b      # auto also holds the 0.5b draft model

Prints decode tok/s medians, their ratio and the median of the per-generation ratios (issue 15: auto may
cost at most 5% there).
"""

import statistics
import sys

import edge
from edge.generate import GenerationConfig
from edge.sampling import SamplingConfig

model = sys.argv[1]
prompts = [
    "Tell me a short story about a lighthouse keeper.",
    "What are three good habits for studying?",
    "Describe a rainy day in a city.",
    "Why do cats purr?",
]
with edge.load(model, backend="ort") as m:
    spec = m.speculative
    r = {"auto": [], "none": []}
    for rnd in range(3):
        for i, p in enumerate(prompts):
            for name in ("auto", "none") if (rnd + i) % 2 == 0 else ("none", "auto"):
                m.speculative = spec if name == "auto" else None
                cfg = GenerationConfig(
                    max_tokens=128,
                    ignore_eos=True,
                    sampling=SamplingConfig(temperature=0.7, seed=rnd * 10 + i),
                )
                g = m.generate(p, cfg, reuse=False)
                r[name].append(g.stats.decode_tok_s)
    a, n = statistics.median(r["auto"]), statistics.median(r["none"])
    ratios = [x / y for x, y in zip(r["auto"], r["none"], strict=True)]
    print(
        model,
        "auto",
        round(a, 1),
        "none",
        round(n, 1),
        "ratio of medians",
        round(a / n, 3),
        "median pair ratio",
        round(statistics.median(ratios), 3),
    )
