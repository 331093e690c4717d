"""Ansor workload table for the logs of microsoft/nnfusion's Roller artifact (branch ``osdi22_artifact``,
``artifacts/{microbenchmark,Table3}/tvm/ansor``), for ``cdmpp import ansor --workloads``.

Their keys name functions the artifact registered in its tuning scripts (``["conv2d_layer", 128, 1008, 21, 21,
168, 1, 1, 1, "SAME"]``), which TVM cannot rebuild from the key alone. This script declares functions of the
same names and arguments, computing the same thing with the same topi calls (conv2d_nchw, depthwise_conv2d_nchw,
a plain te.sum matmul, pool2d with ``get_pad_tuple`` padding, relu, sum), asks TVM 0.19 for each key's tensors
and writes ``{"workload_key", "tensors"}`` lines. Run it with the TVM 0.19 side environment's Python:

    ~/.cache/cdmpp/tvm019/bin/python scripts/nnfusion_workloads.py LOG.json [LOG.json ...] -o workloads.jsonl

Only the un-fused conv2d_layer is declared: the artifact fused a relu/add when given extra arguments, which
the key does not record but the log's file name does (``..._add_relu.log``); the microbenchmark and Table3
Ansor logs have no such suffix. A key of another function is reported and left out.
"""

import argparse
import json
import sys

import tvm
from tvm import auto_scheduler, te, topi
from tvm.topi.nn.utils import get_pad_tuple


@auto_scheduler.register_workload("conv2d_layer")
def conv2d_layer(n, ci, h, w, co, kh, kw, stride, padding):
    x = te.placeholder((n, ci, h, w), name="input0")
    k = te.placeholder((co, ci, kh, kw), name="input1")
    return [x, k, topi.nn.conv2d_nchw(x, k, stride, padding, dilation=1, out_dtype="float32")]


@auto_scheduler.register_workload("depthwise_conv2d_layer")
def depthwise_conv2d_layer(n, ci, h, w, kh, kw, stride, padding):
    x = te.placeholder((n, ci, h, w), name="data", dtype="float32")
    k = te.placeholder((ci, 1, kh, kw), name="kernel", dtype="float32")
    return [x, k, topi.nn.depthwise_conv2d_nchw(x, k, stride, padding, dilation=1, out_dtype="float32")]


@auto_scheduler.register_workload("matmul_layer")
def matmul_layer(m, k_dim, n):
    a = te.placeholder((m, k_dim), name="A", dtype="float32")
    b = te.placeholder((k_dim, n), name="B", dtype="float32")
    k = te.reduce_axis((0, k_dim), name="k")
    return [a, b, te.compute((m, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k))]


@auto_scheduler.register_workload("pool_layer")
def pool_layer(pool_type, n, ci, h, w, kh, kw, stride, padding):
    x = te.placeholder((n, ci, h, w), name="data")
    return [x, topi.nn.pool2d(x, (kh, kw), (stride, stride), (1, 1), get_pad_tuple(padding, (kh, kw)),
                              pool_type=pool_type)]


@auto_scheduler.register_workload("relu_layer")
def relu_layer(*shape):
    x = te.placeholder(shape, name="data")
    return [x, topi.nn.relu(x)]


@auto_scheduler.register_workload("reduction_layer")
def reduction_layer(shape, axis, keep_dim):
    x = te.placeholder(shape, name="data")
    return [x, topi.sum(x, axis, keep_dim)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+")
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args(argv)
    keys = {}
    for path in args.logs:
        for line in open(path):
            try:
                keys.setdefault(json.loads(line)["i"][0][0], None)
            except (ValueError, KeyError, IndexError, TypeError):
                continue
    written, skipped = 0, []
    with open(args.out, "w") as f:
        for key in keys:
            try:
                tensors = auto_scheduler.workload_registry.workload_key_to_tensors(key)
            except Exception as e:  # an unknown function or arguments it does not take
                skipped.append(f"{key}: {type(e).__name__}: {e}")
                continue
            f.write(json.dumps({"workload_key": key, "tensors": tvm.ir.save_json(list(tensors))}) + "\n")
            written += 1
    print(json.dumps({"keys": len(keys), "written": written, "skipped": skipped, "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
