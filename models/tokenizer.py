"""The tokenizer of a GGUF model, built from its metadata, giving the same token ids as llama.cpp.

llama.cpp (src/llama-vocab.cpp, as vendored by llama-cpp-python 0.3.36) is the reference: every rule
below mirrors a rule there, and tests/models/test_tokenizer_llamacpp.py compares the two on a large corpus.

* BPE (`tokenizer.ggml.model = gpt2`): llama.cpp splits the text with the regex list of its pre-tokenizer
  type, maps bytes to GPT-2 byte characters and applies the ranked merges. Here that is a HuggingFace
  `tokenizers` BPE behind a Sequence of Split(isolated) + ByteLevel(use_regex=False). The regexes name
  Unicode classes (\\p{L}, \\p{N}, \\p{P}); llama.cpp takes them from its own tables (unicode-data.cpp),
  while Oniguruma knows code points assigned later, so the classes are spelled out from llama.cpp's tables.
* SentencePiece (`llama`): llama.cpp's SPM merges, over the whole fragment, the adjacent pair whose
  concatenation is the best-scored token, the leftmost on ties. A BPE with ranked merges cannot break ties
  by position between different pairs giving one token (`--`+`-` vs `-`+`--`), so this runs the same
  algorithm in Python.
* Special tokens: llama.cpp cuts CONTROL, USER_DEFINED and UNKNOWN tokens out of the raw text first,
  longest text first over the whole text (not leftmost-longest); CONTROL and UNKNOWN ones only when
  parse_special. Ported as is.
* Decoding follows llama_detokenize(remove_special=false): per-token pieces, the SPM leading space removed
  from the first piece, and the `clean_spaces` passes of BPE vocabularies that have them.
"""

from __future__ import annotations

import codecs
import heapq
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge.errors import TokenizerError

# llama.h token types (GGUF tokenizer.ggml.token_type) and the attributes llama.cpp derives from them.
_TYPE_NORMAL, _TYPE_UNKNOWN, _TYPE_CONTROL, _TYPE_USER_DEFINED, _TYPE_UNUSED, _TYPE_BYTE = 1, 2, 3, 4, 5, 6
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8
_TYPE_TO_ATTR = np.zeros(7, dtype=np.int32)  # any other type value is LLAMA_TOKEN_ATTR_UNDEFINED (0)
_TYPE_TO_ATTR[[_TYPE_NORMAL, _TYPE_UNKNOWN, _TYPE_CONTROL, _TYPE_USER_DEFINED, _TYPE_UNUSED, _TYPE_BYTE]] = [
    ATTR_NORMAL,
    ATTR_UNKNOWN,
    ATTR_CONTROL,
    ATTR_USER_DEFINED,
    ATTR_UNUSED,
    ATTR_BYTE,
]
_SPECIAL_ATTRS = ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN
_C_SPACES = " \t\n\v\f\r"  # C isspace() in the "C" locale: what LSTRIP/RSTRIP strip

# Texts llama.cpp treats as end of turn / end of generation whatever their type (llama-vocab.cpp load()).
_EOT_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
)
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}  # fmt: skip
_EOG_TEXTS = frozenset(
    {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
        "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
        "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
        "<｜end▁of▁sentence｜>", "[e~[",
    }
)  # fmt: skip

_SPECIAL_ID_KEYS = (  # (role, GGUF key); later keys of one role override earlier ones, as in llama.cpp
    ("bos", "tokenizer.ggml.bos_token_id"),
    ("eos", "tokenizer.ggml.eos_token_id"),
    ("eot", "tokenizer.ggml.eot_token_id"),
    ("eom", "tokenizer.ggml.eom_token_id"),
    ("unk", "tokenizer.ggml.unknown_token_id"),
    ("sep", "tokenizer.ggml.seperator_token_id"),  # sic: the GGUF key is spelled this way
    ("pad", "tokenizer.ggml.padding_token_id"),
    ("mask", "tokenizer.ggml.mask_token_id"),
    ("fim_pre", "tokenizer.ggml.fim_pre_token_id"),
    ("fim_suf", "tokenizer.ggml.fim_suf_token_id"),
    ("fim_mid", "tokenizer.ggml.fim_mid_token_id"),
    ("fim_pad", "tokenizer.ggml.fim_pad_token_id"),
    ("fim_rep", "tokenizer.ggml.fim_rep_token_id"),
    ("fim_sep", "tokenizer.ggml.fim_sep_token_id"),
    ("fim_pre", "tokenizer.ggml.prefix_token_id"),
    ("fim_suf", "tokenizer.ggml.suffix_token_id"),
    ("fim_mid", "tokenizer.ggml.middle_token_id"),
)

