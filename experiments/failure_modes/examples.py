"""The three constructed examples of Section 2 and how FC handles them."""

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import optax

from prfl_jax.algorithms.cfl import cfl
from prfl_jax.algorithms.federated_clustering import federated_clustering
from prfl_jax.algorithms.hypcluster import hypcluster
from prfl_jax.algorithms.ifca import ifca
from prfl_jax.algorithms.myopic_clustering import myopic_clustering


def example1_loss(eta: float):
  """Loss of Example 1; the batch `[1]` holds the client index 0, 1 or 2."""
  def loss_fn(x, batch):
    f1 = x ** 2 / (6 * eta)
    f2 = jnp.where(x < 1, 4 * (x - 1) ** 3 + 3 * (x - 1) ** 4 + 1,
                   (x - 1) ** 2 / (2 * eta) + 1)
    f3 = (x - 2) ** 2 / (2 * eta)
    return jnp.stack([f1, f2, f3])[batch[0]]
  return loss_fn


def example2_loss(x, batch):
  """f1 = (x + 0.5)^2, f2 = (x - 0.5)^2; the batch holds the client index."""
  centre = jnp.where(batch == 0, -0.5, 0.5)
  return jnp.mean((x - centre) ** 2)


def example3_loss(x, batch):
  """`0.5 (x - s)^2` averaged over the targets s of the batch.

  Client 1 has s=0 (g1 = x), client 2 s=1/2 (g2 = x - 1/2), client 3 a fresh
  s in {0, 1} every round (g3 = x or x - 1).
  """
  return jnp.mean(0.5 * (x - batch) ** 2)


def example3_batch(key):
  """`[3, 1]` targets of one round of Example 3."""
  s3 = jax.random.bernoulli(key).astype(jnp.float32)
  return jnp.stack([jnp.zeros(()), jnp.full((), 0.5), s3])[:, None]


def run(alg, state, batch_fn, rounds: int, key):
  """`rounds` steps in one `lax.scan`; returns (state, trajectory, metrics).

  The trajectory `[rounds + 1, N]` holds `state.params` before every round
  and after the last.
  """
  def body(state, round_key):
    batch_key, step_key = jax.random.split(round_key)
    new, metrics = alg.step(state, batch_fn(batch_key), step_key)
    return new, (state.params, metrics, getattr(new, "assignment", None))

  state, (traj, metrics, assignments) = lax.scan(
      body, state, jax.random.split(key, rounds))
  traj = jnp.concatenate([traj, state.params[None]])
  return state, traj, metrics, assignments


def example1(cfg) -> dict:
  """Myopic-Clustering vs Federated-Clustering on Example 1."""
  index_batch = lambda key: jnp.arange(3).reshape(3, 1)
  x0 = jnp.full((3,), 1.5)
  key = jax.random.PRNGKey(0)

  alg = myopic_clustering(
      example1_loss(cfg.eta_myopic), optax.sgd(cfg.eta_myopic),
      num_clusters=2, radius=cfg.myopic_radius, num_iters=10)
  state, traj_m, metrics_m, assign_m = jax.jit(
      lambda s, k: run(alg, s, index_batch, cfg.example_rounds, k))(
          alg.init(x0), key)
  fc_radius = 0.5 / cfg.eta_fc
  alg = federated_clustering(
      example1_loss(cfg.eta_fc), optax.sgd(cfg.eta_fc), radius=fc_radius,
      num_iters=10)
  _, traj_f, _, _ = jax.jit(
      lambda s, k: run(alg, s, index_batch, cfg.example_rounds, k))(
          alg.init(x0), key)
  assign_m = np.asarray(assign_m)
  return {
      "myopic": {
          "eta": cfg.eta_myopic, "radius": cfg.myopic_radius,
          "final_x": np.asarray(traj_m[-1]).tolist(),
          "first_partitions": [_partition_label(a) for a in assign_m[:3]],
          "final_partition": _partition_label(assign_m[-1]),
          "final_num_clusters": float(metrics_m["num_clusters"][-1]),
          "single_cluster_from_round": _true_from(
              np.asarray(metrics_m["num_clusters"]) == 1),
          "trajectory": np.asarray(traj_m).tolist(),
      },
      "federated_clustering": {
          "eta": cfg.eta_fc, "radius": fc_radius, "num_iters": 10,
          "final_x": np.asarray(traj_f[-1]).tolist(),
          "trajectory": np.asarray(traj_f).tolist(),
      },
  }


def _true_from(flags: np.ndarray):
  """First 1-based round from which every flag is True, or None."""
  misses = np.flatnonzero(~flags)
  first = int(misses[-1]) + 2 if misses.size else 1
  return first if first <= flags.size else None


