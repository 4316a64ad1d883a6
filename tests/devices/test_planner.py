"""The planner on described devices: no hardware needed to check what it decides and why."""

from __future__ import annotations

import pytest

from edge.devices.planner import DeviceProfile, ModelProfile, Target, model_profile, parse_device, plan
from edge.errors import DeviceError

GB = 1 << 30
MB = 1 << 20


def qwen_like(n_ctx: int = 4096, head: int = 140 * MB) -> ModelProfile:
    """24 layers of 15 MB, a 140 MB head, 1 KiB of fp32 KV per token per layer (like qwen2.5-0.5b)."""
    return ModelProfile(24, (15 * MB,) * 24, head, 140 * MB, (1 << 10,) * 24, n_ctx)


CPU = DeviceProfile("llamacpp", "cpu", "cpu", 16 * GB, 20.0, measured=True)
OV_CPU = DeviceProfile("openvino", "cpu", "CPU", 16 * GB, 20.0, measured=True)
ORT_CPU = DeviceProfile("ort", "cpu", "CPUExecutionProvider", 16 * GB, 20.0, measured=True)
IGPU = DeviceProfile("openvino", "gpu", "GPU.0", 8 * GB, 60.0, measured=True)  # shares system memory
NPU = DeviceProfile("openvino", "npu", "NPU", 4 * GB, 40.0, dynamic_shapes=False, measured=True)


def test_parse_device() -> None:
    assert parse_device("cpu") == ("single", [Target("cpu")])
    assert parse_device("openvino:npu") == ("single", [Target("npu", "openvino")])
    assert parse_device("auto") == ("auto", [])
    assert parse_device("hetero:openvino:cpu,ort:cpu") == (
        "hetero",
        [Target("cpu", "openvino"), Target("cpu", "ort")],
    )
    assert parse_device("HETERO:npu, cpu")[1] == [Target("npu"), Target("cpu")]
    for bad in ("tpu", "hetero:cpu", "hetero:", "cpu,gpu", "", "hetero:openvino:fpga,cpu"):
        with pytest.raises(DeviceError):
            parse_device(bad)


def test_one_device_holds_the_whole_model_on_the_preferred_backend() -> None:
    p = plan(qwen_like(), [OV_CPU, CPU, ORT_CPU], "single", [Target("cpu")])
    (part,) = p.partitions
    assert part.device is CPU and part.head and part.layers == range(24) and p.fallback is None
    assert (
        plan(qwen_like(), [OV_CPU, CPU], "single", [Target("cpu", "openvino")]).partitions[0].device is OV_CPU
    )


def test_absent_device_is_an_error_listing_what_exists_unless_fallback() -> None:
    with pytest.raises(DeviceError) as err:
        plan(qwen_like(), [CPU, OV_CPU], "single", [Target("npu")])
    assert "no npu" in str(err.value) and "llamacpp:cpu" in str(err.value) and "--fallback" in err.value.hint
    assert "--device npu --emulate" in err.value.hint  # the NPU-shaped graphs run on the CPU
    p = plan(qwen_like(), [CPU, OV_CPU], "single", [Target("npu")], fallback="cpu")
    assert p.fallback == "npu -> llamacpp:cpu" and p.partitions[0].device.kind == "cpu"
    assert "absent" in p.explain()


def test_npu_with_4gb_and_static_shapes() -> None:
    """The model fits the NPU: one static partition; a context too long for its 4 GB is refused."""
    p = plan(qwen_like(), [CPU, NPU], "single", [Target("npu")])
    assert p.partitions[0].device is NPU and p.static
    with pytest.raises(DeviceError, match="holds 4096 MB"):
        plan(qwen_like(n_ctx=1 << 20), [CPU, NPU], "single", [Target("npu")])


def test_auto_picks_the_fastest_device_that_fits() -> None:
    p = plan(qwen_like(), [CPU, OV_CPU, IGPU, NPU], "auto", [])
    assert p.partitions[0].device is IGPU and "fastest" in p.reasons[0]
    small_gpu = DeviceProfile("openvino", "gpu", "GPU.0", 200 * MB, 60.0)
    p = plan(qwen_like(), [CPU, small_gpu], "auto", [])
    assert p.partitions[0].device is CPU  # the iGPU is faster but cannot hold the model


