"""Shared pieces of the benchmarks: the paper's MNIST MLP, timing, memory."""

import argparse
import functools
import json
import os
import platform
import resource
import statistics
import threading
import time
from typing import Callable

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

import prfl_jax as prfl
from prfl_jax import kernels
from prfl_jax import models
from experiments import groups
from experiments import registry

IN_DIM, HIDDEN, OUT_DIM = 784, 200, 10
NUM_PARAMS = IN_DIM * HIDDEN + HIDDEN + HIDDEN * OUT_DIM + OUT_DIM  # 159,010
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           "results")


# Softmax cross-entropy of one client's batch `(x [B, 784], y [B])`, a plain
# loss: Federated-Clustering's ghost kernel finds its dense layers itself.
mlp_loss = models.mlp_classifier_loss(2)


def float32_matmuls(fn: Callable) -> Callable:
  """Runs `fn` with every float32 matmul and convolution at full float32.

  The benchmarks compare fp32 with fp32: JAX's default matmul precision is
  TF32 on NVIDIA GPUs, and PyTorch runs cuDNN convolutions in TF32 by
  default. Inside `fn`, JAX's default precision is "highest" and PyTorch's
  TF32 switches are off (both restored after), whatever the environment
  says, so a benchmark called from a test or a notebook measures the same
  arithmetic as `benchmarks/run_gpu.sh`.
  """
  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    try:
      import torch  # pylint: disable=g-import-not-at-top
      switches = [torch.backends.cuda.matmul, torch.backends.cudnn]
      # PyTorch >= 2.9 also has per-backend `fp32_precision` settings, and
      # `cudnn.allow_tf32 = False` leaves `cudnn.conv.fp32_precision` at
      # "none" (inherit), which need not mean IEEE: an H200 run of 11-27 with
      # only the old switches off read 6e-4 / 5e-3 between the CUDA loop's
      # centres and prfl's (prfl's two kernels agreed to 4e-7). Set "ieee"
      # wherever the setting exists.
      precisions = [
          b for b in (torch.backends, torch.backends.cuda.matmul,
                      torch.backends.cudnn,
                      getattr(torch.backends.cudnn, "conv", None))
          if b is not None and hasattr(b, "fp32_precision")]
    except ImportError:
      switches, precisions = [], []
    saved = [s.allow_tf32 for s in switches]
    saved_precisions = [b.fp32_precision for b in precisions]
    try:
      for s in switches:
        s.allow_tf32 = False
      for b in precisions:
        b.fp32_precision = "ieee"
      with jax.default_matmul_precision("highest"):
        return fn(*args, **kwargs)
    finally:
      for s, value in zip(switches, saved):
        s.allow_tf32 = value
      for b, value in zip(precisions, saved_precisions):
        b.fp32_precision = value
  return wrapped


def parse_plan(spec: str) -> prfl.ExecutionPlan:
  """`"full:gram"`, `"8:ghost"` or `"auto:auto"` -> `prfl.ExecutionPlan`.

  CHUNK is an integer, `full` (one nested vmap, `chunk_size=None`) or `auto`;
  KERNEL a registered kernel name or `auto`.
  """
  chunk, kernel = spec.split(":")
  if chunk not in ("full", "auto"):
    chunk = int(chunk)
  return prfl.ExecutionPlan(None if chunk == "full" else chunk, kernel)


def positive_int(text: str) -> int:
  """An argparse type: an integer >= 1."""
  value = int(text)
  if value < 1:
    raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
  return value


def int_list(minimum: int) -> Callable:
  """An argparse type: comma-separated integers, each >= `minimum`."""
  def parse(text):
    try:
      values = tuple(int(v) for v in text.split(","))
    except ValueError:
      raise argparse.ArgumentTypeError(
          f"must be comma-separated integers, got {text!r}") from None
    if min(values) < minimum:
      raise argparse.ArgumentTypeError(
          f"every value must be >= {minimum}, got {text!r}")
    return values
  return parse


