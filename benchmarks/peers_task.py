"""The task `bench_peers` gives every system: data, initial model, cohorts.

pfl-research's CIFAR-10 benchmark (`benchmarks/image_classification`,
`configs/baseline.yaml`, dataset `cifar10_iid`): 1,000 clients of 50 images
each, cohort 50, one local epoch of SGD (learning rate 0.1, batches of 10, in
the client's data order: pfl's `Dataset.iter` does not shuffle), the central
optimizer SGD with learning rate 1.0 on the mean model change (plain model
averaging), every client weighted equally (`WeightByUser`).

Real CIFAR-10 is not on this machine (no internet), so the images are
generated, CIFAR-shaped and learnable: ten class templates (smooth random
colour fields); an image is its class's template at a random contrast in
[0.5, 1.5] plus every class's template at a Gaussian weight (std
`distract`), shifted by up to 3 pixels, covered in pixel noise, rounded to
uint8 like CIFAR's pixels and normalised by a fixed mean and scale. A
client's images come from its own seed, `(seed, client)`, so that any process
(a Ray actor of Flower's simulation) makes exactly the same data.

Everything here is NumPy, so that each system's side (JAX, PyTorch) loads the
same numbers. Parameters are kept in Flax's layout (conv kernels
`[kh, kw, in, out]`, dense kernels `[in, out]`, the flattened feature map in
H, W, C order); `to_torch`/`from_torch` convert to pfl's PyTorch model (conv
weights `[out, in, kh, kw]`, the feature map flattened in C, H, W order).
"""

from typing import NamedTuple

import numpy as np

IMAGE = (32, 32, 3)
NUM_CLASSES = 10
CONV = (32, 64)  # pfl's simple_cnn: two 3x3 VALID convolutions.
HIDDEN = 128
POOLED = (IMAGE[0] - 4) // 2  # 14: the map after the convs and a 2x2 pool.
FLAT = POOLED * POOLED * CONV[1]  # 12,544 inputs to the hidden layer.
NUM_PARAMS = (3 * 3 * IMAGE[2] * CONV[0] + CONV[0] + 3 * 3 * CONV[0] * CONV[1]
              + CONV[1] + FLAT * HIDDEN + HIDDEN + HIDDEN * NUM_CLASSES
              + NUM_CLASSES)  # 1,626,442.

_MAX_SHIFT = 3
_PIXEL_MEAN, _PIXEL_SCALE = 127.5, 64.0


class Task(NamedTuple):
  """The federated task; the defaults are pfl-research's CIFAR-10 shape."""
  num_clients: int = 1000
  examples: int = 50  # per client.
  cohort: int = 50
  batch: int = 10  # local batch size; one epoch = examples / batch steps.
  local_lr: float = 0.1
  noise: float = 1.0  # pixel noise (std), in template units.
  distract: float = 0.5  # std of the other classes' templates mixed in.
  test_size: int = 2000
  seed: int = 0

  @property
  def local_steps(self) -> int:
    return self.examples // self.batch


def check_task(task: Task):
  """Raises ValueError naming the field when `task` is not a valid task."""
  for name in ("num_clients", "examples", "cohort", "batch", "test_size"):
    v = getattr(task, name)
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
      raise ValueError(f"`{name}` must be a positive integer, got {v!r}.")
  if task.cohort > task.num_clients:
    raise ValueError(f"`cohort` ({task.cohort}) must be at most "
                     f"`num_clients` ({task.num_clients}).")
  if task.examples % task.batch:
    raise ValueError(f"`batch` ({task.batch}) must divide `examples` "
                     f"({task.examples}): one epoch is whole batches.")
  for name in ("local_lr", "noise", "distract"):
    v = getattr(task, name)
    if not np.isfinite(v) or v <= 0:
      raise ValueError(f"`{name}` must be a positive number, got {v!r}.")


def _templates(seed: int) -> np.ndarray:
  """`[10, 32, 32, 3]` class templates: 8x8 random fields, upsampled 4x."""
  rng = np.random.default_rng([seed, 2**31 - 1])
  coarse = rng.standard_normal((NUM_CLASSES, 8, 8, IMAGE[2]))
  return np.kron(coarse, np.ones((1, 4, 4, 1))).astype(np.float32)


