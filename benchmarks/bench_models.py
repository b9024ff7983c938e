"""One Federated-Clustering round on user-written CNNs: PyTorch loop vs prfl.

A round (Werner et al., 2023, Algorithm 1, lines 4-7) computes every client's
gradient at every client's model (N^2 gradients) and, for every model, runs
Threshold-Clustering (Algorithm 2, 10 steps, quantile radius) with one centre
started at the owner's gradient. The models are Flax linen modules written as
a user would write them (`nn.Conv`, `nn.Dense`, `nn.max_pool`, ReLU; the loss
is `optax.softmax_cross_entropy_with_integer_labels` of `model.apply`):

  cnn   28x28x1, Conv 32 - pool - Conv 64 - pool - Dense 256 - Dense 10
  vgg8  32x32x3, Conv 64/128/256/512/512 (each followed by a 2x2 max-pool) -
        Dense 512 - Dense 512 - Dense 100 (CIFAR-100's VGG-8)

(3x3 convolutions with SAME padding, 2x2 max-pools of stride 2.) Compared in
one run, on the same parameters and random data:
  * `torch-loop`: the same network in PyTorch, written like the paper's code
    (for each model, for each client: forward, backward, flatten the
    gradients; Threshold-Clustering in torch), one run per thread setting;
  * `prfl gram`: `cluster_at_models` with `ExecutionPlan(1, "gram")`, which
    materialises each model's `[N, P]` client gradients;
  * `prfl auto`: the default `ExecutionPlan()`, i.e. the automatic ghost
    kernel (the layers found in the loss's jaxpr, conv rule
    `prfl_jax.kernels.conv`).
`maxdiff` is the largest |centre - centre of prfl gram| over all models and
parameters. Times are medians of the timed calls after one untimed call of
the AOT-compiled round (a single timed call when one takes longer than the
budget); `compile_s` is the XLA compile time.

  python -m benchmarks.bench_models                     # cnn and vgg8, N = 8, 16
  python -m benchmarks.bench_models --models cnn --clients 8 --repeats 5
  python -m benchmarks.bench_models --smoke             # tiny, for the tests
"""

import argparse
import dataclasses
import os
import statistics
import sys
import time
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import prfl_jax as prfl
from prfl_jax import kernels
from benchmarks import common
from experiments import files as experiments_files


