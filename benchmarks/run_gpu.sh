#!/usr/bin/env bash
# The GPU benchmarks, as one script for a lent GPU machine (see README.md).
# Writes JSON and logs to ${OUT:-benchmarks/results}. fp32 throughout: JAX's
# default matmul precision is set to "highest" (no TF32), as PyTorch's is.
set -u -o pipefail
out="$(realpath -m "${OUT:-benchmarks/results}")"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 JAX_DEFAULT_MATMUL_PRECISION=highest \
  XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv \
  | tee "$out/gpu_info.txt"
python3 -c "import jax, torch; print(jax.__version__, jax.devices(), torch.__version__)" \
  | tee -a "$out/gpu_info.txt"
timeout "${ROUND_TIMEOUT:-400}" python3 -m benchmarks.bench_round \
  --clients "${CLIENTS:-8,16,32,64}" --torch-device cuda --torch-threads 0 \
  --gemm-size 8192 --max-full-n 64 --repeats 10 --budget-s 10 \
  --plans "full:gram,1:gram,4:gram,16:gram,full:ghost,1:ghost,4:ghost,16:ghost" \
  --out "$out/round_gpu.json" 2>&1 | tee "$out/round_gpu.log"
# User-written Flax CNN and VGG-8 rounds against the PyTorch loop on CUDA.
timeout "${MODELS_TIMEOUT:-240}" python3 -m benchmarks.bench_models \
  --clients "${MODEL_CLIENTS:-16,32,64}" --torch-device cuda \
  --torch-threads 0 --configs torch-loop,"prfl auto" --repeats 5 \
  --budget-s 10 --out "$out/models_gpu.json" 2>&1 | tee "$out/models_gpu.log"
# Figures 4 and 5 (VGG-16 / VGG-8): on the real CIFAR binaries when the run
# carries them (CIFAR10_DIR / CIFAR100_DIR), else a short run on generated
# CIFAR-shaped images (speed and plumbing of the full-size models only).
if [ -n "${CIFAR10_DIR:-}" ]; then c10=(--data-dir "$CIFAR10_DIR");
else c10=(--dataset synthetic --rounds "${CIFAR_ROUNDS:-20}"); fi
if [ -n "${CIFAR100_DIR:-}" ]; then c100=(--data-dir "$CIFAR100_DIR");
else c100=(--dataset synthetic --rounds "${CIFAR_ROUNDS:-20}"); fi
timeout "${CIFAR_TIMEOUT:-300}" python3 -m experiments.cifar10 "${c10[@]}" \
  --out "$out/cifar10" 2>&1 | tail -30 | tee "$out/cifar10.log"
timeout "${CIFAR_TIMEOUT:-300}" python3 -m experiments.cifar100 "${c100[@]}" \
  --out "$out/cifar100" 2>&1 | tail -30 | tee "$out/cifar100.log"
# The test suite at JAX's default precision (TF32 matmuls on this GPU): the
# library computes its distances and Gram matrices at HIGHEST itself, and the
# tests' tolerances (tests/tolerances.py) say where the model's own matmuls
# may round. Summary line and failures in tests_gpu.log.
env -u JAX_DEFAULT_MATMUL_PRECISION timeout "${TESTS_TIMEOUT:-420}" \
  python3 -m pytest -q -p no:cacheprovider 2>&1 | tail -40 \
  | tee "$out/tests_gpu.log"