def name_list(allowed) -> Callable:
  """An argparse type: comma-separated distinct names from `allowed`."""
  def parse(text):
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in values if v not in allowed]
    if bad or not values or len(set(values)) != len(values):
      raise argparse.ArgumentTypeError(
          f"must be distinct names from {tuple(allowed)}, got {text!r}")
    return values
  return parse


def add_model_args(p: argparse.ArgumentParser, *, models, default_models,
                   clients, batch_size, repeats: int, smoke: str, out: str):
  """The options of the benchmarks that time one FC round per model of
  `benchmarks.zoo` (`bench_models`, `bench_plans`): which models, N, batch,
  clustering steps, timed calls, width divisor, smoke run, output file."""
  p.add_argument("--models", type=name_list(models), default=default_models)
  p.add_argument("--clients", type=int_list(2), default=clients,
                 help="comma-separated numbers of clients N (>= 2)"
                 + ("" if clients else "; default: each model's own"))
  p.add_argument("--batch-size", type=positive_int, default=batch_size,
                 help=None if batch_size else
                 "default: 32 for the MLPs, 16 for the CNNs")
  p.add_argument("--num-iters", type=positive_int, default=10,
                 help="Threshold-Clustering steps")
  p.add_argument("--repeats", type=positive_int, default=repeats,
                 help="timed calls of every prfl round")
  p.add_argument("--width-divisor", type=positive_int, default=1,
                 help="divide every channel and hidden width (smaller nets)")
  p.add_argument("--smoke", action="store_true", help=smoke)
  p.add_argument("--out", default=os.path.join(RESULTS_DIR, out))


def compile_round(loss_fn: Callable, params, batch, plan, radius,
                  num_iters: int) -> tuple:
  """One FC round's inner loop (`kernels.cluster_at_models`: N^2 gradients,
  Threshold-Clustering per model) with `plan`, jitted and compiled ahead of
  time; returns `(compiled, compile seconds)`, `compiled(params, batch)`
  giving the centres."""
  fn = jax.jit(lambda p, b: kernels.cluster_at_models(
      loss_fn, p, b, radius=radius, num_iters=num_iters, plan=plan).centers)
  t0 = time.perf_counter()
  compiled = fn.lower(params, batch).compile()
  return compiled, time.perf_counter() - t0


def plan_settings(spec: str) -> dict:
  """`"full:gram"` -> the registry's plan settings `chunk_size="all",
  kernel="gram"` (`"4:ghost"` -> 4, "ghost"; `"auto:auto"` as is)."""
  plan = parse_plan(spec)
  chunk = "all" if plan.chunk_size is None else plan.chunk_size
  return dict(chunk_size=chunk, kernel=plan.kernel)


def algorithm(name: str, loss_fn: Callable, *, radius=None, **settings):
  """Algorithm `name` built as every experiment builds it.

  `experiments.registry`'s factory with its default settings and `settings`
  over them (e.g. `lr=0.1, momentum=0.0, groups=15, **plan_settings(s)`);
  `radius` (a value or rule) replaces FC's `quantile_radius(quantile)`. The
  step is the bare one the benchmarks time: no true clusters (no
  diagnostics), K = 1, key 0 for the factories that draw.

  Raises:
    ValueError: if `name` is not registered or `settings` names a setting
      the algorithm does not read.
  """
  if name not in registry.names():
    raise ValueError(f"unknown algorithm {name!r}; known: "
                     f"{', '.join(registry.names())}.")
  reads = registry.REGISTRY[name].reads
  unknown = sorted(set(settings) - set(reads))
  if unknown:
    raise ValueError(f"{name} does not read {unknown}; it reads "
                     f"{', '.join(reads)}.")
  s = registry.settings(groups.Optim(), name)
  s.update(settings)
  ctx = registry.Context(loss_fn, clusters=None, num_clusters=1,
                         key=jax.random.PRNGKey(0), radius=radius)
  return registry.build(name, ctx, s)


