"""Coverage-guided fuzzing of the GGUF reader and the tokenizer builder, bounded in time, for CI.

    python -m tests.reliability.fuzz --seconds 60          # every target, the time split between them
    python -m tests.reliability.fuzz --target gguf --seconds 30
    python -m tests.reliability.fuzz --make-corpus         # rewrite the seed corpus (tests/reliability/corpus)
    python -m tests.reliability.fuzz --seconds 600 --update-corpus   # then merge what adds coverage into it

Each target runs in a child process under atheris (libFuzzer) when it is installed: coverage-guided, every
input bounded in time (-timeout) and memory (-rss_limit_mb), the repository's corpus as seeds (read only:
new inputs go to a temporary folder). Without atheris a seeded mutation loop runs instead, with the same
bounds checked by hand. The number of executions is printed per target; any uncaught exception, timeout or
excess memory fails the run and leaves the input in the artifacts folder named in the output.

Targets accept arbitrary bytes:
- gguf: the bytes as a file through models.gguf_file.open_gguf; on success every tensor is read and
  dequantized, and the tokenizer built when the file has one. Only ModelFormatError / TokenizerError may come
  out.
- tokenizer: the bytes drive the choice of GGUF tokenizer metadata (kinds, types, lengths, ids, merges: true
  and lying), then models.tokenizer.load_tokenizer; a built tokenizer must encode, decode and stream, and the
  streamed pieces must add up to decode(). Only TokenizerError may come out.
"""

from __future__ import annotations

import argparse
import atexit
import os
import random
import re
import resource
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parent / "corpus"
ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 10  # one input; a parse or a tiny tokenizer build takes milliseconds
RSS_LIMIT_MB = 2048
MAX_LEN = {"gguf": 16384, "tokenizer": 4096}


# --- the targets ----------------------------------------------------------------------------------------

_scratch: list[Path] = []


def scratch_file() -> Path:
    """Where gguf_target writes its input: the run's work folder (EDGE_FUZZ_WORK), else a temporary one."""
    if not _scratch:
        work = os.environ.get("EDGE_FUZZ_WORK")
        folder = Path(work) if work else Path(tempfile.mkdtemp(prefix="edge-fuzz-"))
        if not work:
            atexit.register(shutil.rmtree, folder, True)
        _scratch.append(folder / "input.gguf")
    return _scratch[0]


def exercise_tokenizer(tok: Any, texts: Sequence[str]) -> None:
    """What a built tokenizer must survive: encoding, decoding every id, streaming equal to decoding."""
    from edge.errors import TokenizerError

    n = min(tok.vocab_size, 4096)
    for text in texts:
        try:
            ids = tok.encode(text)
        except TokenizerError:  # lone surrogates; a vocabulary without the byte tokens a character needs
            continue
        assert all(0 <= i < tok.vocab_size for i in ids), ids
        tok.decode(ids)
    everything = list(range(n))
    whole = tok.decode(everything)
    stream = tok.stream()
    pieces = [stream.push(i) for i in everything] + [stream.flush()]
    assert "".join(pieces) == whole, "streamed text differs from decode()"


def gguf_target(data: bytes) -> None:
    from edge.errors import ModelFormatError, TokenizerError
    from edge.models.gguf_file import open_gguf
    from edge.models.tokenizer import load_tokenizer

    path = scratch_file()
    path.unlink(missing_ok=True)  # a new inode: a mapping of the previous input never sees this one
    path.write_bytes(data)
    try:
        g = open_gguf(path)
        for name in g.tensors:
            g.tensor_array(name)  # in the file by construction: bounded by the input's size
        if "tokenizer.ggml.model" in g.metadata:
            exercise_tokenizer(load_tokenizer(g.metadata), ("hello world", "日本 🤖\u2028", "<s>a</s>"))
    except (ModelFormatError, TokenizerError):
        pass