@dataclasses.dataclass(frozen=True)
class Spec:
  """A CNN: 3x3 convs each followed by ReLU and a 2x2 max-pool, then MLP."""
  name: str
  image: tuple  # (H, W, C)
  convs: tuple  # output channels
  dense: tuple  # hidden widths
  classes: int

  def scaled(self, divisor: int) -> "Spec":
    """The same network with every width divided by `divisor` (>= 1)."""
    div = lambda ws: tuple(max(1, w // divisor) for w in ws)
    return dataclasses.replace(self, convs=div(self.convs),
                               dense=div(self.dense))


SPECS = {
    "cnn": Spec("cnn", (28, 28, 1), (32, 64), (256,), 10),
    "vgg8": Spec("vgg8", (32, 32, 3), (64, 128, 256, 512, 512), (512, 512),
                 100),
}


class ConvNet(nn.Module):
  """The Flax model of a `Spec`, as a user writes it."""
  convs: Sequence[int]
  dense: Sequence[int]
  classes: int

  @nn.compact
  def __call__(self, x):
    for c in self.convs:
      x = nn.relu(nn.Conv(c, (3, 3))(x))
      x = nn.max_pool(x, (2, 2), strides=(2, 2))
    x = x.reshape((x.shape[0], -1))
    for h in self.dense:
      x = nn.relu(nn.Dense(h)(x))
    return nn.Dense(self.classes)(x)


def make_loss(spec: Spec):
  """`loss_fn(params, (images [B, H, W, C], labels [B]))`, as a user writes it."""
  model = ConvNet(spec.convs, spec.dense, spec.classes)

  def loss_fn(params, batch):
    images, labels = batch
    logits = model.apply(params, images)
    return optax.softmax_cross_entropy_with_integer_labels(
        logits, labels).mean()

  return model, loss_fn


def federation(spec: Spec, num_clients: int, batch_size: int, seed: int):
  """Stacked Flax params (one init per client) and random images and labels."""
  model, _ = make_loss(spec)
  keys = jax.random.split(jax.random.key(seed), num_clients)
  params = jax.jit(jax.vmap(lambda k: model.init(
      k, jnp.zeros((1,) + spec.image, jnp.float32))))(keys)
  rng = np.random.default_rng(seed)
  images = rng.random((num_clients, batch_size) + spec.image,
                      dtype=np.float32)
  labels = rng.integers(0, spec.classes, (num_clients, batch_size),
                        dtype=np.int32)
  return params, (jnp.asarray(images), jnp.asarray(labels))


def flat_centers(centers) -> np.ndarray:
  """`[N, P]`, leaves in `jax.tree` order."""
  leaves = jax.tree.leaves(centers)
  n = leaves[0].shape[0]
  return np.concatenate([np.asarray(l).reshape(n, -1) for l in leaves], 1)


def _timed(fn, repeats: int, budget_s: float) -> dict:
  """Calls `fn` once untimed, then up to `repeats` times within the budget.

  When the untimed call alone takes longer than the budget, it is the
  measurement (the round is compiled ahead of time, so it has no compile).
  """
  t0 = time.perf_counter()
  out = fn()
  first = time.perf_counter() - t0
  n = min(repeats, int(budget_s / max(first, 1e-9)))
  if n < 1:
    return dict(time_s=first, times=[first], out=out)
  times = []
  for _ in range(n):
    t0 = time.perf_counter()
    out = fn()
    times.append(time.perf_counter() - t0)
  return dict(time_s=statistics.median(times), times=times, out=out)


def run_prfl(loss_fn, params, batch, plan, radius, num_iters, repeats,
             budget_s) -> dict:
  """Compiles and times one jitted round of `cluster_at_models` with `plan`."""
  fn = jax.jit(lambda p, b: kernels.cluster_at_models(
      loss_fn, p, b, radius=radius, num_iters=num_iters, plan=plan).centers)
  t0 = time.perf_counter()
  compiled = fn.lower(params, batch).compile()
  compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  res = _timed(lambda: jax.block_until_ready(compiled(params, batch)),
               repeats, budget_s)
  res["out"] = flat_centers(res["out"])
  res["compile_s"] = compile_s
  res["xla_temp_mb"] = (None if mem is None else
                        mem.temp_size_in_bytes / 2**20)
  return res


def _torch_net(torch, spec: Spec, params_i):
  """The PyTorch twin of `ConvNet(spec)` holding one model's Flax weights."""
  tnn = torch.nn
  to_t = lambda a: torch.from_numpy(np.array(a, np.float32))
  p = params_i["params"]
  layers, c_in = [], spec.image[2]
  for k, c in enumerate(spec.convs):
    conv = tnn.Conv2d(c_in, c, 3, padding=1)
    with torch.no_grad():  # HWIO -> OIHW.
      conv.weight.copy_(to_t(p[f"Conv_{k}"]["kernel"]).permute(3, 2, 0, 1))
      conv.bias.copy_(to_t(p[f"Conv_{k}"]["bias"]))
    layers += [conv, tnn.ReLU(), tnn.MaxPool2d(2)]
    c_in = c
  # Flatten in Flax's (H, W, C) order so that the first Dense matches.
  layers.append(_ChannelsLastFlatten(torch))
  widths = list(spec.dense) + [spec.classes]
  for k, h in enumerate(widths):
    kernel = to_t(p[f"Dense_{k}"]["kernel"])
    lin = tnn.Linear(kernel.shape[0], h)
    with torch.no_grad():
      lin.weight.copy_(kernel.T)
      lin.bias.copy_(to_t(p[f"Dense_{k}"]["bias"]))
    layers.append(lin)
    if k < len(widths) - 1:
      layers.append(tnn.ReLU())
  return tnn.Sequential(*layers)


def _ChannelsLastFlatten(torch):  # pylint: disable=invalid-name
  class Flatten(torch.nn.Module):
    def forward(self, x):
      return x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)
  return Flatten()


def _torch_to_flax_order(torch, net, spec: Spec, flat) -> np.ndarray:
  """Torch-ordered flat centres `[N, P]` -> `flat_centers` order of Flax."""
  shapes = [tuple(p.shape) for p in net.parameters()]
  pieces, start = [], 0
  for s in shapes:
    size = int(np.prod(s))
    pieces.append(flat[:, start:start + size].reshape((-1,) + s))
    start += size
  flax_leaves = {}
  k = 0
  for i in range(len(spec.convs)):
    w, b = pieces[k], pieces[k + 1]
    flax_leaves[("Conv", i)] = (b, w.transpose(0, 3, 4, 2, 1))
    k += 2
  for i in range(len(spec.dense) + 1):
    w, b = pieces[k], pieces[k + 1]
    flax_leaves[("Dense", i)] = (b, w.transpose(0, 2, 1))
    k += 2
  # jax.tree order of {"params": {"Conv_0": {bias, kernel}, ..., "Dense_0"}}:
  # keys sorted as strings.
  names = sorted([f"Conv_{i}" for i in range(len(spec.convs))] +
                 [f"Dense_{i}" for i in range(len(spec.dense) + 1)])
  out = []
  for name in names:
    kind, i = name.split("_")
    b, w = flax_leaves[(kind, int(i))]
    out += [b.reshape(b.shape[0], -1), w.reshape(w.shape[0], -1)]
  del torch
  return np.concatenate(out, axis=1)


def run_torch_loop(spec: Spec, params, batch, radius, num_iters, threads,
                   repeats, budget_s, device="cpu"):
  """The paper's per-pair loop in PyTorch on `device`; None without torch.

  The round ends by copying the centres to the host, which waits for a
  GPU's queued work, so the timing is the whole round on either device.
  """
  try:
    import torch  # pylint: disable=g-import-not-at-top
    from torch.nn import functional as F  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  from benchmarks import bench_round  # pylint: disable=g-import-not-at-top
  n = jax.tree.leaves(params)[0].shape[0]
  nets = [_torch_net(torch, spec, jax.tree.map(lambda a, i=i: a[i], params))
          .to(device) for i in range(n)]
  xs = [torch.from_numpy(np.array(batch[0][j])).permute(0, 3, 1, 2)
        .contiguous().to(device) for j in range(n)]
  ys = [torch.from_numpy(np.array(batch[1][j], np.int64)).to(device)
        for j in range(n)]

  def round_():
    centers = []
    for i, net in enumerate(nets):
      grads = []
      for j in range(n):
        net.zero_grad()
        F.cross_entropy(net(xs[j]), ys[j]).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in net.parameters()]))
      with torch.no_grad():
        z = torch.stack(grads)
        centers.append(bench_round.torch_threshold_clustering(
            torch, z, z[i].clone(), radius, num_iters))
    return torch.stack(centers).cpu()

  default = torch.get_num_threads()
  torch.set_num_threads(threads or default)
  try:
    res = _timed(round_, repeats, budget_s)
    res["torch_threads"] = torch.get_num_threads()
  finally:
    torch.set_num_threads(default)
  res["torch_device"] = device
  res["out"] = _torch_to_flax_order(torch, nets[0].cpu(), spec,
                                    res["out"].numpy())
  return res


