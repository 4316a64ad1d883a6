"""A checked sentence-transformers folder written as a BERT GGUF the way llama.cpp's converter writes one
(arch `bert`, tensor names from gguf's own map, the WordPiece vocabulary in its phantom-space form,
`bert.pooling_type`): the same model as llama.cpp runs it, for comparing against llama.cpp's embeddings
(`edge bench --embed`, the tests). 2-D weights in f16 or f32, norms, biases and the token-type table in f32,
as the converter keeps them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edge.errors import ModelFormatError
from edge.models.encoder_folder import EncoderFolder

__all__ = ["write_bert_gguf"]

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
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32)
    _vocab(w, f)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, cfg.n_layer)
    for hf in cfg.shapes(""):
        name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ModelFormatError(f"gguf's BERT map has no name for {hf}")
        value = f.weight(hf)
        # token_types stays f32, as the converter keeps it: llama.cpp adds a view of its row to the f32 sum
        half = dtype == "f16" and value.ndim == 2 and not name.startswith("token_types")
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
    for token, add in (("[CLS]", w.add_bos_token_id), ("[SEP]", w.add_sep_token_id), ("[UNK]", w.add_unk_token_id), ("[PAD]", w.add_pad_token_id), ("[MASK]", w.add_mask_token_id)):  # fmt: skip
        if token in vocab:
            add(vocab[token])
    w.add_add_bos_token(True)
    w.add_add_sep_token(True)