# llama.cpp's Unicode categories (unicode-data.cpp of llama-cpp-python 0.3.36), as hex code point ranges.
# Oniguruma (inside `tokenizers`) has a newer Unicode: ~4,300 letters and ~80 digits it knows are
# unassigned for llama.cpp, so \p{L} / \p{N} / \p{P} cannot be used as they are.
_RANGES_L = (
    "41-5a 61-7a aa b5 ba c0-d6 d8-f6 f8-2c1 2c6-2d1 2e0-2e4 2ec 2ee 370-374 376-377 37a-37d 37f 386 "
    "388-38a 38c 38e-3a1 3a3-3f5 3f7-481 48a-52f 531-556 559 560-588 5d0-5ea 5ef-5f2 620-64a 66e-66f "
    "671-6d3 6d5 6e5-6e6 6ee-6ef 6fa-6fc 6ff 710 712-72f 74d-7a5 7b1 7ca-7ea 7f4-7f5 7fa 800-815 81a "
    "824 828 840-858 860-86a 870-887 889-88e 8a0-8c9 904-939 93d 950 958-961 971-980 985-98c 98f-990 "
    "993-9a8 9aa-9b0 9b2 9b6-9b9 9bd 9ce 9dc-9dd 9df-9e1 9f0-9f1 9fc a05-a0a a0f-a10 a13-a28 a2a-a30 "
    "a32-a33 a35-a36 a38-a39 a59-a5c a5e a72-a74 a85-a8d a8f-a91 a93-aa8 aaa-ab0 ab2-ab3 ab5-ab9 abd "
    "ad0 ae0-ae1 af9 b05-b0c b0f-b10 b13-b28 b2a-b30 b32-b33 b35-b39 b3d b5c-b5d b5f-b61 b71 b83 "
    "b85-b8a b8e-b90 b92-b95 b99-b9a b9c b9e-b9f ba3-ba4 ba8-baa bae-bb9 bd0 c05-c0c c0e-c10 c12-c28 "
    "c2a-c39 c3d c58-c5a c5d c60-c61 c80 c85-c8c c8e-c90 c92-ca8 caa-cb3 cb5-cb9 cbd cdd-cde ce0-ce1 "
    "cf1-cf2 d04-d0c d0e-d10 d12-d3a d3d d4e d54-d56 d5f-d61 d7a-d7f d85-d96 d9a-db1 db3-dbb dbd "
    "dc0-dc6 e01-e30 e32-e33 e40-e46 e81-e82 e84 e86-e8a e8c-ea3 ea5 ea7-eb0 eb2-eb3 ebd ec0-ec4 ec6 "
    "edc-edf f00 f40-f47 f49-f6c f88-f8c 1000-102a 103f 1050-1055 105a-105d 1061 1065-1066 106e-1070 "
    "1075-1081 108e 10a0-10c5 10c7 10cd 10d0-10fa 10fc-1248 124a-124d 1250-1256 1258 125a-125d "
    "1260-1288 128a-128d 1290-12b0 12b2-12b5 12b8-12be 12c0 12c2-12c5 12c8-12d6 12d8-1310 1312-1315 "
    "1318-135a 1380-138f 13a0-13f5 13f8-13fd 1401-166c 166f-167f 1681-169a 16a0-16ea 16f1-16f8 "
    "1700-1711 171f-1731 1740-1751 1760-176c 176e-1770 1780-17b3 17d7 17dc 1820-1878 1880-1884 "
    "1887-18a8 18aa 18b0-18f5 1900-191e 1950-196d 1970-1974 1980-19ab 19b0-19c9 1a00-1a16 1a20-1a54 "
    "1aa7 1b05-1b33 1b45-1b4c 1b83-1ba0 1bae-1baf 1bba-1be5 1c00-1c23 1c4d-1c4f 1c5a-1c7d 1c80-1c88 "
    "1c90-1cba 1cbd-1cbf 1ce9-1cec 1cee-1cf3 1cf5-1cf6 1cfa 1d00-1dbf 1e00-1f15 1f18-1f1d 1f20-1f45 "
    "1f48-1f4d 1f50-1f57 1f59 1f5b 1f5d 1f5f-1f7d 1f80-1fb4 1fb6-1fbc 1fbe 1fc2-1fc4 1fc6-1fcc "
    "1fd0-1fd3 1fd6-1fdb 1fe0-1fec 1ff2-1ff4 1ff6-1ffc 2071 207f 2090-209c 2102 2107 210a-2113 2115 "
    "2119-211d 2124 2126 2128 212a-212d 212f-2139 213c-213f 2145-2149 214e 2183-2184 2c00-2ce4 "
    "2ceb-2cee 2cf2-2cf3 2d00-2d25 2d27 2d2d 2d30-2d67 2d6f 2d80-2d96 2da0-2da6 2da8-2dae 2db0-2db6 "
    "2db8-2dbe 2dc0-2dc6 2dc8-2dce 2dd0-2dd6 2dd8-2dde 2e2f 3005-3006 3031-3035 303b-303c 3041-3096 "
    "309d-309f 30a1-30fa 30fc-30ff 3105-312f 3131-318e 31a0-31bf 31f0-31ff 3400-4dbf 4e00-a48c "
    "a4d0-a4fd a500-a60c a610-a61f a62a-a62b a640-a66e a67f-a69d a6a0-a6e5 a717-a71f a722-a788 "
    "a78b-a7ca a7d0-a7d1 a7d3 a7d5-a7d9 a7f2-a801 a803-a805 a807-a80a a80c-a822 a840-a873 a882-a8b3 "
    "a8f2-a8f7 a8fb a8fd-a8fe a90a-a925 a930-a946 a960-a97c a984-a9b2 a9cf a9e0-a9e4 a9e6-a9ef "
    "a9fa-a9fe aa00-aa28 aa40-aa42 aa44-aa4b aa60-aa76 aa7a aa7e-aaaf aab1 aab5-aab6 aab9-aabd aac0 "
    "aac2 aadb-aadd aae0-aaea aaf2-aaf4 ab01-ab06 ab09-ab0e ab11-ab16 ab20-ab26 ab28-ab2e ab30-ab5a "
    "ab5c-ab69 ab70-abe2 ac00-d7a3 d7b0-d7c6 d7cb-d7fb f900-fa6d fa70-fad9 fb00-fb06 fb13-fb17 fb1d "
    "fb1f-fb28 fb2a-fb36 fb38-fb3c fb3e fb40-fb41 fb43-fb44 fb46-fbb1 fbd3-fd3d fd50-fd8f fd92-fdc7 "
    "fdf0-fdfb fe70-fe74 fe76-fefc ff21-ff3a ff41-ff5a ff66-ffbe ffc2-ffc7 ffca-ffcf ffd2-ffd7 "
    "ffda-ffdc 10000-1000b 1000d-10026 10028-1003a 1003c-1003d 1003f-1004d 10050-1005d 10080-100fa "
    "10280-1029c 102a0-102d0 10300-1031f 1032d-10340 10342-10349 10350-10375 10380-1039d 103a0-103c3 "
    "103c8-103cf 10400-1049d 104b0-104d3 104d8-104fb 10500-10527 10530-10563 10570-1057a 1057c-1058a "
    "1058c-10592 10594-10595 10597-105a1 105a3-105b1 105b3-105b9 105bb-105bc 10600-10736 10740-10755 "
    "10760-10767 10780-10785 10787-107b0 107b2-107ba 10800-10805 10808 1080a-10835 10837-10838 1083c "
    "1083f-10855 10860-10876 10880-1089e 108e0-108f2 108f4-108f5 10900-10915 10920-10939 10980-109b7 "
    "109be-109bf 10a00 10a10-10a13 10a15-10a17 10a19-10a35 10a60-10a7c 10a80-10a9c 10ac0-10ac7 "
    "10ac9-10ae4 10b00-10b35 10b40-10b55 10b60-10b72 10b80-10b91 10c00-10c48 10c80-10cb2 10cc0-10cf2 "
    "10d00-10d23 10e80-10ea9 10eb0-10eb1 10f00-10f1c 10f27 10f30-10f45 10f70-10f81 10fb0-10fc4 "
    "10fe0-10ff6 11003-11037 11071-11072 11075 11083-110af 110d0-110e8 11103-11126 11144 11147 "
    "11150-11172 11176 11183-111b2 111c1-111c4 111da 111dc 11200-11211 11213-1122b 1123f-11240 "
    "11280-11286 11288 1128a-1128d 1128f-1129d 1129f-112a8 112b0-112de 11305-1130c 1130f-11310 "
    "11313-11328 1132a-11330 11332-11333 11335-11339 1133d 11350 1135d-11361 11400-11434 11447-1144a "
    "1145f-11461 11480-114af 114c4-114c5 114c7 11580-115ae 115d8-115db 11600-1162f 11644 11680-116aa "
    "116b8 11700-1171a 11740-11746 11800-1182b 118a0-118df 118ff-11906 11909 1190c-11913 11915-11916 "
    "11918-1192f 1193f 11941 119a0-119a7 119aa-119d0 119e1 119e3 11a00 11a0b-11a32 11a3a 11a50 "
    "11a5c-11a89 11a9d 11ab0-11af8 11c00-11c08 11c0a-11c2e 11c40 11c72-11c8f 11d00-11d06 11d08-11d09 "
    "11d0b-11d30 11d46 11d60-11d65 11d67-11d68 11d6a-11d89 11d98 11ee0-11ef2 11f02 11f04-11f10 "
    "11f12-11f33 11fb0 12000-12399 12480-12543 12f90-12ff0 13000-1342f 13441-13446 14400-14646 "
    "16800-16a38 16a40-16a5e 16a70-16abe 16ad0-16aed 16b00-16b2f 16b40-16b43 16b63-16b77 16b7d-16b8f "
    "16e40-16e7f 16f00-16f4a 16f50 16f93-16f9f 16fe0-16fe1 16fe3 17000-187f7 18800-18cd5 18d00-18d08 "
    "1aff0-1aff3 1aff5-1affb 1affd-1affe 1b000-1b122 1b132 1b150-1b152 1b155 1b164-1b167 1b170-1b2fb "
    "1bc00-1bc6a 1bc70-1bc7c 1bc80-1bc88 1bc90-1bc99 1d400-1d454 1d456-1d49c 1d49e-1d49f 1d4a2 "
    "1d4a5-1d4a6 1d4a9-1d4ac 1d4ae-1d4b9 1d4bb 1d4bd-1d4c3 1d4c5-1d505 1d507-1d50a 1d50d-1d514 "
    "1d516-1d51c 1d51e-1d539 1d53b-1d53e 1d540-1d544 1d546 1d54a-1d550 1d552-1d6a5 1d6a8-1d6c0 "
    "1d6c2-1d6da 1d6dc-1d6fa 1d6fc-1d714 1d716-1d734 1d736-1d74e 1d750-1d76e 1d770-1d788 1d78a-1d7a8 "
    "1d7aa-1d7c2 1d7c4-1d7cb 1df00-1df1e 1df25-1df2a 1e030-1e06d 1e100-1e12c 1e137-1e13d 1e14e "
    "1e290-1e2ad 1e2c0-1e2eb 1e4d0-1e4eb 1e7e0-1e7e6 1e7e8-1e7eb 1e7ed-1e7ee 1e7f0-1e7fe 1e800-1e8c4 "
    "1e900-1e943 1e94b 1ee00-1ee03 1ee05-1ee1f 1ee21-1ee22 1ee24 1ee27 1ee29-1ee32 1ee34-1ee37 1ee39 "
    "1ee3b 1ee42 1ee47 1ee49 1ee4b 1ee4d-1ee4f 1ee51-1ee52 1ee54 1ee57 1ee59 1ee5b 1ee5d 1ee5f "
    "1ee61-1ee62 1ee64 1ee67-1ee6a 1ee6c-1ee72 1ee74-1ee77 1ee79-1ee7c 1ee7e 1ee80-1ee89 1ee8b-1ee9b "
    "1eea1-1eea3 1eea5-1eea9 1eeab-1eebb 20000-2a6df 2a700-2b739 2b740-2b81d 2b820-2cea1 2ceb0-2ebe0 "
    "2ebf0-2ee5d 2f800-2fa1d 30000-3134a 31350-323af "
)
_RANGES_N = (
    "30-39 b2-b3 b9 bc-be 660-669 6f0-6f9 7c0-7c9 966-96f 9e6-9ef 9f4-9f9 a66-a6f ae6-aef b66-b6f "
    "b72-b77 be6-bf2 c66-c6f c78-c7e ce6-cef d58-d5e d66-d78 de6-def e50-e59 ed0-ed9 f20-f33 "
    "1040-1049 1090-1099 1369-137c 16ee-16f0 17e0-17e9 17f0-17f9 1810-1819 1946-194f 19d0-19da "
    "1a80-1a89 1a90-1a99 1b50-1b59 1bb0-1bb9 1c40-1c49 1c50-1c59 2070 2074-2079 2080-2089 2150-2182 "
    "2185-2189 2460-249b 24ea-24ff 2776-2793 2cfd 3007 3021-3029 3038-303a 3192-3195 3220-3229 "
    "3248-324f 3251-325f 3280-3289 32b1-32bf a620-a629 a6e6-a6ef a830-a835 a8d0-a8d9 a900-a909 "
    "a9d0-a9d9 a9f0-a9f9 aa50-aa59 abf0-abf9 ff10-ff19 10107-10133 10140-10178 1018a-1018b "
    "102e1-102fb 10320-10323 10341 1034a 103d1-103d5 104a0-104a9 10858-1085f 10879-1087f 108a7-108af "
    "108fb-108ff 10916-1091b 109bc-109bd 109c0-109cf 109d2-109ff 10a40-10a48 10a7d-10a7e 10a9d-10a9f "
    "10aeb-10aef 10b58-10b5f 10b78-10b7f 10ba9-10baf 10cfa-10cff 10d30-10d39 10e60-10e7e 10f1d-10f26 "
    "10f51-10f54 10fc5-10fcb 11052-1106f 110f0-110f9 11136-1113f 111d0-111d9 111e1-111f4 112f0-112f9 "
    "11450-11459 114d0-114d9 11650-11659 116c0-116c9 11730-1173b 118e0-118f2 11950-11959 11c50-11c6c "
    "11d50-11d59 11da0-11da9 11f50-11f59 11fc0-11fd4 12400-1246e 16a60-16a69 16ac0-16ac9 16b50-16b59 "
    "16b5b-16b61 16e80-16e96 1d2c0-1d2d3 1d2e0-1d2f3 1d360-1d378 1d7ce-1d7ff 1e140-1e149 1e2f0-1e2f9 "
    "1e4f0-1e4f9 1e8c7-1e8cf 1e950-1e959 1ec71-1ecab 1ecad-1ecaf 1ecb1-1ecb4 1ed01-1ed2d 1ed2f-1ed3d "
    "1f100-1f10c 1fbf0-1fbf9 "
)
_RANGES_P = (
    "21-23 25-2a 2c-2f 3a-3b 3f-40 5b-5d 5f 7b 7d a1 a7 ab b6-b7 bb bf 37e 387 55a-55f 589-58a 5be "
    "5c0 5c3 5c6 5f3-5f4 609-60a 60c-60d 61b 61d-61f 66a-66d 6d4 700-70d 7f7-7f9 830-83e 85e 964-965 "
    "970 9fd a76 af0 c77 c84 df4 e4f e5a-e5b f04-f12 f14 f3a-f3d f85 fd0-fd4 fd9-fda 104a-104f 10fb "
    "1360-1368 1400 166e 169b-169c 16eb-16ed 1735-1736 17d4-17d6 17d8-17da 1800-180a 1944-1945 "
    "1a1e-1a1f 1aa0-1aa6 1aa8-1aad 1b5a-1b60 1b7d-1b7e 1bfc-1bff 1c3b-1c3f 1c7e-1c7f 1cc0-1cc7 1cd3 "
    "2010-2027 2030-2043 2045-2051 2053-205e 207d-207e 208d-208e 2308-230b 2329-232a 2768-2775 "
    "27c5-27c6 27e6-27ef 2983-2998 29d8-29db 29fc-29fd 2cf9-2cfc 2cfe-2cff 2d70 2e00-2e2e 2e30-2e4f "
    "2e52-2e5d 3001-3003 3008-3011 3014-301f 3030 303d 30a0 30fb a4fe-a4ff a60d-a60f a673 a67e "
    "a6f2-a6f7 a874-a877 a8ce-a8cf a8f8-a8fa a8fc a92e-a92f a95f a9c1-a9cd a9de-a9df aa5c-aa5f "
    "aade-aadf aaf0-aaf1 abeb fd3e-fd3f fe10-fe19 fe30-fe52 fe54-fe61 fe63 fe68 fe6a-fe6b ff01-ff03 "
    "ff05-ff0a ff0c-ff0f ff1a-ff1b ff1f-ff20 ff3b-ff3d ff3f ff5b ff5d ff5f-ff65 10100-10102 1039f "
    "103d0 1056f 10857 1091f 1093f 10a50-10a58 10a7f 10af0-10af6 10b39-10b3f 10b99-10b9c 10ead "
    "10f55-10f59 10f86-10f89 11047-1104d 110bb-110bc 110be-110c1 11140-11143 11174-11175 111c5-111c8 "
    "111cd 111db 111dd-111df 11238-1123d 112a9 1144b-1144f 1145a-1145b 1145d 114c6 115c1-115d7 "
    "11641-11643 11660-1166c 116b9 1173c-1173e 1183b 11944-11946 119e2 11a3f-11a46 11a9a-11a9c "
    "11a9e-11aa2 11b00-11b09 11c41-11c45 11c70-11c71 11ef7-11ef8 11f43-11f4f 11fff 12470-12474 "
    "12ff1-12ff2 16a6e-16a6f 16af5 16b37-16b3b 16b44 16e97-16e9a 16fe2 1bc9f 1da87-1da8b 1e95e-1e95f "
)