def bench(spec: Spec, n: int, args, radius) -> list:
  """All configurations for one model and N; rows of the result table."""
  params, batch = federation(spec, n, args.batch_size, args.seed)
  _, loss_fn = make_loss(spec)
  rows, outs = [], {}

  def add(config, res):
    out = res.pop("out")
    outs[config] = out
    row = dict(model=spec.name, n=n, config=config, **res)
    rows.append(row)
    print(f"  {spec.name:5s} N={n:3d} {config:16s} {res['time_s']:9.3f} s",
          flush=True)

  plans = {"prfl gram": prfl.ExecutionPlan(1, "gram"),
           "prfl auto": prfl.ExecutionPlan()}
  for name in args.configs:
    if f"{spec.name}:{n}:{name}" in args.skip:
      print(f"  {spec.name:5s} N={n:3d} {name:16s} skipped (--skip)",
            flush=True)
      continue
    if name == "torch-loop":
      for threads in args.torch_threads:
        res = run_torch_loop(spec, params, batch, radius, args.num_iters,
                             threads, args.loop_repeats, args.budget_s,
                             device=args.torch_device)
        if res is None:
          print("  torch is not importable: no PyTorch loop.", flush=True)
          break
        add(f"torch-loop/{res['torch_threads']}t", res)
    else:
      plan = plans[name]
      resolved = kernels.resolve_plan(plan, loss_fn, params, batch)
      res = run_prfl(loss_fn, params, batch, plan, radius, args.num_iters,
                     args.repeats, args.budget_s)
      res["plan"] = common.plan_name(resolved)
      add(name, res)
  ref = "prfl gram" if "prfl gram" in outs else rows[0]["config"]
  scale = float(np.max(np.abs(outs[ref])))
  torch_times = [r["time_s"] for r in rows
                 if r["config"].startswith("torch-loop")]
  for r in rows:
    r["max_abs_diff"] = float(np.max(np.abs(outs[r["config"]] - outs[ref])))
    r["rel_diff"] = r["max_abs_diff"] / scale
    r["diff_ref"] = ref
    r["vs_torch"] = (min(torch_times) / r["time_s"]) if torch_times else None
  return rows


