#!/usr/bin/env bash
# The GPU checks, as one script for a lent GPU machine (see README.md).
# Writes logs and JSON to ${OUT:-benchmarks/results}. STEPS picks and orders
# the steps (default: tests precision models plans cohort; each step has its
# own timeout, 615 s together: give the tests their own device call, then
# STEPS="precision models plans cohort" in a second; the whole suite took
# 185 s on an H200 without tensorboardX, 232 s with it in session 14; what
# session 14 left for the next GPU: STEPS="vgg8plans centres", about 420 s):
#   tests     the whole suite at JAX's default precision (TF32 matmuls on
#             NVIDIA), on pytest-xdist workers when xdist is installed
#   precision check_ghost_precision: FC rounds and Gram matrices per kernel
#             and precision against float64 (the block-Gram split defect)
#   models    bench_models: user-written Flax CNN / VGG-8, centres against
#             the fp32 PyTorch loop on CUDA (prfl's Gram kernel without it)
#   plans     bench_plans: the default ExecutionPlan() against the fastest
#             candidate plan, per model
#   vgg8plans bench_plans for VGG-8 alone (N = 32): each of its plans
#             compiles in 40-46 s on an H200, so the plans step's 70 s never
#             timed it (sessions 5, 8, 14); 230 s of its own
#   centres   check_centres_gpu, the CNN at N = 32 with XLA's autotuning
#             off: is the 1.7e-2 gradient gap (not TF32: session 14) the
#             autotuned convolution algorithm's?
#   cohort    bench_cohort: issue 18's time per round and peak RSS vs N
#             (FedAvg to 10^5 clients, FC to 10^4) with host-streamed data
#   round     bench_round: one FC round, prfl kernels vs the PyTorch loop
#   cifar     Figures 4-5 (VGG-16 / VGG-8): the real CIFAR binaries when the
#             run carries them (CIFAR10_DIR / CIFAR100_DIR), else a short run
#             on generated CIFAR-shaped images (speed and plumbing only)
# Without a CUDA-enabled torch the torch steps say so in one line and go on
# without the PyTorch loop. The benchmarks set JAX's default matmul
# precision to "highest" (no TF32), as PyTorch's float32 default is; the
# tests do not.
set -u -o pipefail
# Test-extra packages the GPU image lacks (tensorboardX: the experiments'
# default --tensorboard needs it) travel as wheels in .whl (device README):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux2014_x86_64 -d .whl tensorboardX
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
out="$(realpath -m "${OUT:-benchmarks/results}")"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv \
  | tee "$out/gpu_info.txt"
python3 -c "import jax, flax, optax; print('jax', jax.__version__, \
'flax', flax.__version__, 'optax', optax.__version__, jax.devices())" \
  | tee -a "$out/gpu_info.txt"
if python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())" \
    2>/dev/null; then
  torch_cuda=1
  python3 -c "import torch; print('torch', torch.__version__, 'CUDA')" \
    | tee -a "$out/gpu_info.txt"
else
  torch_cuda=0
  echo "SKIP torch: no torch with CUDA here; the PyTorch-loop comparisons" \
    "are left out (models: centres against prfl's Gram kernel instead)" \
    | tee -a "$out/gpu_info.txt"
fi

run_tests() {
  # setup.cfg's addopts (-q -n auto ...) are replaced: -n needs xdist, and
  # -q cancelled -v (session 14's log had no per-test lines). -v logs each
  # test's outcome as it ends, so a step cut off by its timeout still names
  # its failures (the summary comes only at the end); -rfs gives failures
  # and skip reasons. pytest-xdist when the machine has it (the suite is
  # compile-bound).
  local workers=(-o "addopts=" -m "not slow" -v -rfs --durations=20)
  if python3 -c "import xdist" 2>/dev/null; then
    workers+=(-n "${TEST_WORKERS:-16}" --dist worksteal)
  fi
  # A hung test ends alone (pytest-timeout), not the whole step.
  if python3 -c "import pytest_timeout" 2>/dev/null; then
    workers+=(--timeout "${TEST_TIMEOUT_EACH:-150}")
  fi
  env -u JAX_DEFAULT_MATMUL_PRECISION timeout "${TESTS_TIMEOUT:-300}" \
    python3 -m pytest -p no:cacheprovider "${workers[@]}" \
    ${TESTS_ARGS:-} 2>&1 | tee "$out/tests_gpu.log" | grep -Ev " (PASSED|SKIPPED) " | tail -80
}

run_precision() {
  timeout "${PRECISION_TIMEOUT:-85}" python3 -m benchmarks.check_ghost_precision \
    --out "$out/ghost_precision_gpu.json" 2>&1 | tee "$out/ghost_precision_gpu.log"
}

