#!/usr/bin/env bash
# Build .fa4/fa4site.tar.xz: flash-attn-4 and its CuTe DSL (nvidia-cutlass-dsl 4.8.1: the
# meta-package, libs-base with the Python DSL cutlass/cute, libs-core, libs-cu13 with the MLIR
# libraries) plus the small pure dependencies, installed for Python 3.12 x86_64 into one tree
# and xz-compressed, for carrying to the GPU machine (bench/run_h200.sh unpacks it). The wheels
# are ~99 MB (libs-cu13 alone 92 MB) and the tree as tar.xz 74 MiB, over a call's 64 MiB.
# Run from the repository root on a machine with the package index: bash bench/fa4_bundle.sh
set -euo pipefail
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
pip_args=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
python3 -m pip download "${pip_args[@]}" -d "$work/wheels" flash-attn-4==4.0.0b36 \
  nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
  nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels \
  torch-c-dlpack-ext einops "cuda-bindings>=13,<14" cuda-pathfinder \
  "apache-tvm-ffi>=0.1.11,<0.2" protobuf
python3 -m pip install "${pip_args[@]}" --no-index --no-compile --target "$work/site" \
  "$work"/wheels/*.whl
rm -rf "$work/site/bin"
mkdir -p .fa4
rm -f .fa4/fa4site.tar.xz*
tar -C "$work/site" -cf - . | xz -6 -T0 > "$work/fa4site.tar.xz"
# ~74 MiB: two parts of at most 40 MiB, each under a call's limit. Carry .fa4/fa4site.tar.xz.aa
# in one call and .fa4/fa4site.tar.xz.ab in the next on the same (warm) machine; run_h200.sh
# joins the parts it finds.
split -b 40M -a 2 "$work/fa4site.tar.xz" .fa4/fa4site.tar.xz.
ls -la .fa4
