"""The PyTorch peers of `bench_peers`: pfl-research and Flower's simulation.

Both train pfl-research's `simple_cnn` (benchmarks/model/pytorch/cnn.py) on
the clients `peers_task` makes, with the cohorts `bench_peers` gives them, and
return the final global model in Flax layout and the wall time of every round.
Each round, for each of the cohort's 50 clients: load the global model, run
one epoch of SGD (lr 0.1, batches of 10 in the client's order, a fresh
optimizer), send the model (change) back; the server averages them, every
client weighted equally.

* pfl: `FederatedAveraging` on a `SimulatedBackend` in this process, exactly
  as pfl-research's `image_classification/pytorch/train.py` builds it
  (`PyTorchModel` with `torch.optim.SGD` locally and `SGD(lr=1.0)` centrally
  on the mean model change, `WeightByUser`); the user sampler replays the
  given cohorts.
* Flower: `flwr.simulation.run_simulation` (Ray backend) of a `ServerApp`
  running `flwr.serverapp.strategy.FedAvg` and a `ClientApp` whose `train`
  makes its client's data from the seed and trains the model it is sent.
  FedAvg's `configure_train` is replaced by one that sends round r's message
  for client i to the i-th node (sorted ids) with `client: i` in its config
  (the node's own partition id is ignored), so that both peers and prfl_jax
  train the same clients; `fraction_evaluate=0` (no federated evaluation).

The model has pfl's layers with its two dropout layers replaced by
`nn.Identity` (same indices, so the same state_dict names): prfl_jax's loss
takes no random key, and all three systems train the same deterministic net.
"""

import os
import time

import numpy as np
import torch
from torch import nn
import torch.nn.functional as F

from benchmarks import peers_task


class SimpleCNN(nn.Sequential):
  """pfl-research's simple_cnn (no dropout) with pfl's `loss`/`metrics`."""

  def __init__(self):
    c_in, (c1, c2) = peers_task.IMAGE[2], peers_task.CONV
    super().__init__(
        _NHWCtoNCHW(), nn.Conv2d(c_in, c1, 3), nn.ReLU(), nn.Conv2d(c1, c2, 3),
        nn.ReLU(), nn.MaxPool2d(2), nn.Identity(), nn.Flatten(),
        nn.Linear(peers_task.FLAT, peers_task.HIDDEN), nn.ReLU(),
        nn.Identity(), nn.Linear(peers_task.HIDDEN, peers_task.NUM_CLASSES))

  def loss(self, inputs, targets, eval=False):  # pylint: disable=redefined-builtin
    self.train(not eval)
    return F.cross_entropy(self(inputs), targets.long())

  @torch.no_grad()
  def metrics(self, inputs, targets, eval=True):  # pylint: disable=redefined-builtin
    from pfl.metrics import Weighted  # pylint: disable=g-import-not-at-top
    self.train(not eval)
    logits = self(inputs)
    n = len(inputs)
    return {"loss": Weighted(F.cross_entropy(logits, targets.long(),
                                             reduction="sum").item(), n),
            "accuracy": Weighted((logits.argmax(-1) == targets).sum().item(),
                                 n)}


class _NHWCtoNCHW(nn.Module):

  def forward(self, x):
    return x.permute(0, 3, 1, 2)


def torch_model(params: dict) -> SimpleCNN:
  model = SimpleCNN()
  model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in
                         peers_task.to_torch(params).items()})
  return model


def flax_params(model: nn.Module) -> dict:
  return peers_task.from_torch(
      {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()})


def local_epoch(model: SimpleCNN, x: np.ndarray, y: np.ndarray,
                task: peers_task.Task):
  """One epoch of SGD on one client, batches in order (pfl's `do_sgd`)."""
  opt = torch.optim.SGD(model.parameters(), lr=task.local_lr)
  x, y = torch.from_numpy(x), torch.from_numpy(y)
  for start in range(0, len(x), task.batch):
    loss = model.loss(x[start:start + task.batch], y[start:start + task.batch])
    loss.backward()
    opt.step()
    opt.zero_grad()


_FILES = ("x.npy", "y.npy")


def save_federation(data, data_dir: str):
  """Writes `peers_task.federation`'s arrays for `run_flower`'s actors."""
  for arr, name in zip(data, _FILES):
    np.save(os.path.join(data_dir, name), arr)


