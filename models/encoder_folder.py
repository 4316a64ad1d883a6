"""A sentence-transformers folder, read as it declares itself (modules.json: Transformer, Pooling, Normalize;
1_Pooling/config.json; sentence_bert_config.json's max_seq_length), never assumed: what edge's encoder graph
does not cover (another module type, a pooling mode, an activation, a position kind) is a ModelFormatError
naming it, and every weight is checked by dtype and shape against config.json before a graph is built.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edge.errors import ModelFormatError, TokenizerError
from edge.models.safetensors_file import FLOAT_DTYPES, SafetensorsFile, open_safetensors

__all__ = ["BertConfig", "EncoderFolder", "EncoderSource", "Pooling", "open_encoder_folder"]

_ST = "sentence_transformers.models."
POOLING_MODES = ("mean", "cls", "max")  # what the graph pools by (sentence-transformers' pooling_mode_*)
_IGNORED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")  # unused by embeddings


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden: int
    n_layer: int
    n_head: int
    intermediate: int
    max_positions: int
    type_vocab: int
    eps: float

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_head

    @classmethod
    def from_json(cls, raw: dict[str, Any], where: str) -> BertConfig:
        if raw.get("model_type") != "bert":
            raise ModelFormatError(f"{where}: model_type {raw.get('model_type')!r}; edge's encoder is BERT")
        for key, want in (("hidden_act", "gelu"), ("position_embedding_type", "absolute")):
            if raw.get(key, want) != want:
                raise ModelFormatError(f"{where}: {key} {raw.get(key)!r} is not covered (only {want!r})")
        try:
            cfg = cls(
                *(int(raw[k]) for k in _INT_KEYS),
                eps=float(raw.get("layer_norm_eps", 1e-12)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFormatError(f"{where}: missing or bad value: {exc}") from None
        if min(cfg.vocab_size, cfg.hidden, cfg.n_layer, cfg.n_head, cfg.intermediate, cfg.max_positions) < 1:
            raise ModelFormatError(f"{where}: sizes must be positive")
        if cfg.hidden % cfg.n_head or cfg.type_vocab < 1:
            raise ModelFormatError(
                f"{where}: hidden_size {cfg.hidden} is not a multiple of {cfg.n_head} heads"
            )
        return cfg

    def shapes(self, prefix: str) -> dict[str, tuple[int, ...]]:
        """Every weight the encoder reads, with its shape."""
        d, i_ = self.hidden, self.intermediate
        out = {
            "embeddings.word_embeddings.weight": (self.vocab_size, d),
            "embeddings.position_embeddings.weight": (self.max_positions, d),
            "embeddings.token_type_embeddings.weight": (self.type_vocab, d),
            "embeddings.LayerNorm.weight": (d,),
            "embeddings.LayerNorm.bias": (d,),
        }
        for n in range(self.n_layer):
            lay = f"encoder.layer.{n}."
            for proj in ("query", "key", "value"):
                out[f"{lay}attention.self.{proj}.weight"] = (d, d)
                out[f"{lay}attention.self.{proj}.bias"] = (d,)
            out |= {
                f"{lay}attention.output.dense.weight": (d, d),
                f"{lay}attention.output.dense.bias": (d,),
                f"{lay}attention.output.LayerNorm.weight": (d,),
                f"{lay}attention.output.LayerNorm.bias": (d,),
                f"{lay}intermediate.dense.weight": (i_, d),
                f"{lay}intermediate.dense.bias": (i_,),
                f"{lay}output.dense.weight": (d, i_),
                f"{lay}output.dense.bias": (d,),
                f"{lay}output.LayerNorm.weight": (d,),
                f"{lay}output.LayerNorm.bias": (d,),
            }
        return {prefix + k: v for k, v in out.items()}


_INT_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
)


@dataclass(frozen=True)
class Pooling:
    mode: str  # one of POOLING_MODES
    normalize: bool  # a Normalize module follows (unit-length vectors)


class EncoderSource(Protocol):
    """What the encoder graph and the embedder read of a model, whichever file it came from (a
    sentence-transformers folder here, a BERT GGUF in models/bert_gguf.py)."""

    path: Path
    config: BertConfig
    pooling: Pooling
    max_seq_length: int
    lowercase: bool

    def weight(self, name: str) -> np.ndarray:
        """Weight `name` (its sentence-transformers name, no prefix) as float32, in [out, in] order."""
        ...

    @property
    def tokenizer(self) -> Any:
        """A `tokenizers.Tokenizer` that adds the model's special tokens, without padding or truncation."""
        ...


