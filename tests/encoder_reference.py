"""A float64 numpy forward of a BERT sentence encoder, written from the sentence-transformers definition
(one input at a time, no padding, no mask), as the reference edge's encoder graphs are held to; and a tiny
random sentence-transformers folder written with the real `tokenizers` and `safetensors` libraries."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from edge.models.encoder_folder import EncoderSource


def _ln(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


_ERF = np.frompyfunc(math.erf, 1, 1)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _ERF(x / math.sqrt(2.0)).astype(np.float64))


_WEIGHTS: dict[Path, dict[str, np.ndarray]] = {}  # float64 copies, per folder: read once per session


def reference_embedding(f: EncoderSource, ids: list[int]) -> np.ndarray:
    """One input's vector in float64."""
    cfg = f.config
    cache = _WEIGHTS.setdefault(f.path, {})

    def w(name: str) -> np.ndarray:
        if name not in cache:
            cache[name] = f.weight(name).astype(np.float64)
        return cache[name]

    n = len(ids)
    x = w("embeddings.word_embeddings.weight")[ids] + w("embeddings.position_embeddings.weight")[:n]
    x = x + w("embeddings.token_type_embeddings.weight")[0]
    x = _ln(x, w("embeddings.LayerNorm.weight"), w("embeddings.LayerNorm.bias"), cfg.eps)
    h, hd = cfg.n_head, cfg.head_dim
    for i in range(cfg.n_layer):
        p = f"encoder.layer.{i}."

        def lin(v: np.ndarray, name: str, p: str = p) -> np.ndarray:
            return v @ w(f"{p}{name}.weight").T + w(f"{p}{name}.bias")

        q, k, v = (
            lin(x, f"attention.self.{t}").reshape(n, h, hd).transpose(1, 0, 2)
            for t in ("query", "key", "value")
        )
        s = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
        s = np.exp(s - s.max(-1, keepdims=True))
        ctx = ((s / s.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(n, cfg.hidden)
        norm = f"{p}attention.output.LayerNorm"
        x = _ln(lin(ctx, "attention.output.dense") + x, w(f"{norm}.weight"), w(f"{norm}.bias"), cfg.eps)
        ff = lin(_gelu(lin(x, "intermediate.dense")), "output.dense")
        x = _ln(ff + x, w(f"{p}output.LayerNorm.weight"), w(f"{p}output.LayerNorm.bias"), cfg.eps)
    mode = f.pooling.mode
    out = x[0] if mode == "cls" else x.max(0) if mode == "max" else x.mean(0)
    if f.pooling.normalize:
        out = out / max(np.linalg.norm(out), 1e-12)
    return out


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


WORDS = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "the",
    "cat",
    "dog",
    "sat",
    "on",
    "mat",
    "a",
    "##s",
    "run",
]


def write_tiny_folder(
    folder: Path, *, seed: int = 0, layers: int = 2, hidden: int = 32, heads: int = 4, pooling: str = "mean"
) -> Path:
    """A random BERT sentence-transformers folder: config, modules, pooling, tokenizer.json, safetensors."""
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {t: i for i, t in enumerate(WORDS)}
    config = {
        "model_type": "bert", "architectures": ["BertModel"], "hidden_act": "gelu",
        "position_embedding_type": "absolute", "vocab_size": len(WORDS), "hidden_size": hidden,
        "num_hidden_layers": layers, "num_attention_heads": heads, "intermediate_size": 4 * hidden,
        "max_position_embeddings": 64, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    modes = {
        f"pooling_mode_{m}{'_token' if m == 'cls' else '_tokens'}": m == pooling
        for m in ("cls", "mean", "max")
    }
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": hidden, **modes})
    )
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 16, "do_lower_case": False})
    )
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tok.save(str(folder / "tokenizer.json"))
    from edge.models.encoder_folder import BertConfig

    cfg = BertConfig.from_json(config, "tiny")
    tensors = {}
    for name, shape in cfg.shapes("").items():
        scale = 1.0 if name.endswith("LayerNorm.weight") else 0.3
        base = 1.0 if name.endswith("LayerNorm.weight") else 0.0
        tensors[name] = (base + scale * rng.standard_normal(shape)).astype(np.float32)
    tensors["embeddings.position_ids"] = np.arange(64, dtype=np.int64)[None]
    save_file(tensors, str(folder / "model.safetensors"))
    return folder
