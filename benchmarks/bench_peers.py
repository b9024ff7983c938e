"""FedAvg on pfl-research's CIFAR-10 shape: prfl_jax, pfl-research and Flower.

One run times the same federated training in the three systems side by side
on this CPU and evaluates what each one learned. The task (`peers_task`):
1,000 clients of 50 generated CIFAR-shaped images (real CIFAR-10 is not
available offline), a cohort of 50 clients per round, one local epoch of SGD
(lr 0.1, 5 batches of 10, in the client's order) from the global model, then
the server averages the 50 new models (pfl: central SGD with lr 1.0 on the
mean change; Flower: FedAvg's example-weighted mean, equal weights here;
prfl_jax: `fedavg(local_steps=5)` adds the mean change). The model is pfl's
`simple_cnn` without its dropout layers (conv 3x3x32, conv 3x3x64, 2x2
max-pool, dense 128, dense 10; 1.63 M parameters), started from the same
NumPy-drawn weights in every system.

All three train the SAME clients in the same order: the cohorts are those
`prfl.train` draws (`cohort_ids`), replayed by pfl's user sampler and
Flower's `configure_train`. So the systems compute the same function of the
data up to float summation order; `max_param_diff` reports how far their
final models are from prfl_jax's.

Per round, each system does:
* prfl_jax: `prfl.train` of `prfl.participation.cohort(fedavg(...,
  local_steps=5, clients_at_once=1), cohort_size=50)`, the clients' data on
  the device: the round's cohort is drawn from its key, its 50 clients' rows
  gathered, one epoch of SGD per client, the clients one after another
  (`lax.map`) inside the one compiled round, the mean change added to the one
  global model. The clients are split over `--jax-devices` XLA CPU devices
  (default one per core, like Flower's actors; `fedavg(mesh=)`), each
  training its share one client at a time; `python -m` asks XLA for one
  device per core. `--clients-at-once all` `vmap`s the cohort instead: the
  per-client kernels then become grouped convolutions and 50 clients'
  activations, which XLA:CPU runs slower. Convolutions (`--conv`): `fast`
  (default) is `conv_cpu.conv_with_fast_grads`, XLA's convolution forward
  and input gradient and a patches GEMM for the kernel gradient; `patches`
  is `conv_cpu.conv_by_patches` throughout; `xla` is plain
  `lax.conv_general_dilated`, whose autodiff XLA:CPU runs several times
  slower.
* pfl: `FederatedAveraging` on `SimulatedBackend`: one process, the cohort's
  users one after another in PyTorch (`--torch-threads`, default 1: on this
  loaded 2-core machine torch's default 2 threads were 5-10x slower).
* Flower: `run_simulation` on Ray with `--ray-cpus` CPUs (one per ClientApp
  actor, so that that many clients train at once, one torch thread each);
  each ClientApp call gets the model as an ArrayRecord, reads its client's
  rows from a memory-mapped file, trains, sends the model back.

Interleaving: the rounds run in segments of `--rounds` rounds; in each
segment every system runs its next rounds, in an order rotated segment by
segment, so that the machine's load falls on all of them alike. Each system
continues from its own model. s/round is the median over the rounds after
warm-up: the first round of every segment is left out (`first_round_s`:
prfl_jax compiles there, Flower starts its Ray actors, PyTorch makes its
first calls); `wall_s` is each segment's whole time (Flower's includes
starting and stopping Ray). Accuracy: every system's global model after each
segment, evaluated by the same function (JAX, `prfl.models.classifier_eval`)
on the same held-out images.

  python -m benchmarks.bench_peers                      # 3 segments of 3
  python -m benchmarks.bench_peers --segments 4 --rounds 5
  python -m benchmarks.bench_peers --systems prfl_jax --clients 8 --cohort 2

pfl and Flower come from the `peers` extra (`pip install -e ".[peers]"` in a
separate venv); a system that cannot be imported is skipped with a note.
"""

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import optax

import prfl_jax as prfl
from benchmarks import common
from benchmarks import peers_task
from prfl_jax.kernels import conv as conv_kernels
from prfl_jax.kernels import conv_cpu
from prfl_jax.participation import run as participation_run