@dataclass(frozen=True, eq=False)
class EncoderFolder:
    path: Path
    config: BertConfig
    pooling: Pooling
    max_seq_length: int  # tokens per input, [CLS] and [SEP] included
    lowercase: bool  # sentence_bert_config's do_lower_case: the text is lowered before tokenizing
    weights: SafetensorsFile
    prefix: str  # "" or "bert." before the weight names

    def weight(self, name: str) -> np.ndarray:
        return self.weights.array(self.prefix + name)

    @cached_property
    def tokenizer(self):  # type: ignore[no-untyped-def]
        """The folder's own tokenizer.json, with its padding and truncation off (edge pads and bounds)."""
        from tokenizers import Tokenizer

        try:
            tok = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises plain Exception on a bad file
            raise TokenizerError(f"{self.path.name}/tokenizer.json cannot be read: {exc}") from None
        tok.no_padding()
        tok.no_truncation()
        if tok.get_vocab_size(with_added_tokens=True) > self.config.vocab_size:
            raise TokenizerError(
                f"{self.path.name}: the tokenizer has {tok.get_vocab_size()} tokens, the embeddings "
                f"{self.config.vocab_size}"
            )
        return tok


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelFormatError(f"{path.parent.name}: no {path.name}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelFormatError(f"{path}: not readable JSON: {exc}") from None


def _modules(folder: Path) -> Pooling:
    """modules.json: a Transformer at the folder itself, a Pooling, then an optional Normalize."""
    mods = _read_json(folder / "modules.json")
    if not isinstance(mods, list) or not all(isinstance(m, dict) for m in mods):
        raise ModelFormatError(f"{folder.name}/modules.json is not a list of modules")
    kinds = [str(m.get("type", "")).removeprefix(_ST) for m in mods]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise ModelFormatError(
            f"{folder.name}: modules {kinds} are not covered",
            hint="edge's encoder runs Transformer, Pooling and an optional Normalize",
        )
    if mods[0].get("path", "") != "":
        raise ModelFormatError(f"{folder.name}: the Transformer module is not at the folder itself")
    pool_dir = folder / _inside(folder, str(mods[1].get("path", "")))
    return Pooling(_pooling_mode(pool_dir), normalize=len(kinds) == 3)


def _inside(folder: Path, rel: str) -> str:
    if rel.startswith(("/", "\\")) or ".." in Path(rel).parts:
        raise ModelFormatError(f"{folder.name}: module path {rel!r} points outside the folder")
    return rel


def _pooling_mode(pool_dir: Path) -> str:
    raw = _read_json(pool_dir / "config.json")
    on = [k.removeprefix("pooling_mode_").removesuffix("_token").removesuffix("_tokens")
          for k, v in raw.items() if k.startswith("pooling_mode_") and v is True]  # fmt: skip
    if len(on) != 1 or on[0] not in POOLING_MODES or raw.get("include_prompt", True) is not True:
        raise ModelFormatError(
            f"{pool_dir.name}/config.json: pooling {on or 'none'} is not covered",
            hint=f"one of {', '.join(POOLING_MODES)}",
        )
    return on[0]


def open_encoder_folder(folder: str | Path) -> EncoderFolder:
    """Read and check a sentence-transformers folder; ModelFormatError names the first thing not covered."""
    folder = Path(folder)
    config = BertConfig.from_json(_read_json(folder / "config.json"), f"{folder.name}/config.json")
    pooling = _modules(folder)
    st_path = folder / "sentence_bert_config.json"
    st = _read_json(st_path) if st_path.exists() else {}  # absent: the position table bounds it
    max_len = st.get("max_seq_length", config.max_positions)
    if type(max_len) is not int or not 2 < max_len <= config.max_positions:
        raise ModelFormatError(
            f"{folder.name}: max_seq_length {max_len!r} is not within 3..{config.max_positions}"
        )
    weights = open_safetensors(folder / "model.safetensors")
    prefix = "bert." if "bert.embeddings.word_embeddings.weight" in weights.tensors else ""
    _check_weights(weights, config.shapes(prefix), prefix)
    lowercase = st.get("do_lower_case") is True
    return EncoderFolder(folder, config, pooling, max_len, lowercase, weights, prefix)


def _check_weights(weights: SafetensorsFile, shapes: dict[str, tuple[int, ...]], prefix: str) -> None:
    name = weights.path.name
    for key, shape in shapes.items():
        t = weights.tensors.get(key)
        if t is None:
            raise ModelFormatError(f"{name}: no tensor {key!r}")
        if t.dtype not in FLOAT_DTYPES:
            raise ModelFormatError(f"{name}: {key} is {t.dtype}; a weight is one of {sorted(FLOAT_DTYPES)}")
        if t.shape != shape:
            raise ModelFormatError(f"{name}: {key} has shape {list(t.shape)}, config.json says {list(shape)}")
    extra = set(weights.tensors) - set(shapes) - {prefix + k for k in _IGNORED}
    if extra:
        raise ModelFormatError(f"{name}: tensors edge's encoder does not know: {sorted(extra)[:5]}")
