"""Cohort runs at the field's scale: time per round and peak RSS vs N.

(a) FedAvg, cohort 50, the MNIST MLP 784-200-10, batch 32, on N registered
    clients whose data stay on the host (ragged, memory-mapped uint8 images
    of MNIST shape, 8-47 examples each) and are streamed per chunk.
(b) Federated-Clustering, cohort 100 in 5 groups of 20, the same model,
    every client keeping its own model and momentum (SGD with momentum 0.9):
    2 x 159,010 floats per client, kept on the host (`state_on_host`, in RAM
    or memory-mapped to a directory) and gathered per chunk.

Every configuration runs in a fresh subprocess through `prfl.train` (chunks
of `--chunk` rounds, `eval_fn=None`); it reports the seconds per round after
the first chunk (which compiles) and its peak RSS (`VmHWM`: with memory-
mapped data or state this counts the mapped file pages resident at the
peak, which the kernel may write back and drop under pressure, unlike
anonymous memory). Generated data: the time per round does not depend on the pixels.

  python -m benchmarks.bench_cohort --fedavg 1000,10000,100000 --fc 1000,10000 \\
      --state-dir /tmp/prfl_fc_state
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks import common
from experiments import files as experiments_files

_CHILD = r"""
import json, sys, time
import jax, jax.numpy as jnp, numpy as np, optax
import prfl_jax as prfl
from prfl_jax import models
alg_name, n, data_dir, rounds, chunk, state = {args!r}

def peak_rss_gib():
  # VmHWM: this process's peak RSS since exec (ru_maxrss would also count
  # the parent's RSS at fork).
  with open("/proc/self/status") as f:
    kb = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
  return kb / 2**20

def loss(params, batch):
  (x, y), mask = prfl.data.unpad(batch)
  x = x.reshape(x.shape[0], -1).astype(jnp.float32) / 255.0
  return models.softmax_cross_entropy(params, prfl.data.Padded((x, y), mask))

offsets = np.load(data_dir + "/offsets.npy")
x = np.load(data_dir + "/x.npy", mmap_mode="r")
y = np.load(data_dir + "/y.npy", mmap_mode="r")
train = prfl.data.Ragged((x, y), offsets)
data = prfl.data.HostData(train, train, np.zeros(n, np.int32))
params = prfl.participation.Replicated(
    models.mlp_init(jax.random.key(0), (784, 200, 10)), n)
if alg_name == "fedavg":
  alg = prfl.participation.cohort(
      prfl.algorithms.fedavg(loss, optax.sgd(0.1)), cohort_size=50)
  on_host = False
else:
  alg = prfl.participation.cohort(
      prfl.algorithms.federated_clustering(
          loss, optax.sgd(0.05, momentum=0.9),
          radius=prfl.quantile_radius(0.2), num_iters=10, num_groups=5),
      cohort_size=100)
  on_host = True if state == "ram" else state
start = time.perf_counter()
r = prfl.train(alg, params, data, num_rounds=rounds, eval_every=chunk,
               batch_size=32, key=jax.random.key(1), state_on_host=on_host,
               verbose=False)
elapsed = r.history["elapsed_s"]
steady = (elapsed[-1] - elapsed[1]) / (rounds - chunk)
print(json.dumps({{
    "algorithm": alg_name, "num_clients": n, "rounds": rounds,
    "chunk": chunk, "state": state, "s_per_round": steady,
    "first_chunk_s": float(elapsed[1]),
    "peak_rss_gib": peak_rss_gib(),
    "final_loss": float(r.history["train/loss"][-1]),
    "total_s": time.perf_counter() - start}}))
"""


def make_data(directory: str, num_clients: int, seed: int = 0):
  """Ragged MNIST-shaped uint8 data on disk: `x.npy`, `y.npy`, offsets."""
  rng = np.random.default_rng(seed)
  counts = rng.integers(8, 48, num_clients)
  offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
  total = int(offsets[-1])
  header = {"descr": "|u1", "fortran_order": False,
            "shape": (total, 28, 28, 1)}
  with open(os.path.join(directory, "x.npy"), "wb") as f:  # Not mapped.
    np.lib.format.write_array_header_1_0(f, header)
    block = 200_000
    for start in range(0, total, block):
      stop = min(start + block, total)
      f.write(rng.integers(0, 256, (stop - start, 28, 28, 1),
                           np.uint8).tobytes())
  np.save(os.path.join(directory, "y.npy"),
          rng.integers(0, 10, total).astype(np.int32))
  np.save(os.path.join(directory, "offsets.npy"), offsets)
  return total


def _devices() -> str:
  """The JAX devices a child process sees (CPU or the lent GPU)."""
  out = subprocess.run([sys.executable, "-c",
                        "import jax; print(jax.devices())"],
                       capture_output=True, text=True, check=False)
  return out.stdout.strip() or out.stderr.strip()[-200:]


def run_one(alg: str, n: int, data_dir: str, rounds: int, chunk: int,
            state: str) -> dict:
  code = _CHILD.format(args=(alg, n, data_dir, rounds, chunk, state))
  out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, check=False,
                       cwd=os.path.dirname(os.path.dirname(
                           os.path.abspath(__file__))))
  if out.returncode:
    raise RuntimeError(f"{alg} N={n} failed:\n{out.stderr[-4000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--fedavg", default="1000,10000,100000")
  parser.add_argument("--fc", default="1000,10000")
  parser.add_argument("--fedavg-rounds", type=int, default=80)
  parser.add_argument("--fc-rounds", type=int, default=6)
  parser.add_argument("--chunk", type=int, default=20)
  parser.add_argument("--fc-chunk", type=int, default=2)
  parser.add_argument("--state-dir", default="",
                      help="memory-map FC's host state in a directory here "
                      "(default: host RAM)")
  parser.add_argument("--data-dir", default=tempfile.gettempdir())
  parser.add_argument("--out", default=os.path.join(common.RESULTS_DIR,
                                                    "cohort_cpu.json"))
  args = parser.parse_args()
  parse = lambda s: [int(v) for v in s.split(",") if v]
  configs = ([("fedavg", n, args.fedavg_rounds, args.chunk, "device")
              for n in parse(args.fedavg)] +
             [("fc", n, args.fc_rounds, args.fc_chunk, args.state_dir or "ram")
              for n in parse(args.fc)])
  rows = []
  # Asked once, of a child: this process leaves the accelerator to the runs.
  header = {"machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "devices": _devices(),
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "command": " ".join(sys.argv)}
  for alg, n, rounds, chunk, state in configs:
    data_dir = tempfile.mkdtemp(prefix=f"prfl_cohort_{n}_", dir=args.data_dir)
    if state not in ("device", "ram"):  # A fresh directory for the state.
      state = tempfile.mkdtemp(prefix="state_", dir=data_dir)
    try:
      total = make_data(data_dir, n)
      load = os.getloadavg()[0]
      row = run_one(alg, n, data_dir, rounds, chunk, state)
      row["state"] = "memory-mapped" if state.startswith(data_dir) else state
      row.update(examples=total, load_1min=load)
      if alg == "fc":
        row["client_state_gib"] = 2 * n * common.NUM_PARAMS * 4 / 2**30
      rows.append(row)
      print(json.dumps(row), flush=True)
      # After every row (atomically), so that a run cut short keeps its rows.
      experiments_files.write_json(args.out, dict(header, rows=rows))
    finally:
      shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
  main()
