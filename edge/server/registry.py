"""Which models the server may serve, and loading them.

A request names a model by its id: one of the models named at start (a catalog name, or a file's name for a
path given on the command line) or, with `--models-max` above their count, a catalog model already pulled into
the cache. A request never reaches the file system with a name of its own: anything else is unknown (404).
A model idle past its keep-alive (the server's `--keep-alive`, or a request's own) is unloaded, and loaded
again by its next request.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import edge.api
import edge.model
from edge.errors import EdgeError, ModelInUseError, ModelNotFoundError
from edge.server.config import LoadSettings, ServerConfig
from edge.server.scheduler import Scheduler

__all__ = ["ModelBusyError", "Registry"]

log = logging.getLogger("edge.server")


# a request that has asked for its model renders and queues within this, or the reaper may unload it
ON_ITS_WAY_S = 30.0


def _give_back_memory() -> None:
    """Return the heap a closed model freed to the system (glibc keeps freed arenas otherwise: with it, an
    unloaded qwen2.5-coder-0.5b left 139 MiB of a 744 MiB server, without it 217)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)


class ModelBusyError(EdgeError):
    """`--models-max` models are loaded and all of them are serving requests."""


Loader = Callable[[str, LoadSettings, int | None, int], edge.model.Model]


def load_model(ref: str, settings: LoadSettings, n_threads: int | None, parallel: int) -> edge.model.Model:
    return edge.api.load(
        ref,
        device=settings.device,
        backend=settings.backend,
        draft=settings.draft,
        fallback=settings.fallback,
        n_ctx=settings.n_ctx,
        n_threads=n_threads,
        draft_device=settings.draft_device,
        draft_k=settings.draft_k,
        emulate=settings.emulate,
        precision=settings.precision,
        parallel=parallel,
        plan=settings.plan,
        kv_dtype=settings.kv_dtype,
    )


@dataclass(frozen=True)
class _Known:
    ref: str  # what edge.load gets: a catalog name, or the path named at start
    pinned: bool  # named at start: never evicted to make room (a keep-alive may still unload it)


