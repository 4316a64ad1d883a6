"""A deterministic corpus of strings that stress tokenizers; tokenizer tests compare edge with llama.cpp on it."""

from __future__ import annotations

import random

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "It's a truth universally acknowledged, that a single man in possession of a good fortune, must be in "
    "want of a wife.",
    "I'm sure you'll agree: we've done what we'd planned, and they're happy. Isn't it? Don't!",
    "SHOUTING IN CAPS, Then Title Case, then lower case... and (parentheses) [brackets] {braces}.",
    "Mr. O'Neill's dog -- a 3-year-old -- won 1st prize on 2024-05-17 at 10:45am (GMT+2).",
    "e.g. i.e. etc. vs. U.S.A. Ph.D. a.m. p.m.",
    "Numbers: 0 7 42 314 2718 31415 271828 3141592653589793238462643383279 1,000,000 1.5e-10 -0.25 +3",
    "Prices: $19.99, €5,50, £3, ¥1000, ₹250, 50% off, #1, @user, a&b, x|y, ~approx, ^caret, `tick`",
    "Email: someone@example.com, URL: https://example.org/path?q=1&r=two#frag",
    "He said, \"Hello!\" She replied, 'Hi.' They whispered: «bonjour» „Guten Tag“ “quoted” ‘single’",
]

SCRIPTS = {
    "latin": "Ça va? Déjà vu, naïve façade, Smørrebrød, Ångström, Ærøskøbing, Łódź, Dvořák, Şişli, İstanbul, ß.",
    "latin2": "Dziękuję bardzo! Tiếng Việt có dấu: Hà Nội, Sài Gòn, người, được. Ðakovo. Œuvre. ﬁne ligature.",
    "cyrillic": "Съешь же ещё этих мягких французских булок, да выпей чаю. Україна, Ґанок, Їжак. Српски језик.",
    "greek": "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Ελληνικά: αβγδεζηθικλμνξοπρστυφχψω ΑΒΓΔ ΐΰ",
    "arabic": "صِف خَلقَ خَودِ كَمِثلِ الشَمسِ إِذ بَزَغَت — العربية ١٢٣٤٥٦٧٨٩٠ مرحباً بالعالم",
    "hebrew": "דג סקרן שט בים מאוכזב ולפתע מצא חברה. שָׁלוֹם עֲלֵיכֶם ₪100",
    "devanagari": "ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले विष्णुवतार भगवान श्रीराम। १२३४",
    "thai": "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า กว่าบรรดาฝูงสัตว์เดรัจฉาน ๑๒๓",
    "cjk": "中华人民共和国成立于1949年。我们在学习自然语言处理，分词是第一步！「引号」『書名』，、。",
    "hangul": "다람쥐 헌 쳇바퀴에 타고파. 한국어 토크나이저 테스트입니다. ㄱㄴㄷ ㅏㅑㅓ",
    "japanese": "いろはにほへと ちりぬるを わかよたれそ つねならむ。カタカナ、ﾊﾝｶｸｶﾀｶﾅ、漢字かな交じり文です。",
    "armenian": "Բարեւ աշխարհ։ Հայերեն տեքստ։",
    "georgian": "გამარჯობა მსოფლიო, ქართული ენა.",
    "bengali": "আমি বাংলায় গান গাই। ০১২৩৪৫",
    "tamil": "யாமறிந்த மொழிகளிலே தமிழ்மொழி போல் இனிதாவது எங்கும் காணோம்.",
    "ethiopic": "ሰላም ለዓለም። ፩፪፫",
    "math": "∀x∈ℝ: x²≥0 ∧ ∑ᵢ aᵢ ≤ ∫₀^∞ e^{-t} dt ≈ 1 ⇒ √2 ≠ π ± ∞ ∂f/∂x ∇·E = ρ/ε₀ ℵ₀ ⅓ ½ ¾ Ⅻ ①②③",
}

EMOJI = [
    "👍",
    "👍🏽",
    "👨‍👩‍👧‍👦",
    "🏳️‍🌈",
    "🇫🇷🇯🇵🇺🇸",
    "🧑🏾‍💻",
    "❤️",
    "👩‍❤️‍💋‍👨",
    "🫠🥹🫶",
    "😀😃😄😁😆",
    "✅☑️✔️",
    "#️⃣1️⃣",
    "🏴󠁧󠁢󠁳󠁣󠁴󠁿",
    "🐍🦀🐹",
]

