"""`WeightSpill`: a whole model's passes with one linear's weights in memory at a time.

A pass that rewrites weights (the lowerings) emits each linear's new initializers in memory; over a 7B model
that is the model again, on top of the weights it read. With a spill in the PassContext, `iter_linears` settles
the graph after each linear a pass handled: new initializers' bytes go to the spill file (they come back as
mapped external tensors) and initializers no node reads any more are dropped, their mappings released.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import BinaryIO

import onnx_ir as ir

__all__ = ["WeightSpill"]


class WeightSpill:
    """An append-only external data file for a graph's initializers (closed with `close`, or as a context)."""

    def __init__(self, path: Path, min_bytes: int = 1024) -> None:
        self.path = Path(path)
        self.min_bytes = min_bytes
        self._fh: BinaryIO = open(self.path, "ab")  # noqa: SIM115 (held for the passes' whole run)

    def __enter__(self) -> WeightSpill:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._fh.close()

    def settle(self, model: ir.Model) -> None:
        """Spill the in-memory initializers of at least min_bytes; drop (and unmap) the unread ones."""
        graph = model.graph
        for name, value in list(graph.initializers.items()):
            tensor = value.const_value
            if not value.uses() and not value.is_graph_output():
                graph.initializers.pop(name)
            elif isinstance(tensor, ir.ExternalTensor):
                # its pages were read (a pass looked at the weight): unmapped, read again when needed. One the
                # caller still holds a view of stays mapped until that view is gone
                with contextlib.suppress(BufferError):
                    tensor.release()
            elif tensor is not None and tensor.nbytes >= self.min_bytes:
                value.const_value = self._write(tensor, name)

    def _write(self, tensor: ir.TensorProtocol, name: str) -> ir.ExternalTensor:
        raw = tensor.tobytes()
        offset = self._fh.tell()
        pad = (-offset) % 64  # aligned, as the runtimes like to map them
        self._fh.write(b"\0" * pad + raw)
        self._fh.flush()
        return ir.ExternalTensor(
            self.path.name,
            offset + pad,
            len(raw),
            tensor.dtype,
            shape=tensor.shape,
            name=name,
            base_dir=self.path.parent,
        )
