"""models.tokenizer on tiny hand-made vocabularies: the rules of llama.cpp's tokenizer, one at a time.

The expected ids are worked out by hand from llama.cpp's algorithms (src/llama-vocab.cpp); the real models
are compared with llama.cpp itself in test_tokenizer_llamacpp.py.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from edge.errors import TokenizerError
from edge.models.tokenizer import SUPPORTED_PRE_TOKENIZERS, Tokenizer, clean_spaces, load_tokenizer

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def byte_chars() -> list[str]:
    """GPT-2's printable character for each byte (written out here, independently of the module)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


B = byte_chars()  # the byte-level token of byte b has id b in the tiny BPE vocabulary
BPE_WORDS = ["he", "ll", "hell", "hello", "Ġw", "or", "Ġwor", "ld", "Ġworld", "að", "aá", "xy"]
BPE_MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "a ð", "a á", "x y"]
BPE_SPECIALS = [
    ("<|endoftext|>", CONTROL),
    ("<|im_start|>", CONTROL),
    ("<|im_end|>", NORMAL),  # llama.cpp makes it CONTROL and end-of-generation by its text
    ("<tool>", USER_DEFINED),
    ("yzw", USER_DEFINED),
    ("<|fim_pad|>", CONTROL),
    ("[unused]", UNUSED),
]


def tiny_bpe_meta(pre: str = "gpt-2", **overrides: Any) -> dict[str, Any]:
    tokens = [*B, *BPE_WORDS, *(t for t, _ in BPE_SPECIALS)]
    types = [NORMAL] * (256 + len(BPE_WORDS)) + [ty for _, ty in BPE_SPECIALS]
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array(types, dtype=np.int32),
        "tokenizer.ggml.merges": list(BPE_MERGES),
        "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
        "tokenizer.ggml.eos_token_id": tokens.index("<|endoftext|>"),
    }
    meta.update(overrides)
    return {k: v for k, v in meta.items() if v is not None}


@pytest.fixture(scope="module")
def bpe() -> Tokenizer:
    return load_tokenizer(tiny_bpe_meta())


def bid(tok: Tokenizer, text: str) -> int:
    tid = tok.token_to_id(text)
    assert tid is not None, text
    return tid


# ---- BPE ---------------------------------------------------------------------------------------------


def test_bpe_merges_and_byte_level(bpe: Tokenizer) -> None:
    assert bpe.vocab_size == 256 + len(BPE_WORDS) + len(BPE_SPECIALS)
    assert bpe.encode("hello world") == [bid(bpe, "hello"), bid(bpe, "Ġworld")]
    # no merge for "user": one byte token per byte; "\n" alone is its own pre-token
    assert bpe.encode("user\nhello") == [117, 115, 101, 114, 10, bid(bpe, "hello")]
    assert bpe.encode("héllo") == [104, 0xC3, 0xA9, bid(bpe, "ll"), 111]
    assert bpe.encode("") == []


@pytest.mark.parametrize("pre", sorted(SUPPORTED_PRE_TOKENIZERS))
def test_every_supported_pre_tokenizer_builds(pre: str) -> None:
    tok = load_tokenizer(tiny_bpe_meta(pre=pre))
    assert tok.pre == pre
    assert tok.encode("hello world") == [bid(tok, "hello"), bid(tok, "Ġworld")]


def test_bpe_special_tokens(bpe: Tokenizer) -> None:
    start, end, tool = bid(bpe, "<|im_start|>"), bid(bpe, "<|im_end|>"), bid(bpe, "<tool>")
    assert bpe.encode("<|im_start|>user\nhello<|im_end|>") == [
        start,
        117,
        115,
        101,
        114,
        10,
        bid(bpe, "hello"),
        end,
    ]
    # parse_special=False: control text is plain text, user-defined tokens are still split out
    assert bpe.encode("<|im_start|>", parse_special=False) == [
        60,
        124,
        105,
        109,
        95,
        115,
        116,
        97,
        114,
        116,
        124,
        62,
    ]
    assert bpe.encode("<tool>hello", parse_special=False) == [tool, bid(bpe, "hello")]
    # the longest special text is cut out first over the whole text, not leftmost-longest
    assert bpe.encode("xyzw") == [120, bid(bpe, "yzw")]
    assert bpe.encode("xy") == [bid(bpe, "xy")]