def test_auto_spreads_a_model_no_device_holds() -> None:
    """Two small devices: the fastest is filled first, the rest goes to the next; every byte fits."""
    a = DeviceProfile("openvino", "gpu", "GPU.0", 300 * MB, 60.0)
    b = DeviceProfile("ort", "cpu", "cpu", 400 * MB, 20.0)
    m = qwen_like(n_ctx=4096)
    p = plan(m, [b, a], "auto", [])
    assert [x.device for x in p.partitions] == [a, b] and p.partitions[-1].head
    assert [i for x in p.partitions for i in x.layers] == list(range(24))
    for x in p.partitions:
        assert x.weight_bytes + x.kv_bytes <= x.device.memory_bytes
    assert p.partitions[0].layers.stop > 12  # filled to its memory, not split evenly


def test_hetero_splits_in_proportion_to_speed_and_keeps_the_order() -> None:
    fast = DeviceProfile("openvino", "gpu", "GPU.0", 8 * GB, 60.0)
    slow = DeviceProfile("ort", "cpu", "cpu", 8 * GB, 20.0)
    m = qwen_like(head=30 * MB)
    p = plan(m, [fast, slow], "hetero", [Target("gpu", "openvino"), Target("cpu", "ort")])
    first, second = p.partitions
    assert first.device is fast and second.device is slow and second.head and not first.head
    assert first.layers.start == 0 and first.layers.stop == second.layers.start and second.layers.stop == 24
    # the fast device takes about 3/4 of all bytes (head included): 3 x the time budget of the slow one
    total = sum(m.layer_bytes) + m.head_bytes
    assert abs(first.weight_bytes / total - 0.75) < 0.05
    # equal devices: an even split of the bytes
    p = plan(m, [OV_CPU, ORT_CPU], "hetero", [Target("cpu", "openvino"), Target("cpu", "ort")])
    a, b = p.partitions
    assert abs(a.weight_bytes - b.weight_bytes) <= m.layer_bytes[0] + 1
    assert "openvino:cpu" in p.explain() and "ort:cpu" in p.explain()


def test_hetero_respects_memory_and_names_too_many_devices() -> None:
    tiny = DeviceProfile("openvino", "npu", "NPU", 60 * MB, 100.0, dynamic_shapes=False)
    m = qwen_like(n_ctx=256)
    p = plan(m, [tiny, ORT_CPU], "hetero", [Target("npu"), Target("cpu", "ort")])
    assert p.partitions[0].weight_bytes + p.partitions[0].kv_bytes <= 60 * MB
    with pytest.raises(DeviceError, match="only 2 layers"):
        plan(
            ModelProfile(2, (MB, MB), MB, MB, (1, 1), 8),
            [OV_CPU, ORT_CPU, CPU],
            "hetero",
            [Target("cpu")] * 3,
        )
    nothing = DeviceProfile("openvino", "npu", "NPU", 1 * MB, 100.0)
    with pytest.raises(DeviceError, match="not even one layer"):
        plan(m, [nothing, ORT_CPU], "hetero", [Target("npu"), Target("cpu", "ort")])


def test_model_profile_from_tensor_names() -> None:
    tensors = {
        "token_embd.weight": 100,
        "blk.0.attn_q.weight": 10,
        "blk.0.ffn_up.weight": 20,
        "blk.1.attn_q.weight": 7,
        "output_norm.weight": 1,
    }
    m = model_profile(tensors, 2, [4, 4], 16)
    assert m.layer_bytes == (30, 7) and m.embed_bytes == 100
    assert m.head_bytes == 101  # tied: the head reads the embedding matrix
    assert m.kv(range(2)) == 8 * 16
    m = model_profile({**tensors, "output.weight": 50}, 2, [4, 4], 16)
    assert m.head_bytes == 51
