"""Loading a model (file checks, tokenizer, template, backend) and running prompts on it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.tokenizer import Tokenizer, load_tokenizer

from devices.base import Decoder
from devices.discovery import discover
from devices.llamacpp import LlamaCppDecoder, LlamaCppOptions
from devices.placement import Placement, place
from edge.generate import Generation, GenerationConfig, GenerationStats
from models.catalog import CATALOG
from models.chat_template import ChatTemplate, template_from_metadata
from models.gguf_file import GGUFFile, open_gguf
from models.store import resolve_model


@dataclass(frozen=True)
class LoadOptions:
    backend: str | None = None
    device: str = "cpu"
    fallback: bool = False
    n_ctx: int = 4096
    n_threads: int | None = None


@dataclass(frozen=True)
class Result:
    text: str
    token_ids: list[int]
    prompt_ids: list[int]
    stats: GenerationStats
    backend: str
    device: str
    fallback: str | None


class Model:
    """A loaded model. Calls are serialized: two threads never interleave tokens into one KV cache."""

    def __init__(self, name: str, path: Path, gguf: GGUFFile, decoder: Decoder, placement: Placement) -> None:
        self.name = name
        self.path = path
        self.gguf = gguf
        self.tokenizer: Tokenizer = load_tokenizer(gguf.metadata)
        tok = self.tokenizer
        bos = tok.decode([tok.bos_id]) if tok.bos_id is not None else ""
        eos = tok.decode([tok.eos_id]) if tok.eos_id is not None else ""
        self.template: ChatTemplate | None = template_from_metadata(
            gguf.metadata, bos_token=bos, eos_token=eos
        )
        self.decoder = decoder
        self.placement = placement
        self._lock = threading.RLock()

    # -- prompts ---------------------------------------------------------------------------------
    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a full prompt text: special-token text parsed, BOS added when the model wants one."""
        ids = self.tokenizer.encode(text, parse_special=True)
        tok = self.tokenizer
        if tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
            ids.insert(0, tok.bos_id)
        return ids

    def render_chat(self, messages: Sequence[Mapping[str, Any]]) -> str:
        if self.template is None:
            # a base model: plain completion over the concatenated contents
            return "".join(str(m.get("content", "")) for m in messages)
        return self.template.render(messages, add_generation_prompt=True)

    def prompt_ids(self, prompt: str, *, raw: bool = False, system: str | None = None) -> list[int]:
        if raw or self.template is None:
            return self.encode_prompt(prompt)
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}
        ]
        return self.encode_prompt(self.render_chat(messages))

    # -- generation ------------------------------------------------------------------------------
    def stream(
        self,
        prompt: str,
        config: GenerationConfig | None = None,
        *,
        raw: bool = False,
        cancel: Callable[[], bool] | None = None,
    ) -> Iterator[str]:
        """Yield text pieces as they are generated; the lock is held until the generator finishes."""
        ids = self.prompt_ids(prompt, raw=raw)
        with self._lock:
            gen = Generation(self.decoder, self.tokenizer, ids, config, cancel=cancel)
            yield from gen
            self.last = self._result(gen)

    def generate(
        self,
        prompt: str,
        config: GenerationConfig | None = None,
        *,
        raw: bool = False,
        on_text: Callable[[str], None] | None = None,
        cancel: Callable[[], bool] | None = None,
    ) -> Result:
        ids = self.prompt_ids(prompt, raw=raw)
        with self._lock:
            gen = Generation(self.decoder, self.tokenizer, ids, config, cancel=cancel)
            for piece in gen:
                if on_text is not None:
                    on_text(piece)
            return self._result(gen)

    def _result(self, gen: Generation) -> Result:
        p = self.placement
        return Result(
            gen.text, list(gen.token_ids), gen.prompt_ids, gen.stats, p.backend, p.device, p.fallback
        )

    def close(self) -> None:
        with self._lock:
            self.decoder.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(model: str | None = None, options: LoadOptions | None = None) -> Model:
    """Load a catalog model (pulled on first use) or a local .gguf file."""
    from models.catalog import DEFAULT_MODEL

    opts = options or LoadOptions()
    name = model or DEFAULT_MODEL
    path = resolve_model(name)
    gguf = open_gguf(path)  # validates the whole file layout before any native code sees it
    placement = place(
        discover(("llamacpp",)), backend=opts.backend, device=opts.device, fallback=opts.fallback
    )
    decoder = LlamaCppDecoder(
        path, LlamaCppOptions(n_ctx=opts.n_ctx, n_threads=opts.n_threads, device=placement.device)
    )
    try:
        display = name if name in CATALOG else path.name
        return Model(display, path, gguf, decoder, placement)
    except BaseException:
        decoder.close()
        raise