def _class_body(ranges: str) -> str:
    out = []
    for item in ranges.split():
        lo, _, hi = item.partition("-")
        out.append(f"\\x{{{lo}}}-\\x{{{hi}}}" if hi else f"\\x{{{lo}}}")
    return "".join(out)


_CLASS = {"L": _class_body(_RANGES_L), "N": _class_body(_RANGES_N), "P": _class_body(_RANGES_P)}
# Non-ASCII white space: llama.cpp turns it into \x0B before std::wregex runs (unicode_regex_split), so an
# explicit non-ASCII range in a class without \s never matches it.
_NON_ASCII_WS = "\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"


def _onig(pattern: str) -> str:
    """llama.cpp regex (std::regex ECMAScript) -> Oniguruma: \\p{X} spelled out, `$` = end of text."""
    out: list[str] = []
    inside = False
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and pattern.startswith("\\p{", i):
            name = pattern[i + 3 : pattern.index("}", i)]
            body = _CLASS[name]
            out.append(body if inside else f"[{body}]")
            i = pattern.index("}", i) + 1
            continue
        if c == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if c == "[" and not inside:
            inside = True
        elif c == "]" and inside:
            inside = False
        elif c == "$" and not inside:
            c = "\\z"  # ECMAScript `$` without multiline is the end of the input; Oniguruma's is end of line
        out.append(c)
        i += 1
    return "".join(out)


