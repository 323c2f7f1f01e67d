#!/bin/bash
# Pack MXNet 1.9.1 (mxnet-cu117) for a lent GPU machine that has no CUDA 11 libraries and no
# network: docs/benchmarks.md, "On a GPU". Run from the repository root; it writes .gpu/
# (ignored by git): two parts of under 60 MB each, for two calls of the device tool, and
# run.sh. Needs pip (PyPI), gcc, readelf, tar and gzip.
#
# What the pack holds: the mxnet-cu117 wheel unpacked, its GPU kernels zeroed (built for
# sm_50-sm_86: none runs on an sm_90 H100 or H200), the CUDA 11.7 runtime (libcudart), a stub
# for each other CUDA library libmxnet.so links (cuBLAS, cuDNN, ... : the copies never call
# them), and numpy 1.26.4 (the first with a wheel for the machine's Python 3.12).
set -euo pipefail
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
get() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux1_x86_64 -d "$W" "$@"
}
get mxnet-cu117==1.9.1 numpy==1.26.4 nvidia-cuda-runtime-cu11==11.7.99
mkdir -p "$W/pack/site" "$W/pack/stubs"
unzip -q "$W"/mxnet_cu117-*.whl -d "$W/pack/site"
cp "$W"/numpy-1.26.4-*.whl "$W/pack/"
LIB="$W/pack/site/mxnet/libmxnet.so"
python3 benchmarks/device/fatbin.py --zero "$LIB"
unzip -q -j "$W"/nvidia_cuda_runtime_cu11-*.whl 'nvidia/cuda_runtime/lib/libcudart.so.11.0' \
  -d "$W/pack/stubs"
undefined() { readelf --dyn-syms -W "$LIB" | awk '$7 == "UND" {print $8}' | sed 's/ (.*)//'; }
stub() {  # SONAME VERSIONED SYMBOL...: a library whose functions say once that they ran, return 0
  local name=$1 versioned=$2
  shift 2
  {
    echo '#include <stdio.h>'
    echo '#define STUB(n) int n(void) { static int said; if (!said) { said = 1;' \
      'fprintf(stderr, "[cuda stub] " #n " called\n"); } return 0; }'
    for s in "$@"; do echo "STUB($s)"; done
  } > "$W/$name.c"
  local script=()
  if [ "$versioned" = 1 ]; then
    echo "$name { global: *; };" > "$W/$name.map"
    script=(-Wl,--version-script="$W/$name.map")
  fi
  gcc -shared -fPIC -O1 -o "$W/pack/stubs/$name" -Wl,-soname,"$name" "${script[@]}" "$W/$name.c"
}
for name in libcublas.so.11 libcudnn.so.8 libcufft.so.10 libcurand.so.10 libcusolver.so.11 \
  libnvToolsExt.so.1 libnvrtc.so.11.2; do
  stub "$name" 1 $(undefined | grep "@$name\$" | sed 's/@.*//' | sort -u)
done
stub libnccl.so.2 0 $(undefined | grep '^nccl' | sort -u)
stub libcusparse.so.11 1 cusparseUnused  # linked, no function used
rm -rf .gpu && mkdir -p .gpu/a .gpu/b
tar -C "$W/pack" -czf "$W/mx.tgz" .
split -n 2 -d "$W/mx.tgz" "$W/part"
mv "$W/part00" .gpu/a/ && mv "$W/part01" .gpu/b/
cp benchmarks/device/run.sh .gpu/run.sh
grep -qx '/.gpu/' .git/info/exclude || echo '/.gpu/' >> .git/info/exclude
ls -l .gpu/a .gpu/b