class Draw:
    """Values drawn from the fuzzer's bytes (a small FuzzedDataProvider that needs no atheris)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def int_in(self, lo: int, hi: int) -> int:
        span = hi - lo + 1
        width = max(1, (span.bit_length() + 7) // 8)
        chunk = self.data[self.pos : self.pos + width]
        self.pos += width
        return lo + int.from_bytes(chunk, "little") % span if chunk else lo

    def flag(self) -> bool:
        return self.int_in(0, 1) == 1

    def pick(self, options: Sequence[Any]) -> Any:
        return options[self.int_in(0, len(options) - 1)]

    def number(self) -> float:
        chunk = self.data[self.pos : self.pos + 4].ljust(4, b"\0")
        self.pos += 4
        return float(struct.unpack("<f", chunk)[0])

    def text(self, max_chars: int) -> str:
        return "".join(self.char() for _ in range(self.int_in(0, max_chars)))

    def char(self) -> str:
        if self.flag():
            return self.pick(_ALPHABET)
        return chr(self.int_in(0, 0x10FFFF))  # any code point, lone surrogates included


_ALPHABET = [
    *"ab hel lo wr\n\t'?!.,é日本中▁Ġ<>|/",
    "🤖",
    "👍🏽",
    "\u2028",
    "\u0301",
    "\ufeff",
    "\x00",
    "\udcff",
]
_SPECIALS = ["<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<eos>", "<|fim_pad|>"]
_PRE = ["default", "gpt-2", "llama-bpe", "qwen2", "smollm", "starcoder", "deepseek-llm", "", "bogus"]


def tokenizer_metadata(d: Draw) -> dict[str, Any]:
    """GGUF tokenizer metadata, mostly plausible and lying in drawn ways."""
    import numpy as np

    from edge.models.tokenizer import _gpt2_byte_chars

    model = d.pick(["llama", "gpt2", "gpt2", "llama", "bert", ""])
    byte_chars = _gpt2_byte_chars()
    tokens: list[str] = []
    for _ in range(d.int_in(0, 48)):
        kind = d.int_in(0, 5)
        if kind == 0:
            tokens.append(d.pick(_SPECIALS))
        elif kind == 1:
            tokens.append(d.pick([f"<0x{d.int_in(0, 255):02X}>", "<0xZZ>", "<0x", "<0x-1>", "<0x+F>"]))
        elif kind == 2:
            tokens.append("".join(d.pick(byte_chars) for _ in range(d.int_in(1, 3))))
        elif kind == 3:
            tokens.append("▁" + d.text(3))
        else:
            tokens.append(d.text(4))
    if d.flag():  # a usable core: byte tokens (SPM) or the 256 byte characters (BPE)
        core = [f"<0x{b:02X}>" for b in range(256)] if model == "llama" else byte_chars
        tokens = [*core, *tokens]
    n = len(tokens)
    meta: dict[str, Any] = {"tokenizer.ggml.model": model, "tokenizer.ggml.tokens": tokens}
    if d.flag():
        length = max(0, n + d.int_in(-2, 2)) if d.flag() else n
        kind = d.int_in(0, 3)
        if kind == 0:
            meta["tokenizer.ggml.token_type"] = np.array([d.int_in(-2, 8) for _ in range(length)], np.int32)
        elif kind == 1:
            meta["tokenizer.ggml.token_type"] = np.array([d.int_in(1, 6) for _ in range(length)], np.uint8)
        elif kind == 2:
            meta["tokenizer.ggml.token_type"] = np.array(
                [float(d.int_in(1, 6)) for _ in range(length)], np.float32
            )
        else:
            meta["tokenizer.ggml.token_type"] = ["1"] * length
    if d.flag():
        length = max(0, n + d.int_in(-1, 1)) if d.flag() else n
        kind = d.int_in(0, 2)
        if kind == 0:
            meta["tokenizer.ggml.scores"] = np.array([d.number() for _ in range(length)], np.float32)
        elif kind == 1:
            meta["tokenizer.ggml.scores"] = [d.text(2) for _ in range(length)]
        else:
            meta["tokenizer.ggml.scores"] = d.number()
    for key in ("bos", "eos", "unknown", "padding", "eot", "fim_pre", "seperator"):
        if d.int_in(0, 3) == 0:
            meta[f"tokenizer.ggml.{key}_token_id"] = d.pick(
                [
                    d.int_in(0, n + 2),
                    d.int_in(-(2**31), 2**31),
                    2**64 - 1,
                    "1",
                    1.0,
                    True,
                    np.int64(d.int_in(0, n)),
                ]
            )
    for key in ("add_bos_token", "add_eos_token", "add_space_prefix"):
        if d.int_in(0, 3) == 0:
            meta[f"tokenizer.ggml.{key}"] = d.pick([True, False, 1, "yes", np.bool_(True)])
    if model == "gpt2" or d.int_in(0, 7) == 0:
        meta["tokenizer.ggml.pre"] = d.pick(_PRE) if d.int_in(0, 7) else d.text(6)
        merges = []
        for _ in range(d.int_in(0, 24)):
            if tokens and d.int_in(0, 3):
                merges.append(f"{d.pick(tokens)} {d.pick(tokens)}")
            else:
                merges.append(d.text(5))
        meta["tokenizer.ggml.merges"] = merges if d.int_in(0, 7) else d.pick([None, "a b", [1, 2]])
    if d.int_in(0, 7) == 0:
        meta["general.name"] = d.pick(["phi-3", "modern-bert", "x"])
    return {k: v for k, v in meta.items() if v is not None}


def tokenizer_target(data: bytes) -> None:
    from edge.errors import TokenizerError
    from edge.models.tokenizer import load_tokenizer

    d = Draw(data)
    meta = tokenizer_metadata(d)
    texts = [d.text(12) for _ in range(3)]
    try:
        tok = load_tokenizer(meta)
    except TokenizerError:
        return
    exercise_tokenizer(tok, texts)


TARGETS: dict[str, Callable[[bytes], None]] = {"gguf": gguf_target, "tokenizer": tokenizer_target}


# --- the seed corpus --------------------------------------------------------------------------------------


def _clear(folder: Path) -> None:
    """Empty a corpus folder but for its regression inputs (inputs that once crashed: kept forever)."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        if not f.name.startswith("regression-"):
            f.unlink()


