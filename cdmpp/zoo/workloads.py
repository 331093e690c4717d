"""Small real workloads (matmul, conv2d, softmax, layer norm, fused elementwise) built with TVM's TE.

Used by the README's first command, the tests and the featurize benchmark; the network zoo
(``cdmpp.zoo``) provides the real tasks of real networks.
"""

from __future__ import annotations

from cdmpp.program import tvm_env


def _prim_func(tensors):
    tvm = tvm_env.setup()
    return tvm.IRModule({"main": tvm.te.create_prim_func(tensors)})


def matmul(n: int = 128, m: int = 128, k: int = 128, dtype: str = "float32"):
    tvm = tvm_env.setup()
    te = tvm.te
    a = te.placeholder((n, k), dtype, name="A")
    b = te.placeholder((k, m), dtype, name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((n, m), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="matmul")
    return _prim_func([a, b, c])


def conv2d(batch=1, cin=32, hw=28, cout=64, kernel=3, stride=1, dtype="float32"):
    tvm = tvm_env.setup()
    te, topi = tvm.te, tvm.topi
    x = te.placeholder((batch, cin, hw, hw), dtype, name="X")
    w = te.placeholder((cout, cin, kernel, kernel), dtype, name="W")
    y = topi.nn.conv2d_nchw(x, w, stride, kernel // 2, 1)
    return _prim_func([x, w, y])


def softmax(rows=256, cols=512, dtype="float32"):
    tvm = tvm_env.setup()
    te, topi = tvm.te, tvm.topi
    x = te.placeholder((rows, cols), dtype, name="X")
    return _prim_func([x, topi.nn.softmax(x, axis=1)])


def layer_norm(rows=256, cols=768, dtype="float32"):
    tvm = tvm_env.setup()
    te, topi = tvm.te, tvm.topi
    x = te.placeholder((rows, cols), dtype, name="X")
    g = te.placeholder((cols,), dtype, name="gamma")
    b = te.placeholder((cols,), dtype, name="beta")
    return _prim_func([x, g, b, topi.nn.layer_norm(x, g, b, axis=[1], epsilon=1e-5)])


def fused_elementwise(shape=(8, 64, 56, 56), dtype="float32"):
    """add + relu fused into one block, as a graph compiler would emit it."""
    tvm = tvm_env.setup()
    te = tvm.te
    a = te.placeholder(shape, dtype, name="A")
    b = te.placeholder(shape, dtype, name="B")
    y = te.compute(shape, lambda *i: te.max(a(*i) + b(*i), tvm.tirx.const(0, dtype)), name="add_relu")
    return _prim_func([a, b, y])


SAMPLES = {
    "matmul": matmul,
    "conv2d": conv2d,
    "softmax": softmax,
    "layer_norm": layer_norm,
    "fused_elementwise": fused_elementwise,
}