def test_bpe_add_special(bpe: Tokenizer) -> None:
    assert not bpe.add_bos and not bpe.add_eos  # gpt-2 defaults
    assert bpe.encode("hello", add_special=True) == [bid(bpe, "hello")]
    llama3 = load_tokenizer(tiny_bpe_meta(pre="llama-bpe"))
    assert llama3.add_bos  # llama.cpp turns it on for llama3 vocabularies
    assert llama3.encode("hello", add_special=True) == [bid(llama3, "<|endoftext|>"), bid(llama3, "hello")]
    both = load_tokenizer(tiny_bpe_meta(**{"tokenizer.ggml.add_eos_token": True}))
    assert both.encode("hello", add_special=True) == [bid(both, "hello"), bid(both, "<|endoftext|>")]


BARRIER_META: dict[str, Any] = {
    "tokenizer.ggml.model": "gpt2",
    "tokenizer.ggml.pre": "gpt-2",
    "tokenizer.ggml.tokens": [".", "/", "./"],
    "tokenizer.ggml.merges": [". /"],
}


def test_character_without_token_blocks_merges() -> None:
    # llama.cpp keeps such a character as an unmergeable symbol and drops it at the end (SmolLM2 lacks
    # tokens for some control bytes): "." and "/" must not merge across it.
    tok = load_tokenizer(BARRIER_META)
    assert tok.encode("./") == [2]
    assert tok.encode(".\x14/") == [0, 1]


def test_unicode_classes_are_llamacpps(bpe: Tokenizer) -> None:
    # U+1F00 is a letter for llama.cpp: "a" + its first byte merge inside one pre-token.
    assert bpe.encode("a\u1f00") == [bid(bpe, "aá"), 0xBC, 0x80]
    # U+105C0 (Todhri, Unicode 16) is unassigned in llama.cpp's tables: not a letter, so it starts a new
    # pre-token and "a" cannot merge with its first byte (Oniguruma alone would call it a letter).
    assert bpe.encode("a\U000105c0") == [97, 0xF0, 0x90, 0x97, 0x80]


def test_end_of_generation_ids(bpe: Tokenizer) -> None:
    eot, end, pad = bid(bpe, "<|endoftext|>"), bid(bpe, "<|im_end|>"), bid(bpe, "<|fim_pad|>")
    assert bpe.eos_id == eot and bpe.bos_id == eot
    assert bpe.eog_ids == frozenset({eot, end, pad})
    # <|im_end|> became a control token: hidden by skip_special, plain text without parse_special
    assert bpe.decode([end]) == "<|im_end|>"
    assert bpe.decode([end], skip_special=True) == ""
    assert bpe.encode("<|im_end|>", parse_special=False)[0] == 60


def test_bpe_decode_and_token_bytes(bpe: Tokenizer) -> None:
    ids = bpe.encode("hello world <|im_start|>é<tool>")
    assert bpe.decode(ids) == "hello world <|im_start|>é<tool>"
    assert bpe.decode(ids, skip_special=True) == "hello world é<tool>"  # user-defined text always shows
    assert bpe.token_bytes(32) == b" "
    assert bpe.token_bytes(bid(bpe, "Ġworld")) == b" world"
    assert bpe.token_bytes(bid(bpe, "<|im_start|>")) == b"<|im_start|>"
    assert bpe.token_bytes(bid(bpe, "[unused]")) == b""  # unused tokens have no text in llama.cpp
    assert bpe.decode([0xE4, 0xB8]) == "\ufffd"  # a cut UTF-8 sequence is replaced, as bytes.decode does
    assert bpe.decode_bytes([0xE4, 0xB8]) == b"\xe4\xb8"


def test_clean_spaces_only_where_llamacpp_cleans() -> None:
    ids = [104, 32, 63, 32, 39, 115]  # "h ? 's"
    assert load_tokenizer(tiny_bpe_meta(pre="gpt-2")).decode(ids) == "h?'s"
    assert load_tokenizer(tiny_bpe_meta(pre="qwen2")).decode(ids) == "h ? 's"


