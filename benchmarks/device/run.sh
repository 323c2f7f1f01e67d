#!/bin/bash
# On the lent GPU machine, after prepare.sh and a first call that copied .gpu/a/part00 to
# /root/stage: unpack, then run benchmarks.gpu. What it prints and writes lands in $OUT.
set -u
G=/root/gpu
if [ ! -d $G/site/mxnet ]; then
  mkdir -p $G && cat /root/stage/part00 .gpu/b/part01 | tar -xz -C $G || exit 3
  python3 -m pip install -q --no-index --no-deps --target $G/np $G/numpy-*.whl || exit 4
  # MXNet 1.9.1 reads aliases that numpy 1.24 removed.
  printf '\nbool, object, int, float, complex, str = bool, object, int, float, complex, str\n' \
    >> $G/np/numpy/__init__.py
  # The machine's scipy needs numpy 2; MXNet imports scipy only if it can.
  mkdir -p $G/shim/scipy && echo 'raise ImportError("scipy needs numpy 2")' > $G/shim/scipy/__init__.py
  python3 -c "import distutils.version" 2>/dev/null || {  # Python 3.12 has no distutils
    mkdir -p $G/shim/distutils && touch $G/shim/distutils/__init__.py &&
      echo "from setuptools._distutils.version import LooseVersion, StrictVersion" \
        > $G/shim/distutils/version.py; }
fi
export PYTHONPATH=$G/np:$G/site:$G/shim:$PWD LD_LIBRARY_PATH=$G/stubs:${LD_LIBRARY_PATH:-}
export CUDA_MODULE_LOADING=LAZY PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current \
  --format=csv | tee $OUT/env.txt
python3 -V | tee -a $OUT/env.txt
timeout 60 python3 - <<'PY' 2>&1 | tee -a $OUT/env.txt || exit 5
import time, numpy as np, mxnet as mx
print("mxnet", mx.__version__, "numpy", np.__version__, "gpus", mx.context.num_gpus())
for ctx in (mx.cpu(), mx.cpu_pinned(0)):
    x = mx.nd.array(np.ones((64, 3, 224, 224), "uint8"), ctx=ctx, dtype="uint8")
    y = x.as_in_context(mx.gpu(0))
    y.wait_to_read()
    t = time.perf_counter()
    for _ in range(20):
        y = x.as_in_context(mx.gpu(0))
        y.wait_to_read()
    print(ctx, "host to device", round(x.size * 20 / (time.perf_counter() - t) / 1e9, 2), "GB/s")
PY
timeout ${BENCH_S:-420} python3 -m benchmarks.gpu --rounds ${ROUNDS:-3} --out $OUT/gpu.json \
  2>&1 | tee $OUT/gpu.log