def run_pfl(task: peers_task.Task, params: dict, data, cohorts: np.ndarray,
            threads: int):
  """`len(cohorts)` FedAvg rounds in pfl; (final params, round times [R]).

  PyTorch runs with `threads` intra-op threads.
  """
  torch.set_num_threads(threads)
  from pfl.aggregate.simulate import SimulatedBackend  # pylint: disable=g-import-not-at-top
  from pfl.aggregate.weighting import WeightByUser
  from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
  from pfl.callback.base import TrainingProcessCallback
  from pfl.data.federated_dataset import FederatedDataset
  from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
  from pfl.metrics import Metrics
  from pfl.model.pytorch import PyTorchModel

  x, y = data
  users = {i: (torch.from_numpy(x[i]), torch.from_numpy(y[i]))
           for i in range(len(x))}
  schedule = iter(np.asarray(cohorts).reshape(-1).tolist())
  dataset = FederatedDataset.from_slices(users, lambda: next(schedule))
  module = torch_model(params)
  # Central SGD with lr 1.0 on the negated mean change: plain averaging.
  model = PyTorchModel(model=module, local_optimizer_create=torch.optim.SGD,
                       central_optimizer=torch.optim.SGD(
                           module.parameters(), 1.0))
  times = []

  class Stopwatch(TrainingProcessCallback):

    def on_train_begin(self, *, model):
      times.append(time.perf_counter())
      return Metrics()

    def after_central_iteration(self, aggregate_metrics, model, *,
                                central_iteration):
      times.append(time.perf_counter())
      return False, Metrics()

  rounds = len(cohorts)
  FederatedAveraging().run(
      algorithm_params=NNAlgorithmParams(
          central_num_iterations=rounds, evaluation_frequency=rounds + 1,
          train_cohort_size=task.cohort, val_cohort_size=0),
      backend=SimulatedBackend(training_data=dataset, val_data=None,
                               postprocessors=[WeightByUser()]),
      model=model,
      model_train_params=NNTrainHyperParams(
          local_learning_rate=task.local_lr, local_num_epochs=1,
          local_batch_size=task.batch),
      model_eval_params=NNEvalHyperParams(local_batch_size=task.examples),
      callbacks=[Stopwatch()], send_metrics_to_platform=False)
  return flax_params(module), np.diff(times)


def run_flower(task: peers_task.Task, params: dict, cohorts: np.ndarray,
               num_cpus: int, data_dir: str):
  """The same rounds in Flower's simulation engine on Ray.

  Ray gets `num_cpus` CPUs and each ClientApp one, so `num_cpus` clients
  train at once (Ray sets one OpenMP/torch thread per actor). Flower hands
  the actors this process's `sys.path`, so they import `benchmarks`. The
  clients' data is read from `save_federation`'s memory-mapped files in
  `data_dir` (what the other systems hold in memory; no copy per actor).
  """
  os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # No network here.
  from flwr.app import ArrayRecord, ConfigRecord, Context, Message  # pylint: disable=g-import-not-at-top
  from flwr.app import MessageType, MetricRecord, RecordDict
  from flwr.clientapp import ClientApp
  from flwr.serverapp import Grid, ServerApp
  from flwr.serverapp.strategy import FedAvg
  from flwr.simulation import run_simulation

  client_app = ClientApp()

  @client_app.train()
  def train(msg: Message, context: Context) -> Message:
    del context
    model = SimpleCNN()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    client = msg.content["config"]["client"]
    x, y = (np.array(np.load(os.path.join(data_dir, f), mmap_mode="r")[client])
            for f in _FILES)
    local_epoch(model, x, y, task)
    reply = RecordDict({
        "arrays": ArrayRecord.from_torch_state_dict(model.state_dict()),
        "metrics": MetricRecord({"num-examples": len(x)})})
    return Message(content=reply, reply_to=msg)

  class ReplayedCohorts(FedAvg):

    def configure_train(self, server_round, arrays, config, grid):
      nodes = sorted(grid.get_node_ids())
      messages = []
      for client in cohorts[server_round - 1]:
        cfg = ConfigRecord({"client": int(client),
                            "server-round": server_round})
        messages.append(Message(
            content=RecordDict({"arrays": arrays, "config": cfg}),
            message_type=MessageType.TRAIN, dst_node_id=nodes[int(client)]))
      return messages

  out = {"times": []}
  server_app = ServerApp()

  @server_app.main()
  def main(grid: Grid, context: Context) -> None:
    del context

    def stopwatch(server_round, arrays):
      out["times"].append(time.perf_counter())
      out["arrays"] = arrays
      return None

    ReplayedCohorts(fraction_evaluate=0.0).start(
        grid=grid, initial_arrays=ArrayRecord.from_torch_state_dict(
            torch_model(params).state_dict()),
        num_rounds=len(cohorts), evaluate_fn=stopwatch)

  run_simulation(
      server_app=server_app, client_app=client_app,
      num_supernodes=task.num_clients,
      backend_config={
          "init_args": {"num_cpus": num_cpus, "include_dashboard": False},
          "client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
  if len(out["times"]) != len(cohorts) + 1:
    raise RuntimeError(f"Flower's simulation ran {len(out['times']) - 1} of "
                       f"{len(cohorts)} rounds; see its log above.")
  state = {k: v.numpy() for k, v in
           out["arrays"].to_torch_state_dict().items()}
  return peers_task.from_torch(state), np.diff(out["times"])