# The regex lists of llm_tokenizer_bpe (llama-vocab.cpp), one per llama.cpp pre-tokenizer type.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# gpt-4o / llama4 (Phi-4-mini): llama.cpp's rewrite of the o200k regex, case classes as lookaheads
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_BLOOM = r" ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+"
# The deepseek classes below run through std::wregex, where non-ASCII white space never reaches a range.
# Non-ASCII characters are written as escapes: an editor's Unicode normalization would silently change
# some of them (U+212A KELVIN SIGN -> K, U+2126 OHM SIGN -> Ω, ...).
_CJK = f"[[\\x{{4E00}}-\\x{{9FA5}}\\x{{800}}-\\x{{4E00}}\\x{{AC00}}-\\x{{D7FF}}]&&[^{_NON_ASCII_WS}]]+"
_REGEXES: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gpt2": (_GPT2,),
    "starcoder": (r"\p{N}", _GPT2),
    "llama3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "gpt4o": (_GPT4O,),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"),
    "deepseek-llm": (
        r"[\r\n]",
        (
            r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}"
            r"\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}"
            r"\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-"
            r"\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-"
            r"\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-"
            r"\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-"
            r"\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}"
            r"-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-"
            r"\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}"
            r"\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-"
            r"\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}"
            r"\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}"
            r"\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}"
            r"\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+"
        ),
        # llama.cpp's last range starts at U+3000, a space, which never reaches it (see above)
        r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3001}-\x{3002}]+",
        r"\s+$",
        _CJK,
        r"\p{N}+",
    ),
    "deepseek-coder": (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
    "bloom": (_BLOOM,),
    "viking": (_BLOOM, r"\p{N}"),
}  # fmt: skip


@dataclass(frozen=True)
class _Pre:
    regexes: str  # key of _REGEXES
    clean_spaces: bool = True  # llama.cpp's default for BPE vocabularies
    ignore_merges: bool = False
    add_bos: bool = False
    no_bos: bool = False  # chatglm: no default BOS id


def _pres(names: str, pre: _Pre) -> dict[str, _Pre]:
    return dict.fromkeys(names.split(), pre)


# tokenizer.ggml.pre -> what llama.cpp's load() sets for it (only the types whose regexes are ported).
_PRE_TYPES: dict[str, _Pre] = {
    "default": _Pre("default"),
    **_pres("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
            _Pre("llama3", ignore_merges=True, add_bos=True)),
    **_pres("dbrx smaug-bpe", _Pre("llama3")),
    "chatglm-bpe": _Pre("llama3", no_bos=True),
    **_pres("glm4 glm5", _Pre("llama3", no_bos=True, ignore_merges=True)),
    **_pres("qwen2 deepseek-r1-qwen kormo f2llmv2 hunyuan solar-open", _Pre("qwen2", clean_spaces=False)),
    **_pres("stablelm2 megrez", _Pre("qwen2")),
    **_pres("gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert exaone4 mpt "
            "olmo jais", _Pre("gpt2")),
    **_pres("trillion granite-docling", _Pre("gpt2", clean_spaces=False)),
    **_pres("starcoder refact codeshell exaone minerva-7b mellum2", _Pre("starcoder")),
    **_pres("smollm command-r", _Pre("starcoder", clean_spaces=False)),
    "falcon": _Pre("falcon"),
    "deepseek-llm": _Pre("deepseek-llm", clean_spaces=False),
    "deepseek-coder": _Pre("deepseek-coder", clean_spaces=False),
    **_pres("bloom gpt3-finnish", _Pre("bloom")),
    "poro-chat": _Pre("bloom", clean_spaces=False),
    "viking": _Pre("viking", clean_spaces=False),
    **_pres("gpt-4o llama4", _Pre("gpt4o", clean_spaces=False)),
}  # fmt: skip
SUPPORTED_PRE_TOKENIZERS = frozenset(_PRE_TYPES)