def agreement_status(rows: list, limit: float = 1e-3) -> int:
  """0 if every row's `rel_diff` (centres against the reference) is below
  `limit`, else 1 after naming the rows that disagree."""
  bad = [r for r in rows if not r["rel_diff"] < limit]
  if bad:
    print("WARNING: centres disagree: " + ", ".join(
        f"{r['model']}/{r['n']}/{r['config']}" for r in bad))
    return 1
  return 0


def parse_radius(spec: str):
  """`"quantile:Q"` -> `prfl.quantile_radius(Q)`, else a float radius."""
  if spec.startswith("quantile:"):
    return prfl.quantile_radius(float(spec.split(":")[1]))
  return float(spec)


def plan_name(plan: prfl.ExecutionPlan) -> str:
  """`ExecutionPlan(None, "gram")` -> `"full/gram"`, `(4, "ghost")` -> `"c4/ghost"`."""
  c = plan.chunk_size
  chunk = "full" if c is None else ("auto" if c == "auto" else f"c{c}")
  return f"{chunk}/{plan.kernel}"


def mnist_like_federation(num_clients: int, batch_size: int, seed: int = 0):
  """Stacked MLP params `[N, ...]` and a random batch of MNIST shape `[N, B, ...]`.

  The params are in `prfl_jax.models` (flax.linen.Dense) layout:
  `{"Dense_0": {"kernel": [N, 784, 200], "bias": [N, 200]}, "Dense_1": ...}`.

  Drawn with NumPy in float32 (params uniform in +-1/sqrt(fan_in), inputs
  uniform in [0, 1), labels uniform) and written into the device arrays a few
  clients at a time (`_rows_on_device`), so that building the inputs holds
  the inputs plus one chunk of at most `_CHUNK_BYTES`, never a second full
  copy. The numbers are those of one NumPy draw per leaf, in the order
  Dense_0 kernel, Dense_0 bias, Dense_1 kernel, Dense_1 bias, x, y.
  """
  rng = np.random.default_rng(seed)

  def uniform(shape, scale):
    def draw(rows_shape):
      out = rng.random(rows_shape, dtype=np.float32)
      out *= 2 * scale
      out -= scale
      return out
    return _rows_on_device(shape, np.float32, draw)

  n = num_clients
  s1, s2 = IN_DIM**-0.5, HIDDEN**-0.5
  params = {}
  params["Dense_0"] = {"kernel": uniform((n, IN_DIM, HIDDEN), s1),
                       "bias": uniform((n, HIDDEN), s1)}
  params["Dense_1"] = {"kernel": uniform((n, HIDDEN, OUT_DIM), s2),
                       "bias": uniform((n, OUT_DIM), s2)}
  x = _rows_on_device((n, batch_size, IN_DIM), np.float32,
                      lambda s: rng.random(s, dtype=np.float32))
  y = jax.device_put(rng.integers(0, OUT_DIM, (n, batch_size), dtype=np.int32))
  return params, (x, y)


_CHUNK_BYTES = 16 * 2**20


@functools.partial(jax.jit, donate_argnums=0)
def _write_rows(full: jax.Array, rows: jax.Array, start) -> jax.Array:
  """`full[start:start + R] = rows` in place (`full` is donated)."""
  return lax.dynamic_update_slice_in_dim(full, rows, start, axis=0)