def _clean_spaces_c(text: bytes) -> bytes:
    """The three loops of llama_vocab::impl::detokenize, transcribed one to one."""
    t = bytearray(text)
    total = len(t)
    if total:
        out = 1
        for i in range(1, total):
            x = t[i]
            if t[i - 1] == 32 and x in b"?!.,":
                out -= 1
            t[out] = x
            out += 1
        total = out
    if total:
        out, i = 1, 1
        while i < total:
            x = t[i]
            if x == 39 and i + 1 < total and t[i - 1] == 32 and t[i + 1] == 32:
                out -= 1
                i += 1
                t[i] = 0
            t[out] = x
            out += 1
            i += 1
        total = out
    if total:
        out = 1
        for i in range(1, total):
            x = t[i]
            if t[i - 1] == 32 and x == 39 and i + 1 < total:
                x1 = t[i + 1]
                if x1 in b"sm" or (i + 2 < total and bytes(t[i + 1 : i + 3]) in (b"re", b"ve")):
                    out -= 1
            t[out] = x
            out += 1
        total = out
    return bytes(t[:total])


def test_clean_spaces_equals_llamacpp_loops() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        text = bytes(rng.choice(b"  '''smrevl?!.,xd") for _ in range(rng.randint(0, 14)))
        assert clean_spaces(text) == _clean_spaces_c(text), text


# ---- streaming ---------------------------------------------------------------------------------------


def streamed(tok: Tokenizer, ids: list[int], *, skip_special: bool = False) -> list[str]:
    stream = tok.stream(skip_special=skip_special)
    return [stream.push(i) for i in ids] + [stream.flush()]


def test_stream_waits_for_whole_characters(bpe: Tokenizer) -> None:
    thumbs = list("👍".encode())  # byte-level tokens: the id of a byte is the byte
    assert streamed(bpe, thumbs) == ["", "", "", "👍", ""]
    han = list("中".encode())
    assert streamed(bpe, [104, *han, *thumbs, 105]) == ["h", "", "", "中", "", "", "", "👍", "i", ""]
    # a cut sequence comes out once it is known to be broken, as decode() replaces it
    assert streamed(bpe, [0xE4, 0xB8, 0x41]) == ["", "", "\ufffdA", ""]
    assert streamed(bpe, [0xE4, 0xB8]) == ["", "", "\ufffd"]


def test_stream_holds_back_what_clean_spaces_may_change() -> None:
    tok = load_tokenizer(tiny_bpe_meta(pre="gpt-2"))
    parts = streamed(tok, [105, 116, 32, 39, 115])  # "it 's" -> "it's"
    assert "".join(parts) == "it's" == tok.decode([105, 116, 32, 39, 115])
    assert parts[1] == "t" and parts[2] == ""  # the space waits: it may be removed


@pytest.mark.parametrize("pre", ["gpt-2", "qwen2"])
def test_stream_equals_decode_on_random_ids(pre: str) -> None:
    tok = load_tokenizer(tiny_bpe_meta(pre=pre))
    pool = [
        *"héllo 中文 👍🏽 it's ' ?!.,".encode(),
        0xFF,
        0x80,
        *(bid(tok, t) for t in ("Ġworld", "<|im_start|>", "<|im_end|>", "<tool>", "[unused]")),
    ]
    rng = random.Random(pre)
    for _ in range(400):
        ids = [rng.choice(pool) for _ in range(rng.randint(0, 30))]
        for skip in (False, True):
            assert "".join(streamed(tok, ids, skip_special=skip)) == tok.decode(ids, skip_special=skip), ids


# ---- SentencePiece -----------------------------------------------------------------------------------

SPM_WORDS = [  # (text, score)
    ("▁", -10.0),
    ("h", -20.0),
    ("e", -21.0),
    ("l", -22.0),
    ("o", -23.0),
    ("w", -24.0),
    ("r", -25.0),
    ("d", -26.0),
    ("a", -27.0),
    ("b", -28.0),
    ("▁h", -5.0),
    ("he", -3.0),
    ("ll", -2.0),
    ("llo", -4.0),
    ("hello", -6.0),
    ("▁hello", -1.0),
    ("▁w", -7.0),
    ("or", -8.0),
    ("▁wor", -9.0),
    ("ld", -9.5),
    ("▁world", -0.5),
    ("ab", -11.0),
    ("ba", -11.0),
]


