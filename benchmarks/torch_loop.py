"""The paper-style per-pair PyTorch loop, the baseline of the benchmarks.

For each model i, for each client j: forward, backward, flatten the
gradients; then Threshold-Clustering (Werner et al., 2023, Algorithm 2) in
torch with one centre started at the owner's gradient, as the paper's code
does. The networks are PyTorch twins of the benchmarks' JAX models holding
the same weights (`benchmarks.zoo`); the centres come back in the JAX
models' `jax.tree` order, so they compare with prfl's directly. Every
function returns None (or `(None, None)`) when torch is not importable.
"""

import jax
import numpy as np

import prfl_jax as prfl
from benchmarks import common
from benchmarks import zoo


def torch_threshold_clustering(torch, z, v, radius, num_iters, on_step=None):
  """Algorithm 2, one centre, written as in the paper's PyTorch code.

  Args:
    torch: the `torch` module.
    z: `[N, P]` the clients' gradients at one model.
    v: `[P]` the start (the owner's gradient).
    radius: a `prfl.QuantileRadius` or a float.
    num_iters: clustering steps.
    on_step: None in the timed loops; else called after each step's ball
      with `(dist [N], tau, inside [N] bool)` (`check_centres_gpu` records
      the balls with it).

  Returns:
    `[P]` the centre.
  """
  n = z.shape[0]
  for _ in range(num_iters):
    dist = torch.linalg.norm(z - v, dim=1)
    if isinstance(radius, prfl.QuantileRadius):
      tau = torch.quantile(dist, float(radius.q))
    else:
      tau = radius
    inside = dist <= tau
    if on_step is not None:
      on_step(dist, tau, inside)
    v = (z[inside].sum(0) + (n - inside.sum()) * v) / n
  return v


def cnn_inputs(torch, batch, device):
  """The clients' images (NHWC -> NCHW) and int64 labels as two lists of
  N tensors on `device`; `batch` is `(x [N, B, H, W, C], y [N, B])`."""
  n = len(batch[0])
  xs = [torch.from_numpy(np.array(batch[0][j])).permute(0, 3, 1, 2)
        .contiguous().to(device) for j in range(n)]
  ys = [torch.from_numpy(np.array(batch[1][j], np.int64)).to(device)
        for j in range(n)]
  return xs, ys


def client_gradients(torch, net, xs, ys):
  """`[N, P]` every client's cross-entropy gradient at `net`, one forward
  and backward per client (the paper's per-pair loop), flattened in torch's
  parameter order."""
  F = torch.nn.functional
  grads = []
  for x, y in zip(xs, ys):
    net.zero_grad()
    F.cross_entropy(net(x), y).backward()
    grads.append(torch.cat([p.grad.reshape(-1) for p in net.parameters()]))
  return torch.stack(grads)


def run_mlp_loop(params, batch, radius, num_iters, repeats, budget_s,
                 threads, device="cpu"):
  """The per-pair loop on the MNIST MLP (library layout params) on `device`.

  Returns:
    `(timing dict, centres [N, P] in `ravel_pytree` order of the library
    layout)`, or `(None, None)` without torch.
  """
  try:
    import torch  # pylint: disable=g-import-not-at-top
    from torch import nn  # pylint: disable=g-import-not-at-top
    from torch.nn import functional as F  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None, None
  default_threads = torch.get_num_threads()
  torch.set_num_threads(threads or default_threads)
  try:
    return _mlp_loop(torch, nn, F, params, batch, radius, num_iters, repeats,
                     budget_s, device)
  finally:
    torch.set_num_threads(default_threads)


def _mlp_loop(torch, nn, F, params, batch, radius, num_iters, repeats,
              budget_s, device):
  n = jax.tree.leaves(params)[0].shape[0]
  to_t = lambda a: torch.from_numpy(np.array(a, np.float32)).to(device)
  models = []
  for i in range(n):
    m = nn.Sequential(nn.Linear(common.IN_DIM, common.HIDDEN), nn.ReLU(),
                      nn.Linear(common.HIDDEN, common.OUT_DIM))
    with torch.no_grad():
      for layer, name in ((m[0], "Dense_0"), (m[2], "Dense_1")):
        layer.weight.copy_(to_t(params[name]["kernel"][i]).T)
        layer.bias.copy_(to_t(params[name]["bias"][i]))
    models.append(m.to(device))
  xs = [to_t(batch[0][j]) for j in range(n)]
  ys = [torch.from_numpy(np.array(batch[1][j], np.int64)).to(device)
        for j in range(n)]
  sync = torch.cuda.synchronize if device.startswith("cuda") else lambda: None

  def round_():
    centers = []
    for i, m in enumerate(models):
      grads = []
      for j in range(n):
        m.zero_grad()
        loss = F.cross_entropy(m(xs[j]), ys[j])
        loss.backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in m.parameters()]))
      with torch.no_grad():
        z = torch.stack(grads)
        centers.append(torch_threshold_clustering(torch, z, z[i].clone(),
                                                  radius, num_iters))
    out = torch.stack(centers)
    sync()
    return out

  res, out = common.time_round(round_, repeats, budget_s)
  # Torch order: W1 [200, 784], b1, W2 [10, 200], b2 -> ravel_pytree order
  # of the flax layout: Dense_0 (bias, kernel), Dense_1 (bias, kernel).
  out = out.cpu().numpy()
  h, d, k = common.HIDDEN, common.IN_DIM, common.OUT_DIM
  w1 = out[:, :h * d].reshape(n, h, d).transpose(0, 2, 1).reshape(n, -1)
  b1 = out[:, h * d:h * d + h]
  w2 = out[:, h * d + h:h * d + h + k * h].reshape(n, k, h).transpose(
      0, 2, 1).reshape(n, -1)
  b2 = out[:, -k:]
  return (dict(res, torch_threads=torch.get_num_threads()),
          np.concatenate([b1, w1, b2, w2], axis=1))


def torch_net(torch, spec: zoo.Spec, params_i):
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


def torch_to_flax_order(torch, net, spec: zoo.Spec, flat) -> np.ndarray:
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


def run_cnn_loop(spec: zoo.Spec, params, batch, radius, num_iters, threads,
                 repeats, budget_s, device="cpu"):
  """The per-pair loop on a `zoo.Spec` CNN, in PyTorch on `device`.

  The round ends by copying the centres to the host, which waits for a
  GPU's queued work, so the timing is the whole round on either device.

  Returns:
    `(timing dict, centres [N, P] in the Flax model's jax.tree order)`, or
    `(None, None)` without torch.
  """
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None, None
  n = jax.tree.leaves(params)[0].shape[0]
  nets = [torch_net(torch, spec, jax.tree.map(lambda a, i=i: a[i], params))
          .to(device) for i in range(n)]
  xs, ys = cnn_inputs(torch, batch, device)

  def round_():
    centers = []
    for i, net in enumerate(nets):
      z = client_gradients(torch, net, xs, ys)
      with torch.no_grad():
        centers.append(torch_threshold_clustering(
            torch, z, z[i].clone(), radius, num_iters))
    return torch.stack(centers).cpu()

  default = torch.get_num_threads()
  torch.set_num_threads(threads or default)
  try:
    res, out = common.time_round(round_, repeats, budget_s)
    res["torch_threads"] = torch.get_num_threads()
  finally:
    torch.set_num_threads(default)
  res["torch_device"] = device
  return res, torch_to_flax_order(torch, nets[0].cpu(), spec, out.numpy())