def _gpt2_byte_chars() -> list[str]:
    """GPT-2's byte -> printable character map (unicode_byte_to_utf8_map in llama.cpp)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


_CHAR_TO_BYTE = {c: b for b, c in enumerate(_gpt2_byte_chars())}


def clean_spaces(data: bytes) -> bytes:
    """llama_detokenize's clean_spaces passes (" ?" -> "?", " ' " -> "'", " 's" -> "'s"), on bytes."""
    data = re.sub(rb" (?=[?!.,])", b"", data)
    data = data.replace(b" ' ", b"'")
    return re.sub(rb" '(?=[sm]|re|ve)", b"'", data)


class StreamDecoder:
    """Turns ids into text as they come, never splitting a UTF-8 sequence; the pieces add up to decode()."""

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False) -> None:
        self._tok = tokenizer
        self._special = not skip_special
        self._first = True
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending = b""  # bytes that clean_spaces may still change
        self._tail = b""  # the last bytes already passed on (clean_spaces looks back over them)

    def push(self, token_id: int) -> str:
        piece = self._tok._piece(token_id, self._special)
        if self._first:
            piece = self._tok._strip_first(piece)
            self._first = False
        if not self._tok.clean_spaces:
            return self._utf8.decode(piece)
        self._pending += piece
        # clean_spaces rewrites at most 5 bytes starting at a space, so a cut with no space in the
        # 6 bytes before it cleans the same in two parts as in one.
        cut = len(self._pending)
        while b" " in (self._tail + self._pending[:cut])[-6:]:
            cut -= 1
        ready, self._pending = self._pending[:cut], self._pending[cut:]
        self._tail = (self._tail + ready)[-6:]
        return self._utf8.decode(clean_spaces(ready))

    def flush(self) -> str:
        ready, self._pending = self._pending, b""
        return self._utf8.decode(clean_spaces(ready) if self._tok.clean_spaces else ready, final=True)


@dataclass(frozen=True, eq=False)
class Vocabulary:
    """A GGUF vocabulary as llama.cpp reads it (llama_vocab::impl::load), checked: what a Tokenizer is made of.
    `attrs` are the llama_token_attr of every token after llama.cpp's text-based overrides."""

    model: str  # "gpt2" (BPE) or "llama" (SentencePiece)
    tokens: list[str]  # empty entries renamed [EMPTY_i], as llama.cpp does: every text maps to one id
    attrs: np.ndarray
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    eog_ids: frozenset[int]
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    clean_spaces: bool
    pre: str | None  # tokenizer.ggml.pre of a BPE vocabulary

    def __post_init__(self) -> None:
        if self.add_bos and self.bos_id is None:
            raise TokenizerError(
                "the model asks for a BOS token but has no BOS id", hint="the model file is broken"
            )
        if self.add_eos and self.eos_id is None:
            raise TokenizerError(
                "the model asks for an EOS token but has no EOS id", hint="the model file is broken"
            )