def make_corpus() -> None:
    """Small seeds: valid files of every kind the reader knows, a few broken ones, random draws."""
    import gguf

    from tests.gguf_factory import craft_gguf, pack_kv, pack_string, pack_tensor_info, write_tiny_gguf
    from tests.models.test_tokenizer import tiny_bpe_meta, tiny_spm_meta

    out = CORPUS / "gguf"
    _clear(out)
    write_tiny_gguf(out / "tiny-all-types.gguf")
    write_tiny_gguf(out / "tiny-aligned-64.gguf", alignment=64)
    for name, meta in (("spm", tiny_spm_meta()), ("bpe", tiny_bpe_meta())):
        w = gguf.GGUFWriter(out / f"tokenizer-{name}.gguf", "llama")
        for key, value in meta.items():
            if isinstance(value, str):
                w.add_key_value(key, value, gguf.GGUFValueType.STRING)
            elif isinstance(value, bool):
                w.add_key_value(key, value, gguf.GGUFValueType.BOOL)
            elif isinstance(value, int):
                w.add_key_value(key, value, gguf.GGUFValueType.UINT32)
            elif hasattr(value, "dtype"):
                sub = gguf.GGUFValueType.FLOAT32 if value.dtype.kind == "f" else gguf.GGUFValueType.INT32
                w.add_key_value(key, value.tolist(), gguf.GGUFValueType.ARRAY, sub)
            else:
                w.add_key_value(key, list(value), gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    arch = pack_kv("general.architecture", 8, pack_string("llama"))
    (out / "one-tensor.gguf").write_bytes(craft_gguf([arch], [pack_tensor_info("w", (4,), 0, 0)], b"\0" * 16))
    (out / "array-2p63.gguf").write_bytes(craft_gguf([pack_kv("a", 9, struct.pack("<IQ", 0, 2**63))]))
    (out / "truncated.gguf").write_bytes((out / "tiny-all-types.gguf").read_bytes()[:600])
    tok = CORPUS / "tokenizer"
    _clear(tok)
    rng = random.Random(9)
    for i in range(12):
        (tok / f"seed-{i:02d}.bin").write_bytes(
            bytes(rng.randrange(256) for _ in range(rng.choice((64, 256, 1024))))
        )


# --- running ----------------------------------------------------------------------------------------------


def _child_atheris(target: str, argv0: str, flags: Sequence[str]) -> None:
    """libFuzzer (through atheris) on one target; `argv0` is the executable libFuzzer re-runs to merge."""
    import atheris

    with atheris.instrument_imports(include=["edge"]):
        import edge.models.gguf_file
        import edge.models.tokenizer  # noqa: F401
    atheris.Setup([argv0, *flags], TARGETS[target])
    atheris.Fuzz()


def _libfuzzer_executable(work: Path, target: str) -> Path:
    """A script libFuzzer can run as its own binary (it re-executes argv[0] for -merge)."""
    path = work / f"libfuzzer-{target}"
    python, root = shlex.quote(sys.executable), shlex.quote(str(ROOT))
    path.write_text(
        f'#!/bin/sh\ncd {root} && exec {python} -m tests.reliability.fuzz --libfuzzer {target} "$0" "$@"\n'
    )
    path.chmod(0o755)
    return path


def _mutate(rng: random.Random, data: bytes, max_len: int) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        pos = rng.randrange(len(b) + 1)
        if op == 0 and b:
            b[pos % len(b)] ^= 1 << rng.randrange(8)
        elif op == 1 and b:
            b[pos % len(b)] = rng.randrange(256)
        elif op == 2:
            b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op == 3:
            del b[pos : pos + rng.randint(1, 64)]
        elif op == 4 and len(b) >= 8:  # an interesting u64 over a length, count, dimension or offset
            at = rng.randrange(len(b) - 7)
            b[at : at + 8] = struct.pack(
                "<Q", rng.choice([0, 1, 2**31, 2**32, 2**40, 2**62, 2**63, 2**64 - 1])
            )
        else:
            del b[pos:]
    return bytes(b[:max_len])


class _InputTimeout(Exception):
    pass


def _child_fallback(target: str, seconds: int, artifacts: Path) -> None:
    """Without atheris: seeded mutations of the corpus, each input under an alarm and an RSS check."""

    def alarm(signum: int, frame: object) -> None:
        raise _InputTimeout

    signal.signal(signal.SIGALRM, alarm)
    seeds = [p.read_bytes() for p in sorted((CORPUS / target).iterdir())] or [b""]
    rng = random.Random(1)
    fn, runs, end = TARGETS[target], 0, time.monotonic() + seconds
    pool = list(seeds)
    while time.monotonic() < end:
        data = _mutate(rng, rng.choice(pool), MAX_LEN[target]) if runs >= len(seeds) else seeds[runs]
        signal.setitimer(signal.ITIMER_REAL, TIMEOUT_S)
        try:
            fn(data)
        except _InputTimeout:
            _save(artifacts, "timeout", data)
            print(f"timeout: an input ran over {TIMEOUT_S} s", file=sys.stderr)
            sys.exit(70)
        except BaseException:
            _save(artifacts, "crash", data)
            raise
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        runs += 1
        if _peak_rss_kib() > RSS_LIMIT_MB * 1024:
            _save(artifacts, "oom", data)
            print(f"out-of-memory: RSS over {RSS_LIMIT_MB} MB", file=sys.stderr)
            sys.exit(71)
        if rng.random() < 0.02 and len(pool) < 500:
            pool.append(data)  # no coverage signal here: keep a few mutants to go deeper
    print(f"Done {runs} runs in {seconds} second(s)", file=sys.stderr)


def _peak_rss_kib() -> int:
    """This process's own peak RSS. Not ru_maxrss: after a vfork+exec it starts at the parent's peak."""
    match = re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text())
    return int(match.group(1)) if match else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _save(folder: Path, kind: str, data: bytes) -> None:
    import hashlib

    (folder / f"{kind}-{hashlib.sha1(data).hexdigest()}").write_bytes(data)