def _rows_on_device(shape: tuple, dtype, draw: Callable) -> jax.Array:
  """A device array of `shape`, filled by `draw(rows_shape) -> np.ndarray`.

  `draw` is called for consecutive chunks of leading rows (the same numbers
  as one call for all rows when it draws sequentially from one generator);
  each chunk is copied into the donated device array, so the peak is the
  array plus one chunk (`jax.device_put` of a whole NumPy array would hold
  both full copies, and `jnp.asarray` three).
  """
  row_bytes = max(1, int(np.prod(shape[1:])) * np.dtype(dtype).itemsize)
  rows = max(1, _CHUNK_BYTES // row_bytes)
  out = jnp.zeros(shape, dtype)
  for start in range(0, shape[0], rows):
    chunk = draw((min(rows, shape[0] - start),) + tuple(shape[1:]))
    out = _write_rows(out, chunk, start)
  return out


def median_time(fn: Callable[[], object], repeats: int,
                warmup: int = 1) -> tuple:
  """Median and all wall times of `fn()` (which must block until done)."""
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return statistics.median(times), times


def time_round(round_fn: Callable[[], object], repeats: int,
               budget_s: float) -> tuple:
  """Times a round: one warm-up call, then up to `repeats` timed calls.

  Fewer timed calls are made when the warm-up shows that `repeats` would
  take longer than `budget_s`; when the warm-up alone takes longer, it is
  the measurement (a round compiled ahead of time has no compile in it).
  Records each call's wall time and this process's CPU time (all its
  threads; on a shared machine the steadier measure of the work), and the
  growth of the resident set during the timed calls.

  Returns:
    `(dict(time_s (median wall), times, cpu_s (least CPU), cpu_times,
    rss_mb), output of the last call)`.
  """
  t0, c0 = time.perf_counter(), time.process_time()
  out = round_fn()
  first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
  n = min(repeats, int(budget_s / max(first, 1e-9)))
  if n < 1:
    return dict(time_s=first, times=[first], cpu_s=first_cpu,
                cpu_times=[first_cpu], rss_mb=None), out
  times, cpu = [], []
  with RssSampler() as rss:
    for _ in range(n):
      t0, c0 = time.perf_counter(), time.process_time()
      out = round_fn()
      times.append(time.perf_counter() - t0)
      cpu.append(time.process_time() - c0)
  return dict(time_s=statistics.median(times), times=times, cpu_s=min(cpu),
              cpu_times=cpu, rss_mb=rss.peak_growth_mb), out


class RssSampler:
  """Samples this process's RSS in a thread; `peak_growth_mb` after `stop`."""

  def __init__(self, interval_s: float = 0.002):
    self._interval = interval_s
    self._stop = threading.Event()
    self._thread = None
    self.base = self.peak = 0

  @staticmethod
  def rss() -> int:
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * resource.getpagesize()

  def __enter__(self):
    self.base = self.peak = self.rss()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()
    return self

  def _run(self):
    while not self._stop.is_set():
      self.peak = max(self.peak, self.rss())
      time.sleep(self._interval)

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()
    self.peak = max(self.peak, self.rss())

  @property
  def peak_growth_mb(self) -> float:
    return (self.peak - self.base) / 2**20


def machine_info() -> dict:
  """Load, CPU count and versions, stored with every result."""
  info = {
      "loadavg": os.getloadavg(),
      "cpu_count": os.cpu_count(),
      "platform": platform.platform(),
      "jax": jax.__version__,
      "devices": [str(d) for d in jax.devices()],
      "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
      "matmul_precision": str(jax.config.jax_default_matmul_precision),
  }
  try:
    import torch  # pylint: disable=g-import-not-at-top
    info["torch"] = torch.__version__
    info["torch_threads"] = torch.get_num_threads()
  except ImportError:
    info["torch"] = None
  return info


def save_json(name: str, payload: dict) -> str:
  os.makedirs(RESULTS_DIR, exist_ok=True)
  path = os.path.join(RESULTS_DIR, name)
  with open(path, "w") as f:
    json.dump(payload, f, indent=1, default=_jsonable)
  return path


def _jsonable(x):
  if isinstance(x, (np.floating, np.integer)):
    return x.item()
  if isinstance(x, np.ndarray):
    return x.tolist()
  raise TypeError(type(x))


def format_table(rows: list, columns: list) -> str:
  """Plain-text table of dict rows; `columns` is a list of (key, header, fmt)."""
  cells = [[h for _, h, _ in columns]]
  for row in rows:
    cells.append([
        ("-" if row.get(k) is None else fmt.format(row[k]))
        for k, _, fmt in columns])
  widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
  lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
  lines.insert(1, "  ".join("-" * w for w in widths))
  return "\n".join(lines)