class Tokenizer:
    """Encode/decode exactly as llama.cpp does for the same GGUF metadata. Build with load_tokenizer()."""

    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    eog_ids: frozenset[int]
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    clean_spaces: bool
    model: str  # "gpt2" (BPE) or "llama" (SentencePiece)
    pre: str | None  # tokenizer.ggml.pre of a BPE vocabulary

    _spm: bool
    _tokens: list[str]
    _token_to_id: dict[str, int]
    _attrs: np.ndarray  # llama_token_attr of every token, after llama.cpp's text-based overrides
    _pieces: dict[int, bytes]  # token_to_piece(special=true), filled as tokens are decoded
    _special: list[tuple[int, str, int]]  # (id, text, attr) of the special-token cache, in llama.cpp order
    _special_by_first: dict[str, list[tuple[int, str]]]  # first character -> (rank in _special, text)
    _special_first_chars: frozenset[str]
    _bos: int
    _eos: int
    _neg_scores: list[float]  # SPM: -score per token (heapq is a min-heap)
    _hf: Any  # BPE: the tokenizers.Tokenizer for raw-text fragments

    def __init__(self, vocab: Vocabulary, *, neg_scores: list[float] | None = None, bpe: Any = None) -> None:
        """A tokenizer over `vocab` (load_tokenizer reads one from GGUF metadata). SentencePiece vocabularies
        take `neg_scores` (-score per token), BPE ones `bpe` (a tokenizers.Tokenizer for raw-text fragments)."""
        spm = vocab.model == "llama"
        if (neg_scores is None) == spm or (bpe is None) != spm:
            raise TypeError("a SentencePiece vocabulary takes neg_scores, a BPE one bpe")
        self.model, self.pre = vocab.model, vocab.pre
        self.vocab_size = len(vocab.tokens)
        self.bos_id, self.eos_id, self.unk_id, self.pad_id = (
            vocab.bos_id,
            vocab.eos_id,
            vocab.unk_id,
            vocab.pad_id,
        )
        self.eog_ids = vocab.eog_ids
        self.add_bos, self.add_eos = vocab.add_bos, vocab.add_eos
        self.add_space_prefix, self.clean_spaces = vocab.add_space_prefix, vocab.clean_spaces
        self._spm = spm
        self._tokens = vocab.tokens
        self._token_to_id = {t: i for i, t in enumerate(vocab.tokens)}
        self._attrs = vocab.attrs
        self._pieces = {}
        self._bos = vocab.bos_id if vocab.bos_id is not None else -1
        self._eos = vocab.eos_id if vocab.eos_id is not None else -1
        # Special-token cache: longest text (in bytes) first; equal lengths keep id order.
        special_ids = np.nonzero(vocab.attrs & _SPECIAL_ATTRS)[0].tolist()
        special_ids.sort(key=lambda i: -len(vocab.tokens[i].encode("utf-8", "surrogateescape")))
        self._special = [(i, vocab.tokens[i], int(vocab.attrs[i])) for i in special_ids]
        by_first: dict[str, list[tuple[int, str]]] = {}
        for rank, (_, text, _) in enumerate(self._special):
            by_first.setdefault(text[0], []).append((rank, text))
        self._special_by_first = by_first
        self._special_first_chars = frozenset(by_first)
        if spm:
            self._neg_scores = neg_scores  # type: ignore[assignment]
        else:
            self._hf = bpe

    # ---- encoding ------------------------------------------------------------------------------------

    def encode(
        self, text: str, *, add_special: bool = False, parse_special: bool = True, continues: bool = False
    ) -> list[int]:
        """Token ids of `text`, as llama_tokenize(text, add_special, parse_special). `continues`: the text
        goes on from earlier text (a grammar's forced piece), so no SentencePiece space prefix is added."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode() takes a str, not {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise TokenizerError("text holds a lone surrogate and is not valid Unicode") from exc
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self._bos)
        fragments = self._partition(text, parse_special) if text else []
        if self._spm:
            prev_special = not continues  # llama.cpp: a space prefix goes before the first fragment too
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                    prev_special = True
                    continue
                if self.add_space_prefix and prev_special:
                    frag = " " + frag
                self._spm_encode(frag.replace(" ", "\u2581"), out)
                prev_special = False
        else:
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                else:  # one call per fragment: encode_batch would start tokenizers' thread pool
                    ids = self._hf.encode(frag, add_special_tokens=False).ids
                    out.extend(i for i in ids if i != self.vocab_size)  # drop the sentinel
        if add_special and self.add_eos:
            out.append(self._eos)
        return out

    def encode_batch(
        self, texts: Iterable[str], *, add_special: bool = False, parse_special: bool = True
    ) -> list[list[int]]:
        return [self.encode(t, add_special=add_special, parse_special=parse_special) for t in texts]

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """tokenizer_st_partition: each special token in turn (longest first) splits the raw fragments."""
        found: list[int] = []
        for ch in set(text).intersection(self._special_first_chars):
            found.extend(rank for rank, t in self._special_by_first[ch] if t in text)
        fragments: list[str | int] = [text]
        for rank in sorted(found):
            tid, ttext, attr = self._special[rank]
            if not parse_special and attr & (ATTR_CONTROL | ATTR_UNKNOWN):
                continue  # user-defined tokens are split out even without parse_special
            split: list[str | int] = []
            for frag in fragments:
                if isinstance(frag, int) or ttext not in frag:
                    split.append(frag)
                    continue
                pos = 0
                while (match := frag.find(ttext, pos)) >= 0:
                    left = frag[pos:match]
                    if attr & ATTR_LSTRIP:
                        left = left.rstrip(_C_SPACES)
                    if left:
                        split.append(left)
                    split.append(tid)
                    pos = match + len(ttext)
                    if attr & ATTR_RSTRIP:
                        while pos < len(frag) and frag[pos] in _C_SPACES:
                            pos += 1
                if pos < len(frag):
                    split.append(frag[pos:])
            fragments = split
        return fragments

    def _spm_encode(self, text: str, out: list[int]) -> None:
        """llm_tokenizer_spm_session::tokenize on one escaped fragment (symbols are characters)."""
        n = len(text)
        if n == 0:
            return
        to_id = self._token_to_id
        neg_score = self._neg_scores
        size = [1] * n  # characters held by the symbol that starts at i (0 once merged away)
        nxt = [*range(1, n), -1]
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []

        def bigram(left: int, right: int) -> None:
            joined = text[left : right + size[right]]
            tid = to_id.get(joined)
            if tid is not None:
                heapq.heappush(heap, (neg_score[tid], left, right, len(joined)))

        for i in range(1, n):
            bigram(i - 1, i)
        while heap:
            _, left, right, joined = heapq.heappop(heap)
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != joined:
                continue  # stale: one side was merged since
            size[left] = joined
            size[right] = 0
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prv[after] = left
                bigram(left, after)
            if prv[left] >= 0:
                bigram(prv[left], left)
        i = 0
        while i >= 0:
            piece = text[i : i + size[i]]
            tid = to_id.get(piece)
            if tid is not None:
                out.append(tid)
            else:  # only single characters can be missing: merges only ever make vocabulary tokens
                out.extend(self._byte_token(b) for b in piece.encode("utf-8"))
            i = nxt[i]

    def _byte_token(self, byte: int) -> int:
        tid = self._token_to_id.get(f"<0x{byte:02X}>")
        if tid is None and byte < 0x80:
            tid = self._token_to_id.get(chr(byte))  # llama.cpp's fallback: the byte as a one-char token
        if tid is None:
            raise TokenizerError(
                f"the vocabulary has no byte token <0x{byte:02X}> for a character it lacks",
                hint="the model's tokenizer metadata is incomplete",
            )
        return tid

    # ---- decoding ------------------------------------------------------------------------------------

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes `token_id` stands for (special tokens as their text), as llama_token_to_piece."""
        return self._piece(token_id, True)

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        """Text of `ids`, as llama_detokenize(remove_special=false, unparse_special=not skip_special)."""
        return self.decode_bytes(ids, skip_special=skip_special).decode("utf-8", "replace")

    def decode_bytes(self, ids: Sequence[int], *, skip_special: bool = False) -> bytes:
        """The bytes llama_detokenize gives: they may end inside a UTF-8 sequence."""
        special = not skip_special
        pieces = [self._piece(t, special) for t in ids]
        if pieces:
            pieces[0] = self._strip_first(pieces[0])
        data = b"".join(pieces)
        return clean_spaces(data) if self.clean_spaces else data

    def stream(self, *, skip_special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, skip_special=skip_special)

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids

    def is_special(self, token_id: int) -> bool:
        """A control token, or a user-defined one written like one (`<tool_call>`): markup, not text."""
        self._check_id(token_id)
        attr = int(self._attrs[token_id])
        if attr & ATTR_CONTROL:
            return True
        text = self._tokens[token_id]
        return bool(attr & ATTR_USER_DEFINED) and text.startswith("<") and text.endswith(">")

    def id_to_text(self, token_id: int) -> str:
        """The vocabulary entry itself (GPT-2 byte characters, U+2581 for spaces), for display."""
        self._check_id(token_id)
        return self._tokens[token_id]

    def token_to_id(self, text: str) -> int | None:
        return self._token_to_id.get(text)

    def _strip_first(self, piece: bytes) -> bytes:
        # llama_detokenize drops one leading space of the first piece of an SPM-style vocabulary
        return piece[1:] if self.add_space_prefix and piece.startswith(b" ") else piece

    def _check_id(self, token_id: int) -> None:
        if not isinstance(token_id, (int, np.integer)) or not 0 <= token_id < self.vocab_size:
            raise TokenizerError(
                f"token id {token_id!r} is outside the vocabulary (0..{self.vocab_size - 1})"
            )

    def _piece(self, token_id: int, special: bool) -> bytes:
        self._check_id(token_id)
        cached = self._pieces.get(token_id)
        if cached is None:
            cached = self._pieces[int(token_id)] = self._make_piece(int(token_id))
        if not special and self._attrs[token_id] & (ATTR_CONTROL | ATTR_UNKNOWN):
            return b""
        return cached

    def _make_piece(self, tid: int) -> bytes:
        """llama_vocab::token_to_piece(special=true) for one token."""
        attr = int(self._attrs[tid])
        text = self._tokens[tid]
        if attr & (ATTR_CONTROL | ATTR_UNKNOWN | ATTR_USER_DEFINED):
            return text.encode("utf-8", "surrogateescape")  # raw bytes kept by the GGUF reader
        if attr & ATTR_NORMAL:
            if self._spm:
                return text.replace("\u2581", " ").encode("utf-8", "surrogateescape")
            out = bytearray()
            for ch in text:
                b = _CHAR_TO_BYTE.get(ch)
                if b is None:  # llama_decode_text's marker for a character outside the byte map
                    utf8 = ch.encode("utf-8", "surrogateescape")
                    out += (
                        b"[UNK_BYTE_0x" + utf8.hex().encode() + text.encode("utf-8", "surrogateescape") + b"]"
                    )
                else:
                    out.append(b)
            return bytes(out)
        if attr & ATTR_BYTE:  # llama_token_to_byte: (uint8_t) strtol(text.substr(3, 2), NULL, 16)
            sign, digits = _STRTOL16.match(text[3:5]).groups()  # type: ignore[union-attr]
            value = int(digits, 16) if digits else 0  # a malformed byte token ("<0xZZ>") is 0, as for strtol
            return bytes([(-value if sign == "-" else value) & 0xFF])
        return b""  # unused and undefined tokens have no text