def tiny_spm_meta(**overrides: Any) -> dict[str, Any]:
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *(t for t, _ in SPM_WORDS)]
    types = [UNKNOWN, CONTROL, CONTROL, *([BYTE] * 256), *([NORMAL] * len(SPM_WORDS))]
    scores = [0.0, 0.0, 0.0, *([0.0] * 256), *(s for _, s in SPM_WORDS)]
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array(types, dtype=np.int32),
        "tokenizer.ggml.scores": np.array(scores, dtype=np.float32),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }
    meta.update(overrides)
    return {k: v for k, v in meta.items() if v is not None}


@pytest.fixture(scope="module")
def spm() -> Tokenizer:
    return load_tokenizer(tiny_spm_meta())


def sid(tok: Tokenizer, text: str) -> int:
    return bid(tok, text)


def test_spm_merges_by_score(spm: Tokenizer) -> None:
    assert spm.add_space_prefix and spm.add_bos and not spm.add_eos  # llama.cpp's SPM defaults
    assert spm.encode("hello world") == [sid(spm, "▁hello"), sid(spm, "▁world")]
    assert spm.encode("hello world", add_special=True) == [1, sid(spm, "▁hello"), sid(spm, "▁world")]


def test_spm_ties_go_to_the_leftmost_pair() -> None:
    no_prefix = {"tokenizer.ggml.add_space_prefix": False}
    tok = load_tokenizer(tiny_spm_meta(**no_prefix))
    # "ab" and "ba" score the same: the leftmost pair wins, whichever token it makes (ranked BPE merges
    # would put one token first everywhere)
    assert tok.encode("aba") == [sid(tok, "ab"), sid(tok, "a")]
    assert tok.encode("bab") == [sid(tok, "ba"), sid(tok, "b")]
    scores = np.array(tiny_spm_meta()["tokenizer.ggml.scores"])
    scores[tok.token_to_id("ba")] = -10.5
    better_ba = load_tokenizer(tiny_spm_meta(**no_prefix, **{"tokenizer.ggml.scores": scores}))
    assert better_ba.encode("aba") == [sid(tok, "a"), sid(tok, "ba")]


def test_spm_byte_fallback(spm: Tokenizer) -> None:
    emoji = [3 + b for b in "😀".encode()]  # <0xF0> <0x9F> <0x98> <0x80>
    assert spm.encode("hi😀") == [sid(spm, "▁h"), 3 + ord("i"), *emoji]
    assert spm.token_bytes(3 + 0x41) == b"A"
    assert streamed(spm, emoji) == ["", "", "", "😀", ""]


def test_spm_space_prefix_after_special_tokens(spm: Tokenizer) -> None:
    hello = sid(spm, "▁hello")
    assert spm.encode("hello</s>hello") == [hello, 2, hello]
    no_prefix = load_tokenizer(tiny_spm_meta(**{"tokenizer.ggml.add_space_prefix": False}))
    assert no_prefix.encode("hello") == [sid(no_prefix, "hello")]


def test_spm_decode(spm: Tokenizer) -> None:
    ids = spm.encode("hello world")
    assert spm.token_bytes(ids[0]) == b" hello"
    assert spm.decode(ids) == "hello world"  # the leading space of the first piece goes
    assert "".join(streamed(spm, ids)) == "hello world"
    # only the very first piece loses its space, even when it is a hidden BOS (llama_detokenize)
    assert spm.decode([1, *ids]) == "<s> hello world"
    assert spm.decode([1, 0, *ids], skip_special=True) == " hello world"
    assert spm.decode([1, 0, *ids]) == "<s><unk> hello world"