def _update_corpus(target: str, exe: str, work: Path, new_corpus: Path, env: dict[str, str]) -> None:
    """Re-minimize the repository's corpus: the named seeds stay, and of the earlier merged inputs and this
    run's new ones, libFuzzer keeps a set that covers what they add (so the corpus does not only grow)."""
    corpus = CORPUS / target
    merged, pool = work / "merged", work / "pool"
    merged.mkdir()
    pool.mkdir()
    for f in corpus.iterdir():
        shutil.copy(f, pool if _is_merged(f) else merged)
    for f in new_corpus.iterdir():
        shutil.copy(f, pool)
    before = len(list(corpus.iterdir()))
    cmd = [exe, "-merge=1", f"-max_len={MAX_LEN[target]}", str(merged), str(pool)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        print(f"  corpus {target}: merge failed (exit {proc.returncode}); left as it was", file=sys.stderr)
        return
    for f in list(corpus.iterdir()):
        if _is_merged(f):
            f.unlink()
    for f in merged.iterdir():
        if _is_merged(f):
            shutil.copy(f, corpus)
    files = list(corpus.iterdir())
    size = sum(f.stat().st_size for f in files)
    print(f"  corpus {target}: {before} -> {len(files)} files, {size:,} bytes")


def _is_merged(f: Path) -> bool:
    """libFuzzer names the inputs it keeps by their SHA-1; hand-made seeds and regressions have names."""
    return re.fullmatch(r"[0-9a-f]{40}", f.name) is not None


def run_target(target: str, seconds: int, engine: str, update_corpus: bool = False) -> bool:
    """Fuzz one target in a child process; print its execution count; True when nothing was found."""
    work = Path(tempfile.mkdtemp(prefix=f"edge-fuzz-{target}-"))
    new_corpus, artifacts = work / "new", work / "artifacts"
    new_corpus.mkdir()
    artifacts.mkdir()
    if engine == "atheris":
        exe = _libfuzzer_executable(work, target)
        cmd = [str(exe), str(new_corpus), str(CORPUS / target), f"-max_total_time={seconds}"]
        cmd += [f"-timeout={TIMEOUT_S}", f"-rss_limit_mb={RSS_LIMIT_MB}", f"-max_len={MAX_LEN[target]}"]
        cmd += [f"-artifact_prefix={artifacts}/", "-print_final_stats=1", "-seed=1"]
    else:
        cmd = [sys.executable, "-m", "tests.reliability.fuzz", "--child", target, "--seconds", str(seconds)]
        cmd += ["--work", str(work)]
    start = time.monotonic()
    env = {**os.environ, "EDGE_FUZZ_WORK": str(work)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=seconds * 3 + 300)
    elapsed = time.monotonic() - start
    log = proc.stdout + proc.stderr
    runs = re.findall(r"Done (\d+) runs", log) or re.findall(r"number_of_executed_units: (\d+)", log)
    count = int(runs[-1]) if runs else 0
    seeds = len(list((CORPUS / target).iterdir()))
    found = sorted(p.name for p in artifacts.iterdir())
    ok = proc.returncode == 0 and not found and count > 0
    print(
        f"fuzz {target} ({engine}): {count:,} executions in {elapsed:.0f} s, "
        f"corpus {seeds} seeds + {len(list(new_corpus.iterdir()))} new inputs: "
        + (
            "no crash, hang or excess memory"
            if ok
            else f"FAILED (exit {proc.returncode}; artifacts {artifacts})"
        )
    )
    if not ok:
        print(log[-6000:], file=sys.stderr)
        for name in found:
            print(
                f"  reproduce: python -m tests.reliability.fuzz --replay {target} {artifacts / name}",
                file=sys.stderr,
            )
    elif update_corpus and engine == "atheris":
        _update_corpus(target, cmd[0], work, new_corpus, env)
    if ok:
        shutil.rmtree(work, ignore_errors=True)
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=int, default=60, help="total time, split between the targets")
    p.add_argument("--target", choices=sorted(TARGETS), action="append", help="default: all")
    p.add_argument("--engine", choices=("auto", "atheris", "mutate"), default="auto")
    p.add_argument("--make-corpus", action="store_true")
    p.add_argument("--update-corpus", action="store_true", help="merge new coverage into the corpus")
    p.add_argument("--replay", nargs=2, metavar=("TARGET", "FILE"), help="run one input (a reproducer)")
    p.add_argument("--child", choices=sorted(TARGETS), help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--libfuzzer"]:  # the libFuzzer child: TARGET ARGV0 libFuzzer-flags...
        _child_atheris(argv[1], argv[2], argv[3:])
        return 0
    args = p.parse_args(argv)
    if args.make_corpus:
        make_corpus()
        return 0
    if args.replay:
        TARGETS[args.replay[0]](Path(args.replay[1]).read_bytes())
        print("no failure")
        return 0
    if args.child:
        _child_fallback(args.child, args.seconds, args.work / "artifacts")
        return 0
    engine = args.engine
    if engine == "auto":
        try:
            import atheris  # noqa: F401

            engine = "atheris"
        except ImportError:
            engine = "mutate"
            print("fuzz: atheris is not installed; running seeded mutation fuzzing instead", file=sys.stderr)
    targets = args.target or sorted(TARGETS)
    share = max(1, args.seconds // len(targets))
    results = [run_target(t, share, engine, args.update_corpus) for t in targets]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