_STRTOL16 = re.compile(r"[ \t\n\v\f\r]*([+-]?)([0-9A-Fa-f]*)")


def load_tokenizer(metadata: Mapping[str, Any]) -> Tokenizer:
    """Build the tokenizer described by GGUF `metadata` (GGUFFile.metadata)."""
    model = _get_str(metadata, "tokenizer.ggml.model")
    if model not in ("gpt2", "llama"):
        raise TokenizerError(
            f"tokenizer model {model!r} is not supported",
            hint="edge reads BPE ('gpt2') and SentencePiece ('llama') vocabularies",
        )
    tokens = _tokens(metadata)
    n = len(tokens)
    attrs = _token_attrs(metadata, n)
    scores = _get_array(metadata, "tokenizer.ggml.scores", n, integer=False)
    flags, ids, pre = _flags_and_ids(metadata, model, n)
    to_id = {t: i for i, t in enumerate(tokens)}
    eog = _special_roles(metadata, tokens, to_id, attrs, ids, flags["pre"])
    vocab = Vocabulary(model, tokens, attrs, ids["bos"], ids["eos"], ids["unk"], ids["pad"], eog, **flags)
    if model == "llama":  # llama.cpp scores every token 0 without the array
        neg_scores = [0.0] * n if scores is None else (-scores[:n].astype(np.float32)).tolist()
        return Tokenizer(vocab, neg_scores=neg_scores)
    return Tokenizer(vocab, bpe=_build_bpe(metadata, to_id, pre))  # type: ignore[arg-type]


def _tokens(metadata: Mapping[str, Any]) -> list[str]:
    """tokenizer.ggml.tokens, checked as text, empty entries renamed as llama.cpp does, no text twice."""
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise TokenizerError("tokenizer.ggml.tokens is missing or is not a list of strings")
    try:  # the GGUF reader keeps invalid UTF-8 as surrogate escapes; any other lone surrogate is not text
        "".join(tokens).encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        raise TokenizerError(
            f"tokenizer.ggml.tokens holds a lone surrogate ({exc.object[exc.start]!r})",
            hint="the model file is corrupt",
        ) from None
    # llama.cpp renames empty entries so that every text maps to one id
    tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    if len(set(tokens)) != len(tokens):
        raise TokenizerError(
            "tokenizer.ggml.tokens holds the same text twice", hint="the model file is corrupt"
        )
    return tokens


def _token_attrs(metadata: Mapping[str, Any], n: int) -> np.ndarray:
    """llama_token_attr per token from tokenizer.ggml.token_type (NORMAL for all without it)."""
    types = _get_array(metadata, "tokenizer.ggml.token_type", n, integer=True)
    if types is None:
        return np.full(n, ATTR_NORMAL, dtype=np.int32)
    t = types[:n].astype(np.int64)
    return np.where((t >= 0) & (t < len(_TYPE_TO_ATTR)), _TYPE_TO_ATTR[np.clip(t, 0, 6)], 0).astype(np.int32)


def _flags_and_ids(
    metadata: Mapping[str, Any], model: str, n: int
) -> tuple[dict[str, Any], dict[str, int | None], _Pre | None]:
    """Flags and special ids per vocabulary type (llama_vocab::impl::load), then the file's own keys over
    them: (Vocabulary's flag fields, role -> id, the BPE pre-tokenizer)."""
    ids: dict[str, int | None] = dict.fromkeys(role for role, _ in _SPECIAL_ID_KEYS)
    if model == "llama":
        pre_name = None
        pre = None
        ids.update(bos=1, eos=2, unk=0)
        add_space_prefix, clean, add_bos = True, False, True
    else:
        pre_name = metadata.get("tokenizer.ggml.pre", "default")
        if not isinstance(pre_name, str):
            raise TokenizerError("tokenizer.ggml.pre is not a string")
        pre = _PRE_TYPES.get(pre_name)
        if pre is None:
            raise TokenizerError(
                f"unknown pre-tokenizer {pre_name!r}",
                hint="supported: " + ", ".join(sorted(SUPPORTED_PRE_TOKENIZERS)),
            )
        ids.update(bos=None if pre.no_bos else 11, eos=11)
        add_space_prefix, clean, add_bos = False, pre.clean_spaces, pre.add_bos
    add_space_prefix = _get_bool(metadata, "tokenizer.ggml.add_space_prefix", add_space_prefix)
    for role, value in ids.items():
        if value is not None and value >= n:
            ids[role] = None  # a default outside the vocabulary is disabled
    for role, key in _SPECIAL_ID_KEYS:
        if key in metadata:
            ids[role] = _get_id(metadata, key, n)
    flags = {
        "add_bos": _get_bool(metadata, "tokenizer.ggml.add_bos_token", add_bos),
        "add_eos": _get_bool(metadata, "tokenizer.ggml.add_eos_token", False),
        "add_space_prefix": add_space_prefix,
        "clean_spaces": clean,
        "pre": pre_name,
    }
    return flags, ids, pre