def example2(cfg) -> dict:
  """IFCA (Options I, II), HypCluster and Federated-Clustering on Example 2."""
  steps = cfg.example2_local_steps
  index_batch = lambda key: jnp.repeat(jnp.arange(2)[:, None], steps, axis=1)
  init_models = jnp.array([-1.5, 0.0])
  x0 = jnp.zeros((2,))
  key = jax.random.PRNGKey(0)
  algs = {
      "ifca_option1": ifca(example2_loss, optax.sgd(cfg.eta_ifca),
                           num_clusters=2, option=1, init_models=init_models),
      "ifca_option2": ifca(example2_loss, optax.sgd(cfg.eta_ifca),
                           num_clusters=2, option=2, local_steps=steps,
                           init_models=init_models),
      "hypcluster": hypcluster(
          example2_loss, optax.sgd(cfg.eta_ifca), num_clusters=2,
          local_steps=steps, init_models=init_models),
  }
  out = {}
  for name, alg in algs.items():
    state = alg.init(x0)
    state, traj, _, assignments = jax.jit(
        lambda s, k, alg=alg: run(alg, s, index_batch, cfg.example_rounds, k))(
            state, key)
    out[name] = {
        "final_models": np.asarray(state.models).tolist(),
        "final_assignment": np.asarray(assignments[-1]).tolist(),
        "always_cluster_2": bool(np.all(np.asarray(assignments) == 1)),
        "trajectory": np.asarray(traj).tolist(),
    }
  alg = federated_clustering(
      example2_loss, optax.sgd(cfg.eta_ifca), radius=cfg.fc_radius_ex2,
      num_iters=10)
  _, traj, _, _ = jax.jit(
      lambda s, k: run(alg, s, index_batch, cfg.example_rounds, k))(
          alg.init(x0), key)
  out["federated_clustering"] = {
      "eta": cfg.eta_ifca, "radius": cfg.fc_radius_ex2,
      "final_x": np.asarray(traj[-1]).tolist(),
      "trajectory": np.asarray(traj).tolist(),
  }
  return out


def example3(cfg) -> dict:
  """Clustered FL over many seeds (one vmap) and Federated-Clustering."""
  x0 = jnp.zeros((3,))
  alg = cfl(example3_loss, optax.sgd(cfg.eta_cfl), eps1=cfg.cfl_eps1,
                eps2=cfg.cfl_eps2, max_clusters=3, min_split_size=3,
                warmup_rounds=cfg.example3_cfl_warmup)
  fc = federated_clustering(
      example3_loss, optax.sgd(cfg.eta_cfl), radius=cfg.fc_radius_ex3,
      num_iters=10)

  def one_seed(key):
    cfl_key, fc_key = jax.random.split(key)
    state, traj, metrics, _ = run(alg, alg.init(x0), example3_batch,
                                  cfg.example3_rounds, cfl_key)
    _, fc_traj, _, _ = run(fc, fc.init(x0), example3_batch, cfg.example3_rounds,
                           fc_key)
    split_round = jnp.argmax(metrics["split"] > 0) + 1
    return state.clusters, split_round, traj, fc_traj

  keys = jax.random.split(jax.random.PRNGKey(cfg.run.seed + 1),
                          cfg.example3_seeds)
  clusters, split_round, traj, fc_traj = jax.device_get(
      jax.jit(jax.vmap(one_seed))(keys))
  separated = clusters[:, 1] != clusters[:, 2]
  partitions = {}
  for row in clusters:
    label = _partition_label(row)
    partitions[label] = partitions.get(label, 0) + 1
  wrong = int(np.argmax(separated)) if separated.any() else 0
  right = int(np.argmin(separated))
  return {
      "cfl": {
          "eta": cfg.eta_cfl, "eps1": cfg.cfl_eps1, "eps2": cfg.cfl_eps2,
          "warmup_rounds": cfg.example3_cfl_warmup, "seeds": cfg.example3_seeds,
          "rounds": cfg.example3_rounds,
          "separated_2_3_frequency": float(separated.mean()),
          "final_partitions": partitions,
          "first_split_rounds": sorted(set(split_round.tolist())),
          "mean_final_x": traj[:, -1].mean(0).tolist(),
          "trajectory_separated_seed": traj[wrong].tolist(),
          "trajectory_correct_seed": traj[right].tolist(),
      },
      "federated_clustering": {
          "radius": cfg.fc_radius_ex3,
          "mean_final_x": fc_traj[:, -1].mean(0).tolist(),
          "std_final_x": fc_traj[:, -1].std(0).tolist(),
          "trajectory_seed0": fc_traj[0].tolist(),
      },
  }


def _partition_label(clusters) -> str:
  """E.g. `{1,3}|{2}` (1-based clients) for cluster ids `[0, 1, 0]`."""
  groups = {}
  for i, c in enumerate(np.asarray(clusters).tolist()):
    groups.setdefault(c, []).append(str(i + 1))
  parts = sorted(groups.values(), key=lambda g: int(g[0]))
  return "|".join("{" + ",".join(g) + "}" for g in parts)