def _images(rng: np.random.Generator, templates: np.ndarray, count: int,
            noise: float, distract: float):
  """`count` normalised images `[count, 32, 32, 3]` and labels `[count]`."""
  y = rng.integers(0, NUM_CLASSES, count)
  shifts = rng.integers(-_MAX_SHIFT, _MAX_SHIFT + 1, (count, 2))
  mix = distract * rng.standard_normal((count, NUM_CLASSES))
  mix[np.arange(count), y] += rng.uniform(0.5, 1.5, count)  # the class.
  x = np.einsum("nk,khwc->nhwc", mix.astype(np.float32), templates)
  # np.roll of each image by its shift: out[i, j] = x[(i - dy) % H, (j - dx) % W].
  rows = (np.arange(IMAGE[0]) - shifts[:, :1]) % IMAGE[0]
  cols = (np.arange(IMAGE[1]) - shifts[:, 1:]) % IMAGE[1]
  x = x[np.arange(count)[:, None, None], rows[:, :, None], cols[:, None, :]]
  x = x + noise * rng.standard_normal(x.shape, np.float32)
  pixels = np.clip(np.round(_PIXEL_MEAN + 40.0 * x), 0, 255)  # CIFAR's uint8.
  return ((pixels - _PIXEL_MEAN) / _PIXEL_SCALE).astype(np.float32), y


def client_data(task: Task, client: int):
  """Client `client`'s images `[examples, 32, 32, 3]` float32, labels int64."""
  rng = np.random.default_rng([task.seed, 1, int(client)])
  return _images(rng, _templates(task.seed), task.examples, task.noise,
                 task.distract)


def federation(task: Task):
  """All clients' data: images `[N, examples, 32, 32, 3]`, labels `[N, M]`."""
  templates = _templates(task.seed)
  xs, ys = [], []
  for i in range(task.num_clients):
    x, y = _images(np.random.default_rng([task.seed, 1, i]), templates,
                   task.examples, task.noise,
                 task.distract)
    xs.append(x)
    ys.append(y)
  return np.stack(xs), np.stack(ys)


def test_data(task: Task):
  """The held-out images `[test_size, 32, 32, 3]` and labels, same classes."""
  rng = np.random.default_rng([task.seed, 2])
  return _images(rng, _templates(task.seed), task.test_size, task.noise,
                 task.distract)


def init_params(seed: int) -> dict:
  """pfl's simple_cnn initialisation, drawn once in NumPy (Flax layout).

  Weights Glorot-uniform (pfl applies `xavier_uniform_` to match its TF
  model); biases uniform in +-1/sqrt(fan_in), PyTorch's default.
  """
  rng = np.random.default_rng([seed, 3])

  def layer(shape, fan_in, fan_out):
    bound = np.sqrt(6.0 / (fan_in + fan_out))
    w = rng.uniform(-bound, bound, shape).astype(np.float32)
    b = rng.uniform(-fan_in**-0.5, fan_in**-0.5, shape[-1]).astype(np.float32)
    return {"kernel": w, "bias": b}

  c_in, (c1, c2) = IMAGE[2], CONV
  return {"Conv_0": layer((3, 3, c_in, c1), 9 * c_in, 9 * c1),
          "Conv_1": layer((3, 3, c1, c2), 9 * c1, 9 * c2),
          "Dense_0": layer((FLAT, HIDDEN), FLAT, HIDDEN),
          "Dense_1": layer((HIDDEN, NUM_CLASSES), HIDDEN, NUM_CLASSES)}


# pfl's nn.Sequential indices of the layers with parameters.
_TORCH_NAMES = {"Conv_0": "1", "Conv_1": "3", "Dense_0": "8",
                "Dense_1": "11"}


def to_torch(params: dict) -> dict:
  """Flax-layout params -> NumPy arrays named as pfl's torch state_dict."""
  out = {}
  for name, p in params.items():
    w = np.asarray(p["kernel"])
    if name.startswith("Conv"):
      w = w.transpose(3, 2, 0, 1)
    elif name == "Dense_0":  # Rows (h, w, c) -> columns (c, h, w).
      w = w.reshape(POOLED, POOLED, CONV[1], HIDDEN).transpose(3, 2, 0, 1)
      w = w.reshape(HIDDEN, FLAT)
    else:
      w = w.T
    key = _TORCH_NAMES[name]
    out[f"{key}.weight"] = np.ascontiguousarray(w)
    out[f"{key}.bias"] = np.asarray(p["bias"])
  return out


def from_torch(state: dict) -> dict:
  """The inverse of `to_torch`."""
  out = {}
  for name, key in _TORCH_NAMES.items():
    w = np.asarray(state[f"{key}.weight"])
    if name.startswith("Conv"):
      w = w.transpose(2, 3, 1, 0)
    elif name == "Dense_0":
      w = w.reshape(HIDDEN, CONV[1], POOLED, POOLED).transpose(2, 3, 1, 0)
      w = w.reshape(FLAT, HIDDEN)
    else:
      w = w.T
    out[name] = {"kernel": np.ascontiguousarray(w),
                 "bias": np.asarray(state[f"{key}.bias"])}
  return out


def max_abs_diff(a: dict, b: dict) -> float:
  """Largest |a - b| over all parameters (same layout)."""
  return max(float(np.max(np.abs(np.asarray(a[n][k]) - np.asarray(b[n][k]))))
             for n in a for k in a[n])
