"""Does a kernel's time depend on the values in its inputs? (issue 21 item 2: bert_tiny's network error)

Labels are measured on TVM's measurement fill (``random_fill_for_measure``: floats uniform in [1, 10]),
as MetaSchedule's runner does; a network runs on its own activations. For every task of a network (its
fastest measured program, as ``cdmpp network`` and ``cdmpp bench network`` use), this times the kernel
on three inputs: that fill, standard-normal floats (activations of a normalized network), and zeros;
integer inputs are zeros in all three, as in the collector. It prints each kernel beside its label
and the weighted sums. Run alone (it times kernels):

    /work/cpu-slot .venv/bin/python benchmarks/kernel_input_dependence.py bert_tiny@1 [--top 10]
"""

import argparse

import numpy as np

from cdmpp.devices.table import DeviceTable
from cdmpp.predict import network as net
from cdmpp.program import tvm_env
from cdmpp.zoo.tasks import TaskTable

FILLS = ("measure-fill", "normal", "zeros")


def time_kernel(tvm, mod, target, dev, fill: str, number: int = 20, repeat: int = 5) -> float:
    """Fastest of ``repeat`` averages of ``number`` calls, in seconds, on inputs made by ``fill``."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    rt = tvm.tirx.build(mod, target=target)
    rng = np.random.default_rng(0)
    args = []
    for a in ArgInfo.from_prim_func(mod["main"]):
        shape, dtype = tuple(int(x) for x in a.shape), str(a.dtype)
        t = tvm.runtime.empty(shape, dtype, dev)
        if dtype.startswith(("int", "uint", "bool")) or fill == "zeros":
            t.copyfrom(np.zeros(shape, dtype=dtype))
        elif fill == "normal":
            t.copyfrom(rng.standard_normal(shape).astype(dtype))
        else:
            tvm.get_global_func("tvm.contrib.random.random_fill_for_measure")(t)
        args.append(t)
    return float(min(rt.time_evaluator("main", dev, number=number, repeat=repeat)(*args).results))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("network", help="zoo network occurrence, e.g. bert_tiny@1")
    ap.add_argument("--device", default="amd-epyc-znver4-2t/llvm-avx512")
    ap.add_argument("--top", type=int, default=0, help="only the N tasks with the largest weighted label (0: all)")
    args = ap.parse_args()
    spec = DeviceTable().get(args.device)
    target = spec.make_target()
    programs = net.task_programs(args.network, TaskTable.load("datasets/tasks-llvm.json.gz"), "best-measured",
                                 args.device, "datasets/measurements", target)
    programs = sorted((p for p in programs if p.measured_s is not None), key=lambda p: -p.weight * p.measured_s)
    shown = programs[:args.top] if args.top else programs
    tvm = tvm_env.setup(spec.threads)
    dev = tvm.cpu()
    sums = dict.fromkeys(FILLS, 0.0)
    print(f"{'task':58s} {'w':>2s} {'label us':>9s} " + " ".join(f"{f:>12s}" for f in FILLS))
    for p in shown:
        t = {f: time_kernel(tvm, p.mod, target, dev, f) for f in FILLS}
        for f in FILLS:
            sums[f] += p.weight * t[f]
        print(f"{p.name[:58]:58s} {p.weight:2d} {1e6 * p.measured_s:9.1f} "
              + " ".join(f"{1e6 * t[f]:12.1f}" for f in FILLS), flush=True)
    labels = sum(p.weight * p.measured_s for p in shown)
    print(f"{'weighted sum (ms)':58s} {'':2s} {1e3 * labels:9.3f} " + " ".join(f"{1e3 * sums[f]:12.3f}" for f in FILLS))


if __name__ == "__main__":
    main()
