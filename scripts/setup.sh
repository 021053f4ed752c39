#!/usr/bin/env bash
# One-time, idempotent set-up: a local venv (.venv/) holding PyPI's torch==2.11.0 (libtorch 2.11,
# CUDA 13 build; it loads on a machine without a GPU) and the CUDA 13.0 headers from
# cuda-toolkit[nvcc,cccl]==13.0.2, whose nvcc compiles the crate's own kernels, and CUTLASS's
# headers from nvidia-cutlass==4.2.0.0 (the GEMMs with GELU in their epilogues). Cargo finds them
# through .cargo/config.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION=2.11.0
CUDA_TOOLKIT_VERSION=13.0.2
CUTLASS_VERSION=4.2.0.0
# cuda-toolkit 13.0.2 pulls nvidia-nvvm and nvidia-cuda-crt 13.5 beside nvcc 13.0, whose ptxas
# then refuses every .cu file (`Unsupported .version 9.5`); pinned to nvcc's own 13.0.
NVCC_PINS=("nvidia-nvvm==13.0.*" "nvidia-cuda-crt==13.0.*")
stamp=.venv/.setup-done-torch-$TORCH_VERSION-cuda-$CUDA_TOOLKIT_VERSION-nvvm-13.0-cutlass-$CUTLASS_VERSION
if [[ -f $stamp && -e .venv/torch/lib/libtorch.so ]]; then
  exit 0
fi
python=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  echo "setup: creating .venv with $($python --version)"
  "$python" -m venv .venv
fi
echo "setup: installing torch==$TORCH_VERSION, cuda-toolkit[nvcc,cccl]==$CUDA_TOOLKIT_VERSION and nvidia-cutlass==$CUTLASS_VERSION into .venv (a few GB, once)"
.venv/bin/python -m pip install --quiet --disable-pip-version-check \
  "torch==$TORCH_VERSION" "cuda-toolkit[nvcc,cccl]==$CUDA_TOOLKIT_VERSION" "${NVCC_PINS[@]}"
# only CUTLASS's C++ headers are used: not its Python library's dependencies (scipy, numpy, ...)
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps "nvidia-cutlass==$CUTLASS_VERSION"
.venv/bin/python -W ignore - <<'PY'
import torch, os
print(f"setup: torch {torch.__version__} (CUDA {torch.version.cuda}) at {os.path.dirname(torch.__file__)}")
assert torch.__version__.startswith("2.11.0"), torch.__version__
PY
# A relative link, so the checkout can move.
ln -sfn "$(.venv/bin/python -W ignore -c 'import os, torch; print(os.path.relpath(os.path.dirname(torch.__file__), ".venv"))')" .venv/torch
touch "$stamp"