COLUMNS = [
    ("model", "model", "{}"), ("n", "N", "{}"), ("config", "config", "{}"),
    ("plan", "plan", "{}"), ("time_s", "s/round", "{:.3f}"),
    ("vs_torch", "x torch", "{:.2f}"), ("compile_s", "compile s", "{:.1f}"),
    ("xla_temp_mb", "XLA temp MiB", "{:.0f}"),
    ("max_abs_diff", "maxdiff", "{:.1e}"), ("rel_diff", "reldiff", "{:.1e}"),
]
CONFIGS = ("torch-loop", "prfl gram", "prfl auto")


def _int_list(text: str, minimum: int) -> tuple:
  try:
    values = tuple(int(v) for v in text.split(","))
  except ValueError:
    raise argparse.ArgumentTypeError(
        f"must be comma-separated integers, got {text!r}") from None
  if not values or min(values) < minimum:
    raise argparse.ArgumentTypeError(
        f"every value must be >= {minimum}, got {text!r}")
  return values


def _choices(allowed):
  def parse(text):
    values = tuple(v.strip() for v in text.split(","))
    bad = [v for v in values if v not in allowed]
    if bad or len(set(values)) != len(values):
      raise argparse.ArgumentTypeError(
          f"must be distinct names from {allowed}, got {text!r}")
    return values
  return parse


def _positive_int(text):
  v = int(text)
  if v < 1:
    raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
  return v


def _radius(text):
  from benchmarks import bench_round  # pylint: disable=g-import-not-at-top
  try:
    return text, bench_round.parse_radius(text)
  except (ValueError, IndexError) as e:
    raise argparse.ArgumentTypeError(
        f"must be a float or quantile:Q, got {text!r} ({e})") from None


SMOKE = dict(clients=(2,), batch_size=2, width_divisor=16, repeats=1,
             loop_repeats=1, budget_s=1.0, torch_threads=(1,))