SYSTEMS = ("prfl_jax", "pfl", "flower")
_MODULES = {"prfl_jax": "prfl_jax", "pfl": "pfl", "flower": "flwr"}
_CONV = conv_kernels.conv_params(4, window_strides=(1, 1), padding="VALID",
                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))


def cnn_apply(conv: str):
  """pfl's simple_cnn on `peers_task` params; `x [B, 32, 32, 3]` -> logits."""
  def conv2d(x, p):
    if conv == "fast":
      y = conv_cpu.conv_with_fast_grads(x, p["kernel"], _CONV)
    elif conv == "patches":
      y = conv_cpu.conv_by_patches(x, p["kernel"], _CONV)
    else:
      y = lax.conv_general_dilated(x, p["kernel"], (1, 1), "VALID",
                                   dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jax.nn.relu(y + p["bias"])

  def apply(params, x):
    x = conv2d(conv2d(x, params["Conv_0"]), params["Conv_1"])
    b, h, w, c = x.shape
    x = x.reshape(b, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))  # 2x2 pool.
    x = x.reshape(b, -1)
    x = jax.nn.relu(x @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"])
    return x @ params["Dense_1"]["kernel"] + params["Dense_1"]["bias"]
  return apply


def cohort_fedavg(task: peers_task.Task, conv: str, clients_at_once=None,
                  mesh=None):
  """FedAvg with one local epoch, run on cohorts of `task.cohort` clients."""
  loss = prfl.models.classifier_loss(cnn_apply(conv))
  alg = prfl.algorithms.fedavg(loss, optax.sgd(task.local_lr),
                               local_steps=task.local_steps,
                               clients_at_once=clients_at_once, mesh=mesh)
  return prfl.participation.cohort(alg, cohort_size=task.cohort)


def cohort_ids(key: jax.Array, task: peers_task.Task, rounds: int):
  """`[rounds, C]`: the clients prfl.train draws, for the peers to replay."""
  alg = cohort_fedavg(task, "patches")
  keys = participation_run.draw_chunk(alg, key, task.num_clients,
                                      jnp.arange(rounds, dtype=jnp.int32))
  return np.asarray(keys.index)


class PrflJax:
  """prfl_jax's side: `prfl.train` of the cohort FedAvg, data on the device.

  Every round is its own chunk (`eval_every=1`, no evaluation), so the
  history's `elapsed_s` gives each round's time; the first round of each
  `train` call compiles and is left out like the peers' first rounds.
  """

  def __init__(self, task: peers_task.Task, data, key: jax.Array,
               rounds: int, conv: str, clients_at_once, mesh=None):
    self.task, self.key, self.rounds = task, key, rounds
    self.alg = cohort_fedavg(task, conv, clients_at_once, mesh)
    x, y = jax.device_put(data[0]), jax.device_put(data[1].astype(np.int32))
    self.data = prfl.data.FederatedData(
        train=(x, y), test=y,  # No per-client evaluation: test is unused.
        clusters=jnp.zeros((task.num_clients,), jnp.int32))
    self.state = None

  def run(self, params: dict, first_round: int):
    del first_round  # The state counts the rounds.
    start = None
    if self.state is None:
      start = prfl.participation.Replicated(
          jax.tree.map(jnp.asarray, params), self.task.num_clients)
    result = prfl.train(
        self.alg, start, self.data,
        num_rounds=self.rounds, key=self.key, batch_size=None, eval_every=1,
        initial_state=self.state, verbose=False)
    self.state = result.state
    rounds = np.diff(result.history["elapsed_s"])
    return jax.tree.map(np.asarray, self.state.server["params"]), rounds


def available(systems) -> tuple:
  """The systems whose package imports here, and notes on the others."""
  have, notes = [], []
  for s in systems:
    if importlib.util.find_spec(_MODULES[s]) is None or (
        s != "prfl_jax" and importlib.util.find_spec("torch") is None):
      notes.append(f"{s}: not installed here (the `peers` extra), skipped")
    else:
      have.append(s)
  return tuple(have), notes


def parse(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--systems", default=",".join(SYSTEMS))
  p.add_argument("--segments", type=int, default=3)
  p.add_argument("--rounds", type=int, default=3, help="rounds per segment")
  p.add_argument("--clients", type=int, default=1000)
  p.add_argument("--examples", type=int, default=50)
  p.add_argument("--cohort", type=int, default=50)
  p.add_argument("--batch", type=int, default=10)
  p.add_argument("--noise", type=float, default=1.0)
  p.add_argument("--test-size", type=int, default=2000)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--ray-cpus", type=int, default=2)
  p.add_argument("--torch-threads", type=int, default=1,
                 help="pfl's PyTorch threads (Flower's actors: 1 each)")
  p.add_argument("--conv", choices=("fast", "patches", "xla"), default="fast",
                 help="prfl_jax's convolutions (see the module docstring)")
  p.add_argument("--clients-at-once", default="1",
                 help="prfl_jax's fedavg(clients_at_once=): an integer, or "
                 "'all' (one vmap over the cohort)")
  p.add_argument("--jax-devices", type=int, default=os.cpu_count(),
                 help="prfl_jax's CPU devices (default: one per core): the "
                 "cohort's clients train in parallel over them, "
                 "fedavg(mesh=)")
  p.add_argument("--out", default=os.path.join(common.RESULTS_DIR,
                                               "peers_cpu.json"))
  args = p.parse_args(argv)
  systems = tuple(s for s in args.systems.split(",") if s)
  bad = [s for s in systems if s not in SYSTEMS]
  if bad or not systems or len(set(systems)) != len(systems):
    p.error(f"--systems must be distinct names from {SYSTEMS}, got "
            f"{args.systems!r}")
  for name in ("segments", "rounds", "ray_cpus", "torch_threads",
               "jax_devices"):
    if getattr(args, name) < 1:
      p.error(f"--{name.replace('_', '-')} must be >= 1")
  if args.clients_at_once == "all":
    args.clients_at_once = None
  elif not args.clients_at_once.isdigit() or int(args.clients_at_once) < 1:
    p.error(f"--clients-at-once must be an integer >= 1 or 'all', got "
            f"{args.clients_at_once!r}")
  else:
    args.clients_at_once = int(args.clients_at_once)
  task = peers_task.Task(args.clients, args.examples, args.cohort, args.batch,
                         noise=args.noise, test_size=args.test_size,
                         seed=args.seed)
  try:
    peers_task.check_task(task)
  except ValueError as e:
    p.error(str(e))
  if task.cohort % args.jax_devices:
    p.error(f"--cohort {task.cohort} must be divisible by --jax-devices "
            f"{args.jax_devices}")
  return args, systems, task


def client_mesh(devices: int, notes: list):
  """A mesh of `devices` CPU devices for prfl_jax's clients (None for one).

  XLA makes one CPU device unless `XLA_FLAGS` asks for more before it
  starts (`force_cpu_devices`, which `python -m` runs); otherwise the mesh
  has the devices there are, with a note.
  """
  have = jax.devices()[:devices]
  if len(have) < devices:
    notes.append(f"prfl_jax: {len(have)} of the {devices} --jax-devices "
                 "(XLA started with fewer)")
  return prfl.sharding.client_mesh(have) if len(have) > 1 else None


def force_cpu_devices(count: int):
  """Asks XLA for `count` CPU devices, unless `XLA_FLAGS` names a count."""
  flags = os.environ.get("XLA_FLAGS", "")
  if "host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = (
        f"{flags} --xla_force_host_platform_device_count={count}").strip()


def main(argv=None) -> int:
  args, systems, task = parse(argv)
  systems, notes = available(systems)
  mesh = client_mesh(args.jax_devices, notes)
  args.jax_devices_used = 1 if mesh is None else mesh.devices.size
  for n in notes:
    print(n, flush=True)
  t = time.perf_counter()
  data = peers_task.federation(task)
  print(f"data: {task.num_clients} clients x {task.examples} images "
        f"({time.perf_counter() - t:.1f}s); load {os.getloadavg()}",
        flush=True)
  with tempfile.TemporaryDirectory() as data_dir:
    rows = run_segments(args, systems, task, data, data_dir, mesh)
  return finish(args, task, systems, rows, notes)


def run_segments(args, systems, task, data, data_dir: str, mesh):
  """Every system's rounds, segment by segment: {system: row}."""
  key = jax.random.PRNGKey(args.seed)
  cohorts = cohort_ids(key, task, args.segments * args.rounds)
  evaluate = jax.jit(prfl.models.classifier_eval(cnn_apply("xla")))
  test = peers_task.test_data(task)
  test = (jnp.asarray(test[0]), jnp.asarray(test[1].astype(np.int32)))
  runners = {}
  if "prfl_jax" in systems:
    jx = PrflJax(task, data, key, args.rounds, args.conv,
                 args.clients_at_once, mesh)
    runners["prfl_jax"] = jx.run
  if {"pfl", "flower"} & set(systems):
    from benchmarks import peers_torch  # pylint: disable=g-import-not-at-top
    runners["pfl"] = lambda p, r: peers_torch.run_pfl(
        task, p, data, cohorts[r:r + args.rounds], args.torch_threads)
    runners["flower"] = lambda p, r: peers_torch.run_flower(
        task, p, cohorts[r:r + args.rounds], args.ray_cpus, data_dir)
    if "flower" in systems:
      peers_torch.save_federation(data, data_dir)

  init = peers_task.init_params(task.seed)
  rows = {s: {"system": s, "params": init, "round_s": [], "first_round_s": [],
              "wall_s": [], "accuracy": [], "loss": [], "load": []}
          for s in systems}
  for seg in range(args.segments):
    order = systems[seg % len(systems):] + systems[:seg % len(systems)]
    for s in order:
      row = rows[s]
      t = time.perf_counter()
      row["params"], times = runners[s](row["params"], seg * args.rounds)
      row["wall_s"].append(time.perf_counter() - t)
      row["load"].append(os.getloadavg()[0])
      times = list(map(float, times))
      row["first_round_s"].append(times.pop(0))
      row["round_s"].extend(times)
      ev = evaluate(jax.tree.map(jnp.asarray, row["params"]), test)
      row["accuracy"].append(float(ev["accuracy"]))
      row["loss"].append(float(ev["loss"]))
      print(f"segment {seg + 1}/{args.segments} {s}: rounds "
            f"{seg * args.rounds + 1}-{(seg + 1) * args.rounds} "
            f"{row['wall_s'][-1]:.1f}s, s/round "
            f"{[round(x, 2) for x in times]}, accuracy "
            f"{row['accuracy'][-1]:.3f}, load {row['load'][-1]:.1f}",
            flush=True)
  return rows


def finish(args, task, systems, rows, notes) -> int:
  ref = rows.get("prfl_jax")
  table = []
  for s in systems:
    row = rows[s]
    row["s_per_round"] = statistics.median(row["round_s"]) if row[
        "round_s"] else None
    row["max_param_diff"] = (None if ref is None or s == "prfl_jax" else
                             peers_task.max_abs_diff(row["params"],
                                                     ref["params"]))
    table.append({k: v for k, v in row.items() if k != "params"})
  fastest = rows["prfl_jax"]["s_per_round"] if ref else None
  for r in table:
    r["x_prfl_jax"] = (r["s_per_round"] / fastest if fastest and
                       r["s_per_round"] else None)
    r["final_accuracy"] = r["accuracy"][-1]
  versions = {"python": sys.version.split()[0]}
  for name in ("jax", "torch", "pfl", "flwr", "ray"):
    try:
      versions[name] = __import__(name).__version__
    except (ImportError, AttributeError):
      versions[name] = None
  payload = {"task": task._asdict(), "rounds": args.segments * args.rounds,
             "segments": args.segments, "rounds_per_segment": args.rounds,
             "ray_cpus": args.ray_cpus, "conv": args.conv,
             "clients_at_once": args.clients_at_once,
             "jax_devices": args.jax_devices_used,
             "command": "python -m benchmarks.bench_peers " + " ".join(
                 sys.argv[1:]), "notes": notes, "versions": versions,
             "machine": common.machine_info(), "rows": table}
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(payload, f, indent=1)
  print(common.format_table(table, [
      ("system", "system", "{}"), ("s_per_round", "s/round", "{:.2f}"),
      ("x_prfl_jax", "x prfl_jax", "{:.2f}"),
      ("final_accuracy", "accuracy", "{:.3f}"),
      ("max_param_diff", "max|dparam|", "{:.1e}")]))
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  force_cpu_devices(os.cpu_count())
  sys.exit(main())
