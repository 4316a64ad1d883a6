"""Partitions (layer ranges, the last with the head) run in sequence equal the whole graph; static shape
specialization leaves no dynamic dim (OpenVINO compiles it fully static) and equal outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge import graph_opt
from edge.graph_opt import LayerRange
from edge.models.convert import static_dims
from edge.models.transformer import BuildOptions
from tests.graph_opt.graphs import (
    ARCHS,
    feeds_for,
    max_abs_diff,
    run_ort,
    tiny_config,
    tiny_gguf,
    tiny_graph,
    to_ir,
)


def test_plan_partitions() -> None:
    assert graph_opt.plan_partitions(30, 2) == [LayerRange(0, 15, False), LayerRange(15, 30, True)]
    plan = graph_opt.plan_partitions(30, 4)
    assert [r.last - r.first for r in plan] == [8, 7, 8, 7] and plan[-1].head
    assert graph_opt.plan_partitions(3, 3) == [
        LayerRange(0, 1, False),
        LayerRange(1, 2, False),
        LayerRange(2, 3, True),
    ]
    # by weight: a heavy first layer gets a partition of its own
    assert graph_opt.plan_partitions(4, 2, [10, 1, 1, 1])[0] == LayerRange(0, 1, False)
    with pytest.raises(ValueError):
        graph_opt.plan_partitions(4, 5)


def test_parse_ranges() -> None:
    assert graph_opt.parse_ranges("0-14,15-29", 30) == [LayerRange(0, 15, False), LayerRange(15, 30, True)]
    for bad in ("0-14,16-29", "1-29", "0-10"):
        with pytest.raises(ValueError):
            graph_opt.parse_ranges(bad, 30)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("target", ["ort", "openvino"])
def test_partitions_in_sequence_equal_the_whole(tmp_path: Path, arch: str, target: str) -> None:
    path = tiny_gguf(tmp_path, arch)
    cfg = tiny_config(path)
    whole = tiny_graph(path)
    feeds = feeds_for(whole, cfg, q=3, past=5)
    want = run_ort(whole, feeds)
    ranges = graph_opt.plan_partitions(cfg.n_layer, 2)
    got: dict[str, np.ndarray] = {}
    hidden = feeds["hidden"]
    for r in ranges:
        model = to_ir(tiny_graph(path, BuildOptions(first_layer=r.first, last_layer=r.last, head=r.head)))
        graph_opt.optimize(model, target)
        names = {v.name for v in model.graph.inputs}
        out = run_ort(model, {**{k: v for k, v in feeds.items() if k in names}, "hidden": hidden})
        assert {f"new_key_{i}" for i in range(r.first, r.last)} <= set(out)
        assert not {f"past_key_{i}" for i in range(cfg.n_layer) if i not in range(r.first, r.last)} & names
        hidden = out.pop("hidden_out", hidden)
        got.update(out)
    assert set(got) == set(want)
    assert max_abs_diff(want, got) < 1e-4


@pytest.mark.parametrize("arch", ARCHS)
def test_static_shapes(tmp_path: Path, arch: str) -> None:
    """q, r, past<k> fixed: no symbolic dim on any input or output, the split-size Shape arithmetic folded
    away, OpenVINO reports every compiled input static, outputs equal the dynamic graph's."""
    import openvino as ov

    path = tiny_gguf(tmp_path, arch)
    cfg = tiny_config(path)
    proto = tiny_graph(path)
    dims = static_dims(cfg, 4, 16)
    model = to_ir(proto)
    graph_opt.optimize(model, "openvino", shapes=dims)
    assert graph_opt.dynamic_dims(model) == []
    assert not [n for n in model.graph.all_nodes() if n.op_type == "Shape"]
    core = ov.Core()
    from tests.graph_opt.graphs import to_proto

    compiled = core.compile_model(core.read_model(to_proto(model).SerializeToString(), b""), "CPU")
    assert all(inp.get_partial_shape().is_static for inp in compiled.inputs)
    # equal outputs: the dynamic graph on the same (full-capacity) inputs
    past = {k: dims.get(f"past{k}", 16) for k in (0, 1)}
    feeds = feeds_for(proto, cfg, q=4, past=past[0])
    for name in list(feeds):
        if name.startswith("mask_1") or (
            name.startswith("past_") and cfg.is_local(int(name.rsplit("_", 1)[1]))
        ):
            q, p1 = 4, past[1]
            shape = (1, 1, q, p1 + q) if name.startswith("mask") else (1, p1, cfg.n_head_kv, cfg.head_dim)
            feeds[name] = feeds[name][..., : shape[-1]] if name.startswith("mask") else feeds[name][:, :p1]
    want = run_ort(proto, feeds)
    assert max_abs_diff(want, run_ort(model, feeds)) < 1e-4