def _special_roles(
    metadata: Mapping[str, Any],
    tokens: list[str],
    to_id: dict[str, int],
    attrs: np.ndarray,
    ids: dict[str, int | None],
    pre_name: str | None,
) -> frozenset[int]:
    """Auto-detected roles (into `ids`) and the end-of-generation set, by token text as llama.cpp does, with
    the attribute overrides that go with them (into `attrs`).

    Where a vocabulary has several candidates of one role llama.cpp takes the first of an unordered_map walk
    (no defined order); this takes the first of its candidate list. For EOT and EOM the pick cannot change
    the result (every candidate text is an end-of-generation text anyway), which is why no `eot_id` is
    exposed; for FIM pad/repo/sep it could, for a vocabulary with two candidates of one role."""

    def first_present(texts: Iterable[str]) -> int | None:
        return next((to_id[x] for x in texts if x in to_id), None)

    for role, texts in (("eot", _EOT_TEXTS), ("eom", _EOM_TEXTS), *_FIM_TEXTS.items()):
        if ids[role] is None:
            ids[role] = first_present(texts)
            if ids[role] is not None:
                attrs[ids[role]] |= ATTR_CONTROL
    eog = {i for i in (ids["fim_pad"], ids["fim_rep"], ids["fim_sep"]) if i is not None}
    for text in _EOG_TEXTS:
        if text in to_id:
            eog.add(to_id[text])
            attrs[to_id[text]] |= ATTR_CONTROL
    for text in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):  # gpt-oss: always rendered
        if text in to_id:
            attrs[to_id[text]] = ATTR_USER_DEFINED
    eog.update(i for i in (ids["eos"], ids["eot"], ids["eom"]) if i is not None)
    eog_texts = {tokens[i] for i in eog}
    has_call = bool(eog_texts & {"<|call|>", "<|calls|>"})
    if "<|end|>" in eog_texts and has_call and eog_texts & {"<|return|>", "<|flush|>"}:
        eog.discard(to_id["<|end|>"])  # harmony / solar-open: <|end|> ends a message, not the generation
        attrs[to_id["<|end|>"]] = ATTR_USER_DEFINED
    if "</s>" in eog_texts and eog_texts & {"<|tool_response>", "<|plamo:eos|>"}:
        eog.discard(to_id["</s>"])
        attrs[to_id["</s>"]] = ATTR_NORMAL
    _strip_attrs(metadata, to_id, attrs, pre_name)
    return frozenset(eog)


def _strip_attrs(
    metadata: Mapping[str, Any], to_id: dict[str, int], attrs: np.ndarray, pre_name: str | None
) -> None:
    """Per-model strip attributes that llama.cpp sets by name (they are not in the GGUF)."""
    name = str(metadata.get("general.name", "")).lower()
    if "phi-3" in name or "phi3" in name:
        attrs[(attrs & _SPECIAL_ATTRS) != 0] |= ATTR_RSTRIP
        for text, rstrip in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
            if text in to_id:
                attrs[to_id[text]] = (
                    (attrs[to_id[text]] | ATTR_RSTRIP) if rstrip else (attrs[to_id[text]] & ~ATTR_RSTRIP)
                )
    elif pre_name in ("jina-v2-de", "jina-v2-es", "jina-v2-code") and "<mask>" in to_id:
        attrs[to_id["<mask>"]] |= ATTR_LSTRIP
    elif "modern-bert" in name and "[MASK]" in to_id:
        attrs[to_id["[MASK]"]] |= ATTR_LSTRIP


_UNK_SENTINEL = "\x00edge-unknown\x00"  # \x00 is no GPT-2 byte character: no pre-token can equal it


def _build_bpe(metadata: Mapping[str, Any], vocab: dict[str, int], pre: _Pre) -> Any:
    from tokenizers import Regex, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    raw = metadata.get("tokenizer.ggml.merges")
    if not isinstance(raw, list) or not all(isinstance(m, str) for m in raw):
        raise TokenizerError("tokenizer.ggml.merges is missing or is not a list of strings")
    merges: dict[tuple[str, str], None] = {}
    for line in raw:
        pos = line.find(" ", 1)  # llama.cpp splits at the first space after the first character
        if pos < 0:
            continue
        pair = (line[:pos], line[pos + 1 :])
        if pair[0] not in vocab or pair[1] not in vocab or pair[0] + pair[1] not in vocab:
            raise TokenizerError(
                f"merge {line!r} refers to text that is not in the vocabulary",
                hint="the model file is corrupt",
            )
        merges.setdefault(pair)  # llama.cpp keeps the first rank of a repeated merge
    try:
        # A character without a token must stay a barrier between its neighbours, as the unmergeable
        # symbol it is in llama.cpp (which then drops it); tokenizers would drop it before merging.
        # So it becomes a sentinel "unknown" token, removed from the output by Tokenizer.encode.
        with_unk = {**vocab, _UNK_SENTINEL: len(vocab)}
        bpe = models.BPE(
            vocab=with_unk,
            merges=list(merges),
            unk_token=_UNK_SENTINEL,
            fuse_unk=False,
            ignore_merges=pre.ignore_merges,
            byte_fallback=False,
        )
        hf = HFTokenizer(bpe)
        splits = [pre_tokenizers.Split(Regex(_onig(p)), behavior="isolated") for p in _REGEXES[pre.regexes]]
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    except Exception as exc:  # tokenizers raises plain Exception for bad vocabularies
        raise TokenizerError(f"cannot build the BPE tokenizer: {exc}") from exc
    return hf


def _get_str(metadata: Mapping[str, Any], key: str) -> str:
    value = metadata.get(key)
    if value is None:
        raise TokenizerError(f"{key} is missing", hint="the model file has no tokenizer")
    if not isinstance(value, str):
        raise TokenizerError(f"{key} should be a string, not {type(value).__name__}")
    return value


def _get_bool(metadata: Mapping[str, Any], key: str, default: bool) -> bool:
    value = metadata.get(key, default)
    if not isinstance(value, (bool, np.bool_)):
        raise TokenizerError(f"{key} should be a bool, not {type(value).__name__}")
    return bool(value)


def _get_id(metadata: Mapping[str, Any], key: str, n: int) -> int:
    value = metadata[key]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TokenizerError(f"{key} should be an integer, not {type(value).__name__}")
    if not 0 <= value < n:
        raise TokenizerError(f"{key} = {value} is outside the vocabulary (0..{n - 1})")
    return int(value)


def _get_array(metadata: Mapping[str, Any], key: str, n: int, *, integer: bool) -> np.ndarray | None:
    value = metadata.get(key)
    if value is None:
        return None
    arr = np.asarray(value) if isinstance(value, (list, tuple, np.ndarray)) else None
    kinds = "iu" if integer else "iuf"
    if arr is None or arr.ndim != 1 or arr.dtype.kind not in kinds:
        raise TokenizerError(f"{key} should be a 1-D {'integer' if integer else 'numeric'} array")
    if len(arr) < n:
        raise TokenizerError(f"{key} has {len(arr)} entries for {n} tokens")
    return arr