# ---- metadata that cannot make a tokenizer -----------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tokenizer.ggml.model": None}, "tokenizer.ggml.model is missing"),
        ({"tokenizer.ggml.model": 3}, "should be a string"),
        ({"tokenizer.ggml.model": "t5"}, "'t5' is not supported"),
        ({"tokenizer.ggml.pre": "nonsense"}, "unknown pre-tokenizer 'nonsense'"),
        ({"tokenizer.ggml.pre": 1}, "tokenizer.ggml.pre is not a string"),
        ({"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens is missing"),
        ({"tokenizer.ggml.tokens": "abc"}, "not a list of strings"),
        ({"tokenizer.ggml.tokens": []}, "not a list of strings"),
        ({"tokenizer.ggml.tokens": [*B, *BPE_WORDS, "x", "x", 5, 6, 7, 8, 9]}, "not a list of strings"),
        ({"tokenizer.ggml.token_type": np.ones(5, dtype=np.int32)}, "has 5 entries for"),
        ({"tokenizer.ggml.token_type": np.ones((2, 300), dtype=np.int32)}, "1-D integer array"),
        ({"tokenizer.ggml.token_type": np.ones(300, dtype=np.float32)}, "1-D integer array"),
        ({"tokenizer.ggml.scores": ["a"] * 300}, "1-D numeric array"),
        ({"tokenizer.ggml.merges": None}, "merges is missing"),
        (
            {"tokenizer.ggml.merges": ["h e", "q z"]},
            "merge 'q z' refers to text that is not in the vocabulary",
        ),
        ({"tokenizer.ggml.bos_token_id": 10_000}, "bos_token_id = 10000 is outside the vocabulary"),
        ({"tokenizer.ggml.eos_token_id": -1}, "eos_token_id = -1 is outside the vocabulary"),
        ({"tokenizer.ggml.eos_token_id": "2"}, "should be an integer, not str"),
        ({"tokenizer.ggml.eos_token_id": True}, "should be an integer, not bool"),
        ({"tokenizer.ggml.add_bos_token": "yes"}, "add_bos_token should be a bool"),
    ],
)
def test_bad_metadata_raises_tokenizer_error(change: dict[str, Any], message: str) -> None:
    meta = tiny_bpe_meta()
    meta.update(change)
    meta = {k: v for k, v in meta.items() if v is not None}
    with pytest.raises(TokenizerError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_tokenizer(meta)


def test_bos_asked_for_but_missing() -> None:
    meta = dict(BARRIER_META)
    assert load_tokenizer(meta).bos_id is None  # llama.cpp's default BPE BOS, id 11, is outside
    with pytest.raises(TokenizerError, match="asks for a BOS token but has no BOS id"):
        load_tokenizer({**meta, "tokenizer.ggml.add_bos_token": True})
    assert load_tokenizer(tiny_bpe_meta(**{"tokenizer.ggml.bos_token_id": None})).bos_id == 11


def test_unknown_pre_tokenizer_names_the_supported_ones() -> None:
    with pytest.raises(TokenizerError) as err:
        load_tokenizer(tiny_bpe_meta(pre="nonsense"))
    assert err.value.hint is not None
    for name in ("default", "llama-bpe", "qwen2", "smollm", "gpt-2", "starcoder", "deepseek-llm"):
        assert name in err.value.hint


def test_duplicate_token_text_is_refused() -> None:
    tokens = ["<unk>", "<s>", "</s>", "a", "a"]
    with pytest.raises(TokenizerError, match="same text twice"):
        load_tokenizer({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens})


def test_bad_calls_raise_tokenizer_error(bpe: Tokenizer) -> None:
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        bpe.decode([bpe.vocab_size])
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        bpe.token_bytes(-1)
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        bpe.stream().push(10**9)
    with pytest.raises(TokenizerError, match="takes a str"):
        bpe.encode(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(TokenizerError, match="lone surrogate"):
        bpe.encode("a\udc80b")
    with pytest.raises(TypeError):
        Tokenizer()


def test_spm_missing_byte_token_is_a_tokenizer_error() -> None:
    tokens = ["<unk>", "<s>", "</s>", "▁", "a"]
    tok = load_tokenizer({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens})
    assert tok.encode("a") == [3, 4]
    with pytest.raises(TokenizerError, match="no byte token <0xC3>"):
        tok.encode("é")