CODE = [
    'def fib(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n'
    "    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    '#include <stdio.h>\n\nint main(int argc, char **argv) {\n\tprintf("%d\\n", argc);\n\treturn 0;\n}\n',
    'fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!("{:?}", v);\n}\n',
    'const add = (a, b) => a + b;\nexport default function App() {\n  return <div className="app">{add(1, 2)}</div>;\n}\n',
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC LIMIT 10;",
    'package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Println("hello, 世界")\n}\n',
    '{"key": [1, 2.5, null, true], "nested": {"a": "b\\u00e9"}, "empty": {}}',
    "<html>\n  <body>\n    <table><tr><td>cell</td></tr></table>\n    <b>bold</b> <i>it</i>\n  </body>\n</html>",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do\n  echo \"$f\" | sed 's/a/b/g' >> out.log\ndone\n",
    'public class Main {\n    public static void main(String[] args) {\n        System.out.println("Hi");\n    }\n}\n',
    "x = [i**2 for i in range(10) if i % 2 == 0]  # comment\r\ny = {k: v for k, v in zip('abc', x)}\r\n",
    "    \n\t\n  \t  \n",
    "a == b != c <= d >= e && f || !g; h += 1; i -= 2; j *= 3; k /= 4; l %= 5; m <<= 1; n >>= 2;",
    '---\ntitle: "YAML"\nlist:\n  - one\n  - two\n...\n',
    "| col1 | col2 |\n|------|------|\n| a    | b    |\n\n# Heading\n\n* bullet\n1. item\n\n```python\nprint(1)\n```\n",
]

SPECIALS = [
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|file_sep|>",
    "<|repo_name|>",
    "<tool_call>",
    "</tool_call>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<bos>",
    "<eos>",
    "<pad>",
    "<unk>",
    "<mask>",
    "<unused0>",
    "<unused42>",
    "[multimodal]",
    "<start_of_image>",
    "<table>",
    "</s>",
    "<s>",
    "<b>",
    "<fim_prefix>",
    "<filename>",
    "<reponame>",
    "<jupyter_code>",
    "<0x0A>",
    "<0x41>",
    "<|im_start",
    "im_end|>",
]

WHITESPACE = [
    " ",
    "  ",
    "   ",
    "\t",
    "\t\t",
    "\n",
    "\n\n",
    "\n\n\n",
    "\r\n",
    "\r\n\r\n",
    "\r",
    " \n",
    "\n ",
    " \t \n",
    "\u00a0",
    "\u3000",
    "\u2028",
    "\u2009",
    "\u200b",
    "\u0085",
    "\v",
    "\f",
    " " * 7,
    " " * 33,
    "\n" * 40,
    "\t" * 35,
]

RUNS = [
    "=",
    "-",
    ".",
    "!",
    "?",
    "*",
    "#",
    "_",
    "~",
    "0",
    "1",
    "9",
    "a",
    "ab",
    "ha",
    "aba",
    "▁",
    "<",
    ">",
    "/",
]

CONTRACTIONS = [
    "'s",
    "'t",
    "'re",
    "'ve",
    "'m",
    "'ll",
    "'d",
    "'S",
    "'T",
    "'RE",
    "'Ve",
    "'M",
    "'LL",
    "'D",
    "'x",
    "''",
]

# Code point pools for random mixes: every script above, marks, controls, private use, code points
# that newer Unicode assigns but llama.cpp's tables do not (U+105C0, U+1CC00...), and unassigned ones.
POOLS = [
    (0x20, 0x7E),
    (0x00, 0x1F),
    (0x7F, 0xFF),
    (0x100, 0x24F),
    (0x300, 0x36F),
    (0x370, 0x3FF),
    (0x400, 0x4FF),
    (0x590, 0x5FF),
    (0x600, 0x6FF),
    (0x900, 0x97F),
    (0xE00, 0xE7F),
    (0x1100, 0x11FF),
    (0x2000, 0x206F),
    (0x2190, 0x22FF),
    (0x3040, 0x30FF),
    (0x4E00, 0x4FFF),
    (0xAC00, 0xAD00),
    (0xE000, 0xE0FF),
    (0xFF00, 0xFFEF),
    (0xFFF0, 0xFFFD),
    (0x105C0, 0x105F3),
    (0x10D40, 0x10D8F),
    (0x1CC00, 0x1CCF9),
    (0x1F300, 0x1F6FF),
    (0x1F900, 0x1F9FF),
    (0xE0000, 0xE007F),
    (0x30000, 0x3134A),
    (0x2FFF0, 0x2FFFF),
]


def _random_text(rng: random.Random, n: int) -> str:
    chars = []
    for _ in range(n):
        lo, hi = rng.choice(POOLS)
        cp = rng.randint(lo, hi)
        if 0xD800 <= cp < 0xE000:
            cp = 0xFFFD
        chars.append(chr(cp))
    return "".join(chars)


