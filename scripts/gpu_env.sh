# On a lent GPU machine (shared GPU-NOTES): `source scripts/gpu_env.sh` in the repository root.
# Stashes what build/gpu-transfer/{1,2} carried (scripts/gpu_transfer.py) in /root/stash, assembles TVM
# there once both parts have come, and sets the environment cdmpp needs (Python 3.12, no pip install).
STASH=${CDMPP_STASH:-/root/stash}
mkdir -p "$STASH"
for d in build/gpu-transfer/1 build/gpu-transfer/2; do
  for f in "$d"/*; do  # what is stashed already stays (cp -n warns on newer coreutils)
    [ -f "$f" ] && [ ! -e "$STASH/${f##*/}" ] && cp "$f" "$STASH"/
  done
done
if [ ! -f "$STASH/tvm/tvm/lib/libtvm_compiler.so" ] && [ -f "$STASH/tvm-rest.tar.xz" ] \
   && [ -f "$STASH/libtvm_compiler.so.xz.part-00" ]; then
  mkdir -p "$STASH/tvm" && tar -xJf "$STASH/tvm-rest.tar.xz" -C "$STASH/tvm"
  cat "$STASH"/libtvm_compiler.so.xz.part-* | xz -dc > "$STASH/tvm/tvm/lib/libtvm_compiler.so.tmp" \
    && mv "$STASH/tvm/tvm/lib/libtvm_compiler.so.tmp" "$STASH/tvm/tvm/lib/libtvm_compiler.so"
  ${PYTHON:-/opt/torch/.venv/bin/python} -m pip install -q --no-deps --target "$STASH/ffi" "$STASH"/apache_tvm_ffi-*.whl
fi
if [ -f "$STASH/tvm/tvm/lib/libtvm_compiler.so" ]; then
  export PYTHONPATH="$STASH/tvm:$STASH/ffi:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  export LD_LIBRARY_PATH="/usr/local/cuda-13.0/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CUDA_PATH=/usr/local/cuda
  export PATH="/opt/torch/.venv/bin:$PATH"
  echo "cdmpp: TVM ready from $STASH"
else
  echo "cdmpp: stashed $(ls "$STASH" | tr '\n' ' '); TVM is assembled once both parts have come"
fi
