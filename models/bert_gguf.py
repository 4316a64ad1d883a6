"""BERT GGUFs as llama.cpp's converter writes them (arch `bert`, tensor names from gguf's own map, the
WordPiece vocabulary in its phantom-space form, `bert.pooling_type`), both ways:

- `open_bert_gguf`: such a file (the embedding models Ollama users have) as an encoder source for edge's own
  graph, checked first (the whole layout by models/gguf_file.py; then the architecture, pooling, causal flag,
  every tensor's name, type and shape against the hyper-parameters; a family or type edge's encoder does not
  cover is refused by name). GGUF declares no normalization: vectors are unit length, as llama-server's and
  Ollama's embeddings are.
- `write_bert_gguf`: a checked sentence-transformers folder written as one: the same model as llama.cpp runs
  it (`edge bench --embed`, the tests). 2-D weights in f16 or f32, norms, biases and the token-type table in
  f32, as the converter keeps them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edge.errors import ModelFormatError, TokenizerError
from edge.models.encoder_folder import BertConfig, EncoderFolder, Pooling
from edge.models.gguf_file import GGUFFile, open_gguf

__all__ = ["BertGGUF", "open_bert_gguf", "write_bert_gguf"]

_POOLING = {"mean": 1, "cls": 2}  # gguf.PoolingType; llama.cpp has no max pooling
_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def _phantom(token: str) -> str:
    """llama.cpp's WordPiece form: a word's first piece starts with U+2581, a continuation loses its ##."""
    if token.startswith("[") and token.endswith("]"):
        return token
    return token[2:] if token.startswith("##") else "\u2581" + token