@common.float32_matmuls
def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--models", type=_choices(tuple(SPECS)), default=("cnn",
                                                                    "vgg8"))
  p.add_argument("--clients", type=lambda t: _int_list(t, 2), default=(8, 16),
                 help="comma-separated numbers of clients N (>= 2)")
  p.add_argument("--batch-size", type=_positive_int, default=16)
  p.add_argument("--configs", type=_choices(CONFIGS), default=CONFIGS)
  p.add_argument("--radius", type=_radius, default="quantile:0.2",
                 help="a float, or quantile:Q for prfl.quantile_radius(Q)")
  p.add_argument("--num-iters", type=_positive_int, default=10)
  p.add_argument("--repeats", type=_positive_int, default=3,
                 help="timed calls of a prfl round (median reported)")
  p.add_argument("--loop-repeats", type=_positive_int, default=1,
                 help="timed calls of the PyTorch loop")
  p.add_argument("--budget-s", type=float, default=30.0,
                 help="fewer timed calls when they would take longer")
  p.add_argument("--torch-threads", type=lambda t: _int_list(t, 0),
                 default=(0, 1),
                 help="torch.set_num_threads per run of the loop (0: torch's "
                 "default); 'x torch' is against the fastest")
  p.add_argument("--skip", type=lambda t: tuple(
      s.strip() for s in t.split(",") if s.strip()),
                 default=("vgg8:16:prfl gram",),
                 help="MODEL:N:CONFIG entries not to run (default: the "
                 "Gram kernel on VGG-8 at N = 16, ~30 min per call on 2 "
                 "cores); the centres are then compared with the first "
                 "configuration run")
  p.add_argument("--torch-device", default="cpu",
                 help="device of the PyTorch loop (cpu, cuda)")
  p.add_argument("--width-divisor", type=_positive_int, default=1,
                 help="divide every channel and hidden width (smaller nets)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--smoke", action="store_true",
                 help="tiny sizes (N = 2, batch 2, widths / 16) in seconds")
  p.add_argument("--out", default=os.path.join(common.RESULTS_DIR,
                                               "models_cpu.json"))
  args = p.parse_args(argv)
  if args.smoke:
    explicit = {a.split("=")[0].lstrip("-").replace("-", "_")
                for a in (argv if argv is not None else sys.argv[1:])
                if a.startswith("--")}
    for k, v in SMOKE.items():
      if k not in explicit:
        setattr(args, k, v)
  radius_text, radius = args.radius
  args.radius = radius_text

  info = common.machine_info()
  print(f"load average {info['loadavg']}, {info['cpu_count']} CPUs, jax "
        f"{info['jax']}, torch {info['torch']}", flush=True)
  rows = []

  def save(complete):
    experiments_files.write_json(args.out, dict(
        args=vars(args), machine=info, complete=complete,
        specs={m: dataclasses.asdict(SPECS[m].scaled(args.width_divisor))
               for m in args.models}, rows=rows))

  for name in args.models:
    spec = SPECS[name].scaled(args.width_divisor)
    for n in args.clients:
      rows.extend(bench(spec, n, args, radius))
      info["loadavg_end"] = os.getloadavg()
      save(complete=False)  # A long run keeps what it has measured.
  print()
  print(f"batch {args.batch_size}, radius {radius_text}, {args.num_iters} "
        f"clustering steps, widths / {args.width_divisor}; x torch = "
        "speed-up over the fastest torch thread setting; maxdiff = "
        "max |centre - prfl gram centre|.")
  print(common.format_table(rows, COLUMNS))
  print(f"load average start {info['loadavg']} end {info['loadavg_end']}")
  save(complete=True)
  print(f"saved {args.out}")
  bad = [r for r in rows if not r["rel_diff"] < 1e-3]
  if bad:
    print("WARNING: centres disagree: " + ", ".join(
        f"{r['model']}/{r['n']}/{r['config']}" for r in bad))
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
