"""Whether MatMulNBits (level 4, uint8 zero points) gives a row the same bits at any row count, by bits and
block, and what padding a one-row input to two costs, on this CPU (the probe behind the README's AVX2 note).

    python benchmarks/matmulnbits_rows.py
"""

import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(0)


def run(bits, K=256, N=64, block=32, zp=True, level=4):
    nb = K // block
    blob_size = block * bits // 8
    codes = rng.integers(0, 256, (N, nb, blob_size), dtype=np.uint8)
    scales = rng.random((N * nb,), dtype=np.float32) * 0.1
    inits = [numpy_helper.from_array(codes, "B"), numpy_helper.from_array(scales, "S")]
    ins = ["A", "B", "S"]
    if zp:
        if bits == 4:
            z = rng.integers(0, 256, (N, (nb + 1) // 2), dtype=np.uint8).reshape(-1)
        else:
            z = rng.integers(0, 256, (N * nb,), dtype=np.uint8)
        inits.append(numpy_helper.from_array(z, "Z"))
        ins.append("Z")
    node = helper.make_node(
        "MatMulNBits",
        ins,
        ["Y"],
        domain="com.microsoft",
        K=K,
        N=N,
        bits=bits,
        block_size=block,
        accuracy_level=level,
    )
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])],
        inits,
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    X = rng.standard_normal((40, K)).astype(np.float32)
    ref = {M: s.run(None, {"A": X[:M]})[0] for M in range(1, 40)}
    # row i of M rows vs row i of 39 rows
    bad = [M for M in range(1, 40) if not np.array_equal(ref[M], ref[39][:M])]
    return bad


for bits in (4, 8):
    for zp in (True, False):
        for block in (16, 32):
            print(bits, "zp" if zp else "nozp", block, run(bits, block=block, zp=zp))


def sess(K, N, pad, bits=4, block=32):
    nb = K // block
    codes = rng.integers(0, 256, (N, nb, block * bits // 8), dtype=np.uint8)
    scales = rng.random((N * nb,), dtype=np.float32) * 0.1
    z = rng.integers(0, 256, (N, (nb + 1) // 2), dtype=np.uint8).reshape(-1)
    inits = [
        numpy_helper.from_array(codes, "B"),
        numpy_helper.from_array(scales, "S"),
        numpy_helper.from_array(z, "Z"),
    ]
    nodes = []
    a = "A"
    if pad:
        inits.append(numpy_helper.from_array(np.zeros((1, 1, K), np.float32), "P"))
        nodes.append(helper.make_node("Concat", ["A", "P"], ["AP"], axis=1))
        a = "AP"
    nodes.append(
        helper.make_node(
            "MatMulNBits",
            [a, "B", "S", "Z"],
            ["Y0" if pad else "Y"],
            domain="com.microsoft",
            K=K,
            N=N,
            bits=bits,
            block_size=block,
            accuracy_level=4,
        )
    )
    if pad:
        for nm, v in (("st", [0]), ("en", [-1]), ("ax", [1])):
            inits.append(numpy_helper.from_array(np.array(v, np.int64), nm))
        nodes.append(helper.make_node("Slice", ["Y0", "st", "en", "ax"], ["Y"]))
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, "M", K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, "M", N])],
        inits,
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


for K, N in ((1536, 8960), (8960, 1536), (1536, 2048)):
    s0, s1 = sess(K, N, False), sess(K, N, True)
    x = rng.standard_normal((1, 1, K)).astype(np.float32)
    for s in (s0, s1):
        for _ in range(20):
            s.run(None, {"A": x})
    ts = {0: [], 1: []}
    for _ in range(200):
        for i, s in ((0, s0), (1, s1)):
            t = time.perf_counter()
            s.run(None, {"A": x})
            ts[i].append(time.perf_counter() - t)
    m0, m1 = np.median(ts[0]) * 1e3, np.median(ts[1]) * 1e3
    y0 = s0.run(None, {"A": x})[0]
    y1 = s1.run(None, {"A": x})[0]
    print(
        K,
        N,
        f"M=1 {m0:.3f} ms  pad {m1:.3f} ms  x{m1 / m0:.3f}",
        "equal" if np.array_equal(y0, y1) else "differ",
    )