def _pieces() -> list[str]:
    return [
        *PROSE,
        *SCRIPTS.values(),
        *EMOJI,
        *CODE,
        *SPECIALS,
        *WHITESPACE,
        *CONTRACTIONS,
        "hello",
        "world",
        "The",
        "42",
        "x",
        "é",
        "中",
        " ",
        "\n",
        ".",
        "'",
    ]


def corpus(seed: int = 1234) -> list[str]:
    """Deterministic: the same list of strings for the same seed, on every platform."""
    rng = random.Random(seed)
    out: list[str] = []
    out += PROSE + list(SCRIPTS.values()) + EMOJI + CODE + SPECIALS + WHITESPACE
    # every line of the code samples on its own, with its indentation
    out += [line for snippet in CODE for line in snippet.splitlines(keepends=True)]
    # words and sentences of each script, with and without a leading space
    for text in [*PROSE, *SCRIPTS.values()]:
        words = text.split(" ")
        out += [w for w in words if w]
        out += [" " + w for w in words if w]
    # runs of repeated characters, each length 1..24, alone and next to letters
    for unit in RUNS:
        for k in range(1, 25):
            out.append(unit * k)
        out += [f"x{unit * 5}y", f" {unit * 7} ", f"{unit * 3}\n{unit * 4}"]
    # digits of every length, grouped and ungrouped
    for k in range(1, 30):
        digits = "".join(rng.choice("0123456789") for _ in range(k))
        out += [digits, " " + digits, f"a{digits}b", f"{digits}.{digits[::-1]}", "١٢٣٤٥٦٧٨٩٠"[: k % 11]]
    # contractions after words, in every case, with spaces around
    for c in CONTRACTIONS:
        out += [f"it{c}", f"IT{c} here", f"you {c} ", f"{c}", f"x{c}{c}", f"'{c}"]
    # whitespace between and around words
    for ws in WHITESPACE:
        out += [f"a{ws}b", f"{ws}word", f"word{ws}", f"{ws}{ws}x{ws}", f"1{ws}2", f"!{ws}?", f"{ws}'s"]
    # special tokens inline, glued and spaced, in chat shapes
    for sp in SPECIALS:
        out += [f"{sp}user\nHello!{sp}\n", f"text{sp}text", f" {sp} ", f"{sp}{sp}", f"\n{sp}\n", f"a {sp}b"]
    out += [
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
        "<bos><start_of_turn>user\nWrite a poem.<end_of_turn>\n<start_of_turn>model\n",
        "<|fim_prefix|>def f():\n    <|fim_suffix|>\n    return 1<|fim_middle|>",
        "<|im_start|><|im_end|><|endoftext|>",
        "<<|im_start|>>",
        "<|im_start|<|im_end|>|>",
    ]
    # emoji next to text and each other
    for e in EMOJI:
        out += [f"{e}", f" {e}", f"a{e}b", f"{e}{e}", f"{e} text", f"text{e}\n"]
    # random bytes read as UTF-8 with replacement
    for _ in range(150):
        raw = bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))
        out.append(raw.decode("utf-8", errors="replace"))
    # random UTF-8 of valid sequences cut at random places, read with replacement
    for _ in range(100):
        text = rng.choice([*SCRIPTS.values(), *EMOJI]).encode("utf-8")
        a = rng.randrange(len(text))
        b = rng.randrange(a, len(text) + 1)
        out.append(text[a:b].decode("utf-8", errors="replace"))
    # a sweep over the code space, each code point between letters, digits and spaces: the Unicode
    # classes of the pre-tokenizer regexes must be llama.cpp's for every one of them
    sweep = [chr(cp) for cp in range(0x80, 0x323B0, 31) if not 0xD800 <= cp < 0xE000]
    for i in range(0, len(sweep), 40):
        out.append(" ".join(f"a{c}b{c}1 {c}." for c in sweep[i : i + 40]))
    # random code points from many blocks
    for _ in range(400):
        out.append(_random_text(rng, rng.randint(1, 30)))
    # seeded random mixes of everything above
    pieces = _pieces()
    for _ in range(900):
        n = rng.randint(1, 12)
        seps = ["", " ", "  ", "\n", "\t", "\r\n", " \n "]
        out.append("".join(rng.choice(pieces) + rng.choice(seps) for _ in range(n)))
    # a few long documents
    for _ in range(6):
        out.append("".join(rng.choice(pieces) + rng.choice([" ", "\n", ""]) for _ in range(300)))
    out.append("")
    return out