class Registry:
    def __init__(self, config: ServerConfig, loader: Loader = load_model) -> None:
        self.config = config
        self._loader = loader
        self._lock = threading.Lock()  # one load at a time
        self._loaded: dict[str, Scheduler] = {}
        self._known: dict[str, _Known] = {}
        self._keep: dict[str, float | None] = {}  # a request's own keep-alive per model (seconds; None: ever)
        self._wanted: dict[str, float] = {}  # when a request last asked for each model (time.monotonic())
        self._embedders: list[str] = []  # the embeddings route's models: listed, answered there only
        self.created = int(time.time())

    # -- names -----------------------------------------------------------------------------------
    def _catalog_pulled(self) -> list[str]:
        from edge.models.catalog import CATALOG
        from edge.models.store import is_verified

        return [name for name, entry in CATALOG.items() if not entry.embedding and is_verified(entry)]

    def list_embedders(self, names: list[str]) -> None:
        """Embedding models served by /v1/embeddings (edge/server/embeddings.py): in `names()` (so /v1/models
        lists them), a 400 saying so when a chat or completion request names one."""
        self._embedders = list(names)

    def chat_names(self) -> list[str]:
        return [n for n in self.names() if n not in self._embedders]

    def names(self) -> list[str]:
        """Model ids a request may name."""
        names = list(self._known)
        if self.config.models_max > sum(k.pinned for k in self._known.values()):
            names += [n for n in self._catalog_pulled() if n not in names]
        return names + [n for n in self._embedders if n not in names]

    # -- loading ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Load the models named at start (the catalog default when none is)."""
        from edge.models.catalog import DEFAULT_MODEL
        from edge.models.encoder_source import is_embedding_model

        # embedding models are the embeddings route's (edge/server/embeddings.py); named alone, no chat model
        chat = [ref for ref in self.config.models if not is_embedding_model(ref)]
        for ref in chat if self.config.models else (DEFAULT_MODEL,):
            sched = self._load(ref)
            self._known[sched.name] = _Known(ref, pinned=True)
            self._loaded[sched.name] = sched
            self._warm_up(sched)

    @staticmethod
    def _warm_up(sched: Scheduler) -> None:
        """A model named at start warms up in the background while the server waits for its first request
        (`Model.warm_up`: the backend's first-run costs and the chat template's opening prefilled); a request
        that comes sooner waits for it. A model loaded on demand is not warmed: a request is already waiting."""

        def warm(model: edge.model.Model) -> None:
            t0 = time.monotonic()
            held = model.warm_up()
            log.info(
                "warmed up %s in %.1f s (%d opening tokens prefilled)",
                model.name,
                time.monotonic() - t0,
                held,
            )

        for i, model in enumerate(sched.replicas):
            threading.Thread(
                target=warm, args=(model,), name=f"edge-warm-up-{sched.name}-{i}", daemon=True
            ).start()

    def _replica_threads(self) -> int | None:
        """Threads of each of `--parallel` replicas: the physical cores split between them."""
        s = self.config.load
        if s.n_threads is not None or self.config.parallel == 1:
            return s.n_threads
        import psutil

        cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
        return max(1, cores // self.config.parallel)

    def _load(self, ref: str) -> Scheduler:
        """`--parallel N`: N slots of one model where its backend batches (one copy of the weights, each
        slot its own KV, their steps in one forward: devices/batch.py, devices/llamacpp_batch.py); else (a
        draft model, a backend that does not batch) N replicas, each a whole copy with its share of the
        cores, said in the log."""
        n = self.config.parallel
        log.info("loading model %s%s", ref, "" if n == 1 else f" for {n} requests at once")
        t0 = time.monotonic()
        if n > 1 and self.config.load.draft not in (None, "auto", "ngram", "none"):
            # a draft model per slot would be a copy each (Model.slots refuses it): replicas, each with its draft
            log.info("%s: draft model %s: %d replicas, not slots", ref, self.config.load.draft, n)
            models = self._replicas(ref, n)
            return self._scheduler(ref, models, t0, batched=False)
        first = self._loader(ref, self.config.load, self.config.load.n_threads, n)
        batched = n > 1 and first.batches
        if n == 1:
            models = [first]
        elif batched:
            try:
                models = first.slots(n)
            except BaseException:
                first.close()
                raise
            copy = (
                "each half's weights once"
                if first.decoder.capabilities().phases
                else "one copy of the weights"
            )
            log.info("%s: %d slots on %s (continuous batching)", ref, n, copy)
        else:
            backend = first.backend
            first.close()
            log.info("%s: %s does not batch sequences: %d replicas, %s threads each",
                     ref, backend, n, self._replica_threads() or "default")  # fmt: skip
            models = self._replicas(ref, n)
        return self._scheduler(ref, models, t0, batched=batched)

    def _scheduler(self, ref: str, models: list[edge.model.Model], t0: float, *, batched: bool) -> Scheduler:
        m = models[0]
        note = f", fallback {m.fallback}" if m.fallback else ""
        auto = m.placement.auto
        note += f", backend {auto.label}" if auto is not None else ""
        note += f"; {m.placement.note}" if m.placement.note else ""
        log.info(
            "loaded model %s as %r on %s:%s in %.1f s%s",
            ref, m.name, m.backend, m.device, time.monotonic() - t0, note,
        )  # fmt: skip
        return Scheduler(models, self.config.limits.queue_size, batched=batched)

    def _replicas(self, ref: str, n: int) -> list[edge.model.Model]:
        replicas: list[edge.model.Model] = []
        try:
            for _ in range(n):
                replicas.append(self._loader(ref, self.config.load, self._replica_threads(), 1))
        except BaseException:
            for r in replicas:
                r.close()
            raise
        return replicas

    def get(self, name: str) -> Scheduler:
        """The scheduler of model `name`, loading a pulled catalog model on demand (blocking: call it off the
        event loop). Unknown names, paths included, raise ModelNotFoundError."""
        sched = self._loaded.get(name)
        if sched is not None:
            return sched
        if name in self._embedders:
            from edge.server.unsupported import UnsupportedValue

            raise UnsupportedValue("model", f"{name} is an embedding model: POST /v1/embeddings")
        self._check_known(name)
        with self._lock:
            sched = self._loaded.get(name)
            if sched is not None:
                return sched
            self._check_known(name)  # again: a delete (Registry.unused) may have held the lock meanwhile
            if len(self._loaded) >= self.config.models_max:
                self._evict()
            known = self._known.get(name)
            sched = self._load(name if known is None else known.ref)  # one named at start: its own ref
            self._known.setdefault(name, _Known(name, pinned=False))
            self._loaded[name] = sched
            return sched

    def _check_known(self, name: str) -> None:
        if name not in self.names():
            raise ModelNotFoundError(
                f"the model {name!r} does not exist on this server",
                hint="GET /v1/models lists the ones it serves",
            )

    # -- keep-alive ------------------------------------------------------------------------------
    def keep_alive(self, name: str, seconds: float | None) -> None:
        """How long model `name` stays loaded after its last request, from now on (Ollama's keep_alive)."""
        self._keep[name] = seconds

    def keep_of(self, name: str) -> float | None:
        return self._keep.get(name, self.config.keep_alive_s)

    def expires(self, name: str) -> float | None:
        """When model `name` unloads if nothing uses it (time.time()), None: it stays."""
        sched, keep = self._loaded.get(name), self.keep_of(name)
        if sched is None or keep is None:
            return None
        return time.time() + max(0.0, sched.last_used + keep - time.monotonic())

    def reap(self) -> list[str]:
        """Unload each idle model past its keep-alive (the next request for it loads it again)."""
        gone = []
        with self._lock:
            for name, sched in list(self._loaded.items()):
                if self._idle_past_keep(name, sched):
                    log.info("unloading model %s: idle for its keep-alive (%g s)", name, self.keep_of(name))
                    self._loaded.pop(name).close()
                    gone.append(name)
        if gone:
            _give_back_memory()
        return gone

    def _idle_past_keep(self, name: str, sched: Scheduler) -> bool:
        keep, now = self.keep_of(name), time.monotonic()
        wanted = self._wanted.get(name, 0.0)
        on_its_way = wanted > sched.last_used and now - wanted < ON_ITS_WAY_S  # asked for, not yet queued
        return keep is not None and not on_its_way and not sched.busy and now - sched.last_used >= keep

    def unload(self, name: str) -> bool:
        """Unload model `name` now unless it is serving requests; False when it was not loaded or is busy."""
        with self._lock:
            sched = self._loaded.get(name)
            if sched is None or sched.busy:
                return False
            log.info("unloading model %s on request", name)
            self._loaded.pop(name).close()
        _give_back_memory()
        return True

    def _evict(self) -> None:
        idle = [(s.last_used, n) for n, s in self._loaded.items() if not self._known[n].pinned and not s.busy]
        if not idle:
            raise ModelBusyError(
                f"{len(self._loaded)} models are loaded (--models-max {self.config.models_max}) and busy",
                hint="retry later, or start the server with a higher --models-max",
            )
        _, name = min(idle)
        log.info("unloading model %s to make room", name)
        self._loaded.pop(name).close()

    def loaded(self) -> dict[str, Scheduler]:
        return dict(self._loaded)

    @contextlib.contextmanager
    def unused(self, name: str) -> Iterator[None]:
        """Holds the load lock while model `name` is neither loaded nor named at start, so its files can be
        removed (Ollama's /api/delete) without a request starting to load them meanwhile; once they are, the
        server forgets it (a later request is a 404, never a silent pull)."""
        with self._lock:
            known = self._known.get(name)
            if name in self._loaded:
                raise ModelInUseError(
                    f"{name} is loaded on this server; it cannot be deleted while it may serve requests",
                    hint=f'unload it first: POST /api/generate {{"model": "{name}", "keep_alive": 0}}',
                )
            if (known is not None and known.pinned) or name in self._embedders:
                raise ModelInUseError(
                    f"{name} is one of the models this server was started with; it cannot be deleted",
                    hint="stop the server first, or delete it with `edge rm` then",
                )
            yield
            for remembered in (self._known, self._keep, self._wanted):
                remembered.pop(name, None)

    def close(self) -> None:
        for sched in self._loaded.values():
            sched.close()
        self._loaded.clear()
