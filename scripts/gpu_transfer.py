"""Prepare what a lent GPU machine needs that the working tree does not carry: TVM and its ffi for Python 3.12.

The device tool copies the working tree (the project's code and datasets/tasks-llvm.json.gz travel with it)
and at most 64 MiB of ignored paths per call; TVM's wheel is ~100 MB and its compiler library 259 MB. So
(shared GPU-NOTES): the library is xz-compressed (~60 MB) and split, the rest of ``tvm/`` packed apart.

    python scripts/gpu_transfer.py            # writes build/gpu-transfer/1 and build/gpu-transfer/2

The working tree travels with each call and counts toward the 64 MiB: with the shipped model and the
measurements (~40 MB, neither needed there) part 1 does not fit, so move ``cdmpp/models`` and
``datasets/measurements`` out of the tree for the two calls (and stop a running collector first). Then
two device calls, the second at once (the machine keeps /root/stash only while it stays warm, ~30 s):
    run(carry=["build/gpu-transfer/1"], command="bash scripts/gpu_env.sh")
    run(carry=["build/gpu-transfer/2", "build/gpu-ds", "build/pyspy"],
        command="bash scripts/gpu_collect.sh 7.5 SEED nvidia-h100/cuda-sm90")
(``build/gpu-ds``: record parts of a device whose programs to twin first; ``build/pyspy``: a py-spy binary;
both optional) and back here: unpack ``ds.tgz``, ``cdmpp devices add`` the probed spec from
``devices-gpu.json`` if the device is new, and ``python -m cdmpp.records.importers <folder>/ds``.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tarfile

PART = 40_000_000  # bytes per piece of the compressed library; one call carries at most 64 MiB


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="build/gpu-transfer")
    ap.add_argument("--ffi-wheel", help="apache_tvm_ffi 0.1.14.post1 cp312 wheel (default: pip download it)")
    args = ap.parse_args(argv)
    import tvm_ffi  # noqa: F401  (the installed versions are the ones to send)

    tvm_dir = os.path.dirname(__import__("importlib").util.find_spec("tvm").origin)
    lib = os.path.join(tvm_dir, "lib", "libtvm_compiler.so")
    one, two = os.path.join(args.out, "1"), os.path.join(args.out, "2")
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(one)
    os.makedirs(two)
    print(f"compressing {lib} ({os.path.getsize(lib) / 2**20:.0f} MiB) with xz -9e (a few minutes)", file=sys.stderr)
    xz = os.path.join(args.out, "libtvm_compiler.so.xz")
    with open(xz, "wb") as f:
        subprocess.run(["xz", "-9e", "-T1", "-c", lib], stdout=f, check=True)
    with open(xz, "rb") as f:
        for i, chunk in enumerate(iter(lambda: f.read(PART), b"")):
            with open(os.path.join(one if i == 0 else two, f"libtvm_compiler.so.xz.part-{i:02d}"), "wb") as g:
                g.write(chunk)
    os.remove(xz)

    def keep(info: tarfile.TarInfo):
        name = info.name
        if "/__pycache__" in name or name.startswith("tvm/3rdparty") or name == "tvm/lib/libtvm_compiler.so":
            return None
        return info

    with tarfile.open(os.path.join(two, "tvm-rest.tar.xz"), "w:xz") as tar:
        tar.add(tvm_dir, arcname="tvm", filter=keep)
    wheel = args.ffi_wheel
    if not wheel:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--platform", "manylinux_2_28_x86_64",
                        "apache-tvm-ffi==0.1.14.post1", "-d", two], check=True)
    else:
        shutil.copy(wheel, two)
    for d in (one, two):
        size = sum(os.path.getsize(p) for p in glob.glob(os.path.join(d, "*")))
        print(f"{d}: {size / 2**20:.1f} MiB ({', '.join(sorted(os.listdir(d)))})")
        if size > 64 * 2**20:
            raise SystemExit(f"{d} is over the 64 MiB a call can carry")
    return 0


if __name__ == "__main__":
    sys.exit(main())