run_round() {
  if [ "$torch_cuda" = 0 ]; then
    echo "SKIP round: bench_round compares with the PyTorch loop on CUDA"
    return
  fi
  JAX_DEFAULT_MATMUL_PRECISION=highest timeout "${ROUND_TIMEOUT:-400}" \
    python3 -m benchmarks.bench_round \
    --clients "${CLIENTS:-8,16,32,64}" --torch-device cuda --torch-threads 0 \
    --gemm-size 8192 --max-full-n 64 --repeats 10 --budget-s 10 \
    --plans "${ROUND_PLANS:-full:gram,1:gram,4:gram,16:gram,full:ghost,1:ghost,4:ghost,16:ghost}" \
    --out "$out/round_gpu.json" 2>&1 | tee "$out/round_gpu.log"
}

run_models() {
  local configs=torch-loop,"prfl auto"
  if [ "$torch_cuda" = 0 ]; then
    echo "SKIP models' PyTorch loop (no torch with CUDA): centres against" \
      "prfl's Gram kernel"
    configs="prfl gram,prfl auto"
  fi
  JAX_DEFAULT_MATMUL_PRECISION=highest timeout "${MODELS_TIMEOUT:-70}" \
    python3 -m benchmarks.bench_models \
    --clients "${MODEL_CLIENTS:-16,32}" --torch-device cuda \
    --torch-threads 0 --configs "$configs" --skip "" --repeats 5 \
    --budget-s "${MODELS_BUDGET_S:-5}" --out "$out/models_gpu.json" 2>&1 \
    | tee "$out/models_gpu.log"
}

run_plans() {
  timeout "${PLANS_TIMEOUT:-70}" python3 -m benchmarks.bench_plans \
    --models "${PLAN_MODELS:-user_mlp,cnn_small,cnn,vgg8}" \
    --clients "${PLAN_CLIENTS:-32}" \
    --plans "${PLANS:-1:ghost,4:ghost,16:ghost,full:ghost}" --repeats 5 \
    --out "$out/plans_gpu.json" 2>&1 | tee "$out/plans_gpu.log"
}

run_vgg8plans() {
  timeout "${VGG8_PLANS_TIMEOUT:-230}" python3 -m benchmarks.bench_plans \
    --models vgg8 --clients 32 --plans "${VGG8_PLANS:-16:ghost,full:ghost}" \
    --repeats 5 --out "$out/plans_vgg8_gpu.json" 2>&1 \
    | tee "$out/plans_vgg8_gpu.log"
}

run_centres() {
  XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_autotune_level=0" \
    timeout "${CENTRES_TIMEOUT:-190}" python3 -m benchmarks.check_centres_gpu \
    --clients 32 --out "$out/centres_gpu_n32_autotune0.json" 2>&1 \
    | grep -v cuda_timer | tee "$out/centres_gpu_n32_autotune0.log"
}

run_cohort() {
  # Issue 18's scale rows on the GPU: FedAvg (cohort 50) at N = 10^3..10^5
  # and FC (cohort 100, 5 groups) at N = 10^3, 10^4, data and FC's per-client
  # state on the host, streamed per chunk. Rows are saved as they finish.
  timeout "${COHORT_TIMEOUT:-90}" python3 -m benchmarks.bench_cohort \
    --fedavg "${COHORT_FEDAVG:-1000,10000,100000}" \
    --fc "${COHORT_FC:-1000,10000}" --fedavg-rounds 60 --fc-rounds 6 \
    --out "$out/cohort_gpu.json" 2>&1 | tee "$out/cohort_gpu.log"
}

run_cifar() {
  local c10 c100
  if [ -n "${CIFAR10_DIR:-}" ]; then c10=(--data-dir "$CIFAR10_DIR");
  else c10=(--dataset synthetic --rounds "${CIFAR_ROUNDS:-20}"); fi
  if [ -n "${CIFAR100_DIR:-}" ]; then c100=(--data-dir "$CIFAR100_DIR");
  else c100=(--dataset synthetic --rounds "${CIFAR_ROUNDS:-20}"); fi
  JAX_DEFAULT_MATMUL_PRECISION=highest timeout "${CIFAR_TIMEOUT:-300}" \
    python3 -m experiments.cifar10 "${c10[@]}" --out "$out/cifar10" 2>&1 \
    | tail -30 | tee "$out/cifar10.log"
  JAX_DEFAULT_MATMUL_PRECISION=highest timeout "${CIFAR_TIMEOUT:-300}" \
    python3 -m experiments.cifar100 "${c100[@]}" --out "$out/cifar100" 2>&1 \
    | tail -30 | tee "$out/cifar100.log"
}

for step in ${STEPS:-tests precision models plans cohort}; do
  echo "== $step  $(date -u +%H:%M:%S)"
  start=$SECONDS
  "run_$step"
  echo "== $step took $((SECONDS - start)) s"
done