def write_bert_gguf(f: EncoderFolder, path: Path, *, dtype: str = "f16") -> Path:
    import gguf

    if f.pooling.mode not in _POOLING:
        raise ModelFormatError(f"llama.cpp has no {f.pooling.mode} pooling")
    cfg = f.config
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_name(f.path.name)
    w.add_context_length(cfg.max_positions)
    w.add_embedding_length(cfg.hidden)
    w.add_feed_forward_length(cfg.intermediate)
    w.add_block_count(cfg.n_layer)
    w.add_head_count(cfg.n_head)
    w.add_layer_norm_eps(cfg.eps)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType(_POOLING[f.pooling.mode]))
    ft = gguf.LlamaFileType
    types = {"f32": ft.ALL_F32, "f16": ft.MOSTLY_F16, "q8_0": ft.MOSTLY_Q8_0}
    w.add_file_type(types[dtype])
    _vocab(w, f)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, cfg.n_layer)
    for hf in cfg.shapes(""):
        name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ModelFormatError(f"gguf's BERT map has no name for {hf}")
        value = f.weight(hf)
        # token_types stays f32, as the converter keeps it: llama.cpp adds a view of its row to the f32 sum
        half = dtype == "f16" and value.ndim == 2 and not name.startswith("token_types")
        if dtype == "q8_0" and value.ndim == 2 and not name.startswith("token_types"):
            q8 = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(name, gguf.quants.quantize(value, q8), raw_dtype=q8)
        else:
            w.add_tensor(name, value.astype(np.float16) if half else value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _vocab(w, f: EncoderFolder) -> None:  # type: ignore[no-untyped-def]
    import gguf

    vocab = json.loads((f.path / "tokenizer.json").read_text())["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    if len(tokens) != f.config.vocab_size or sorted(vocab.values()) != list(range(len(tokens))):
        raise ModelFormatError("the vocabulary's ids are not 0..vocab_size-1")
    control, normal = gguf.TokenType.CONTROL, gguf.TokenType.NORMAL
    w.add_tokenizer_model("bert")
    w.add_token_list([_phantom(t) for t in tokens])
    w.add_token_types([control if t in _SPECIALS else normal for t in tokens])
    w.add_token_type_count(f.config.type_vocab)
    setters = (
        ("[CLS]", w.add_bos_token_id),
        ("[SEP]", w.add_sep_token_id),
        ("[UNK]", w.add_unk_token_id),
        ("[PAD]", w.add_pad_token_id),
        ("[MASK]", w.add_mask_token_id),
    )
    for token, add in setters:
        if token in vocab:
            add(vocab[token])
    w.add_add_bos_token(True)
    w.add_add_sep_token(True)


# -- reading -------------------------------------------------------------------------------------------------
_WEIGHT_TYPES = {0: "F32", 1: "F16", 30: "BF16", 8: "Q8_0"}  # gguf.GGMLQuantizationType values edge takes
_POOLING_NAMES = {v: k for k, v in _POOLING.items()}


class BertGGUF:
    """A checked BERT GGUF as an encoder source (models/encoder_folder.EncoderSource)."""

    def __init__(
        self, gguf_file: GGUFFile, config: BertConfig, pooling: Pooling, names: dict[str, str]
    ) -> None:
        self.gguf = gguf_file
        self.path = gguf_file.path
        self.config = config
        self.pooling = pooling
        self.max_seq_length = config.max_positions
        self.lowercase = False  # the tokenizer's normalizer lowers (llama.cpp's WordPiece always does)
        self._names = names  # sentence-transformers name -> GGUF name
        self._tokenizer: object | None = None

    def weight(self, name: str) -> np.ndarray:
        return self.gguf.tensor_array(self._names[name])

    @property
    def tokenizer(self):  # type: ignore[no-untyped-def]
        if self._tokenizer is None:
            self._tokenizer = _wordpiece(self.gguf.metadata, self.path.name)
        return self._tokenizer


def _meta(md: dict, key: str, where: str) -> int | float:  # type: ignore[type-arg]
    value = md.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ModelFormatError(f"{where}: {key} is missing or not a number")
    return value


def open_bert_gguf(path: str | Path) -> BertGGUF:
    import gguf

    g = open_gguf(path)  # the whole layout, every offset and size against the file
    md, where = g.metadata, Path(path).name
    arch = md.get("general.architecture")
    if arch != "bert":
        raise ModelFormatError(
            f"{where}: architecture {arch!r} is not an encoder edge's graph covers (bert)",
            hint="chat models run with edge run / edge.load",
        )
    if md.get("bert.attention.causal", False) is not False or md.get("tokenizer.ggml.model") != "bert":
        raise ModelFormatError(
            f"{where}: a causal BERT, or a vocabulary other than WordPiece, is not covered"
        )
    mode = _POOLING_NAMES.get(md.get("bert.pooling_type"))  # type: ignore[arg-type]
    if mode is None:
        raise ModelFormatError(
            f"{where}: bert.pooling_type {md.get('bert.pooling_type')!r} is not mean or cls"
        )
    tokens = md.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise ModelFormatError(f"{where}: no tokenizer.ggml.tokens")
    raw = {
        "model_type": "bert", "vocab_size": len(tokens),
        "hidden_size": _meta(md, "bert.embedding_length", where),
        "num_hidden_layers": _meta(md, "bert.block_count", where),
        "num_attention_heads": _meta(md, "bert.attention.head_count", where),
        "intermediate_size": _meta(md, "bert.feed_forward_length", where),
        "max_position_embeddings": _meta(md, "bert.context_length", where),
        "type_vocab_size": md.get("tokenizer.ggml.token_type_count", 2),
        "layer_norm_eps": _meta(md, "bert.attention.layer_norm_epsilon", where),
    }  # fmt: skip
    cfg = BertConfig.from_json(raw, where)
    tensor_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, cfg.n_layer)
    names = {}
    for hf, shape in cfg.shapes("").items():
        name = tensor_map.get_name(hf, try_suffixes=(".weight", ".bias"))
        info = g.tensors.get(name or "")
        if name is None or info is None:
            raise ModelFormatError(f"{where}: no tensor {name or hf!r}")
        if info.ggml_type not in _WEIGHT_TYPES:
            known = sorted(_WEIGHT_TYPES.values())
            raise ModelFormatError(
                f"{where}: {name} has ggml type {info.ggml_type}; edge's encoder takes {known}"
            )
        if tuple(reversed(info.shape)) != shape:
            got = list(reversed(info.shape))
            raise ModelFormatError(f"{where}: {name} has shape {got}, the metadata says {list(shape)}")
        names[hf] = name
    extra = set(g.tensors) - set(names.values())
    if extra:
        raise ModelFormatError(f"{where}: tensors edge's encoder does not know: {sorted(extra)[:5]}")
    return BertGGUF(g, cfg, Pooling(mode, normalize=True), names)


def _wordpiece(md: dict, where: str):  # type: ignore[no-untyped-def,type-arg]
    """The GGUF's phantom-space vocabulary back as a `tokenizers` WordPiece with BERT's normalizer (lower
    case, accents stripped, CJK split: what llama.cpp's WordPiece does) and [CLS] ... [SEP] around a text."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    tokens: list[str] = md["tokenizer.ggml.tokens"]
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        word = t if t.startswith("[") and t.endswith("]") else t[1:] if t.startswith("\u2581") else "##" + t
        vocab.setdefault(word, i)
    ids = {key: md.get(f"tokenizer.ggml.{key}_token_id") for key in ("bos", "seperator", "unknown")}
    cls, sep, unk = ids["bos"], ids["seperator"], ids["unknown"]
    if not all(isinstance(i, int) and 0 <= i < len(tokens) for i in (cls, sep, unk)):
        raise TokenizerError(f"{where}: the [CLS], [SEP] or [UNK] id is missing or outside the vocabulary")
    tok = Tokenizer(models.WordPiece(vocab, unk_token=tokens[unk], max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{tokens[cls]} $A {tokens[sep]}", special_tokens=[(tokens[cls], cls), (tokens[sep], sep)]
    )
    return tok
