"""The paper's failure-mode examples (Werner et al., 2023, Section 2, Fig. 1).

Runs the three constructed examples of Section 2 and how Federated-Clustering
handles them (Section 3.1.3):

* Example 1 (N=3, K=2, f1, f2, f3 with the learning rate eta in the losses,
  every model starts at x=1.5): Myopic-Clustering clusters {1,2},{3} at the
  first step, then {1},{2,3}; client 2 stays at the saddle point x=1 and, once
  every gradient is within the clustering radius, all clients share one
  cluster. Federated-Clustering reaches the optima (0, 0, 2).
* Example 2 (f1=(x+0.5)^2, f2=(x-0.5)^2, cluster models at -1.5 and 0): IFCA
  (Options I and II) and HypCluster put both clients in cluster 2 at x=0 for
  ever; Federated-Clustering reaches (-0.5, 0.5).
* Example 3 (gradients g1=x, g2=x-1/2, g3=x or x-1 with probability 1/2 each):
  Clustered FL separates clients 2 and 3 with probability about 1/2 and never
  re-merges them (measured over many seeds with one vmap); Federated-
  Clustering re-checks all clients every round.

Every client's data is its own index (Examples 1 and 2) or its random target
(Example 3), so `loss_fn(params, batch)` is an ordinary one-client loss.

Usage: python -m experiments.failure_modes [--out results/failure_modes]
       python -m experiments.failure_modes --smoke      # seconds

Writes `config.json` (first), `failure_modes.json` and `example{1,2,3}.png`.
"""

import argparse
import dataclasses
import os

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import optax

from experiments import cli
from experiments import common
from prfl_jax.algorithms.cfl import cfl
from prfl_jax.algorithms.federated_clustering import federated_clustering
from prfl_jax.algorithms.hypcluster import hypcluster
from prfl_jax.algorithms.ifca import ifca
from prfl_jax.algorithms.myopic_clustering import myopic_clustering


@dataclasses.dataclass
class Config:
  """Settings of the three examples."""
  out: str = "results/failure_modes"
  rounds: int = 200  # Rounds of Examples 1 and 2.
  eta_myopic: float = 0.5  # As in the paper's Fig. 1a.
  eta_fc: float = 0.1  # Federated-Clustering on Example 1, radius 0.5 / eta.
  myopic_radius: float = 0.01  # Threshold-Clustering radius (gradient units).
  eta_ifca: float = 0.1
  local_steps: int = 5  # IFCA Option II and HypCluster.
  fc_radius_ex2: float = 0.5
  seeds: int = 200  # Example 3: independent runs, one vmap.
  rounds_cfl: int = 100
  eta_cfl: float = 0.1
  cfl_eps1: float = 0.04
  cfl_eps2: float = 0.01
  cfl_warmup: int = 20
  fc_radius_ex3: float = 0.25
  plots: bool = True
  seed: int = 0  # Example 3's runs draw from PRNGKey(seed + 1).


# The command-line type of every option (`experiments/cli.py`).
_POSITIVE = cli.real(0, low_open=True)
OPTION_TYPES = {
    "rounds": cli.positive_int, "eta_myopic": _POSITIVE, "eta_fc": _POSITIVE,
    "myopic_radius": cli.real(0), "eta_ifca": _POSITIVE,
    "local_steps": cli.positive_int, "fc_radius_ex2": cli.real(0),
    "seeds": cli.positive_int, "rounds_cfl": cli.positive_int,
    "eta_cfl": _POSITIVE, "cfl_eps1": _POSITIVE, "cfl_eps2": _POSITIVE,
    "cfl_warmup": cli.integer(minimum=0), "fc_radius_ex3": cli.real(0),
}
SMOKE = {"rounds": "20", "seeds": "8", "rounds_cfl": "30"}


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


def example1(cfg: Config) -> dict:
  """Myopic-Clustering vs Federated-Clustering on Example 1."""
  index_batch = lambda key: jnp.arange(3).reshape(3, 1)
  x0 = jnp.full((3,), 1.5)
  key = jax.random.PRNGKey(0)

  alg = myopic_clustering(
      example1_loss(cfg.eta_myopic), optax.sgd(cfg.eta_myopic),
      num_clusters=2, radius=cfg.myopic_radius, num_iters=10)
  state, traj_m, metrics_m, assign_m = jax.jit(
      lambda s, k: run(alg, s, index_batch, cfg.rounds, k))(alg.init(x0), key)
  fc_radius = 0.5 / cfg.eta_fc
  alg = federated_clustering(
      example1_loss(cfg.eta_fc), optax.sgd(cfg.eta_fc), radius=fc_radius,
      num_iters=10)
  _, traj_f, _, _ = jax.jit(
      lambda s, k: run(alg, s, index_batch, cfg.rounds, k))(alg.init(x0), key)
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


def example2(cfg: Config) -> dict:
  """IFCA (Options I, II), HypCluster and Federated-Clustering on Example 2."""
  steps = cfg.local_steps
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
        lambda s, k, alg=alg: run(alg, s, index_batch, cfg.rounds, k))(
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
      lambda s, k: run(alg, s, index_batch, cfg.rounds, k))(alg.init(x0), key)
  out["federated_clustering"] = {
      "eta": cfg.eta_ifca, "radius": cfg.fc_radius_ex2,
      "final_x": np.asarray(traj[-1]).tolist(),
      "trajectory": np.asarray(traj).tolist(),
  }
  return out


def example3(cfg: Config) -> dict:
  """Clustered FL over many seeds (one vmap) and Federated-Clustering."""
  x0 = jnp.zeros((3,))
  alg = cfl(example3_loss, optax.sgd(cfg.eta_cfl), eps1=cfg.cfl_eps1,
                eps2=cfg.cfl_eps2, max_clusters=3, min_split_size=3,
                warmup_rounds=cfg.cfl_warmup)
  fc = federated_clustering(
      example3_loss, optax.sgd(cfg.eta_cfl), radius=cfg.fc_radius_ex3,
      num_iters=10)

  def one_seed(key):
    cfl_key, fc_key = jax.random.split(key)
    state, traj, metrics, _ = run(alg, alg.init(x0), example3_batch,
                                  cfg.rounds_cfl, cfl_key)
    _, fc_traj, _, _ = run(fc, fc.init(x0), example3_batch, cfg.rounds_cfl,
                           fc_key)
    split_round = jnp.argmax(metrics["split"] > 0) + 1
    return state.clusters, split_round, traj, fc_traj

  keys = jax.random.split(jax.random.PRNGKey(cfg.seed + 1), cfg.seeds)
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
          "warmup_rounds": cfg.cfl_warmup, "seeds": cfg.seeds,
          "rounds": cfg.rounds_cfl,
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


def plot(results: dict, out: str):
  """Writes one PNG of trajectories per example."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  def panel(ax, traj, title, labels):
    traj = np.asarray(traj)
    for i in range(traj.shape[1]):
      ax.plot(traj[:, i], label=labels[i])
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("round")
    ax.legend(fontsize=7)

  clients = ["client 1", "client 2", "client 3"]
  e1 = results["example1"]
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
  panel(axes[0], e1["myopic"]["trajectory"],
        f"Myopic-Clustering (eta={e1['myopic']['eta']})", clients)
  panel(axes[1], e1["federated_clustering"]["trajectory"],
        f"Federated-Clustering (eta={e1['federated_clustering']['eta']})",
        clients)
  axes[0].set_ylabel("x")
  fig.tight_layout()
  common.save_figure(fig, os.path.join(out, "example1.png"))
  plt.close(fig)

  e2 = results["example2"]
  fig, axes = plt.subplots(1, 4, figsize=(15, 3.5))
  for ax, name in zip(axes, ["ifca_option1", "ifca_option2", "hypcluster"]):
    panel(ax, e2[name]["trajectory"], f"{name}: selected model x",
          clients[:2])
  panel(axes[3], e2["federated_clustering"]["trajectory"],
        "Federated-Clustering", clients[:2])
  fig.tight_layout()
  common.save_figure(fig, os.path.join(out, "example2.png"))
  plt.close(fig)

  e3 = results["example3"]
  fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
  panel(axes[0], e3["cfl"]["trajectory_separated_seed"],
        "Clustered FL, a seed separating 2 and 3", clients)
  panel(axes[1], e3["cfl"]["trajectory_correct_seed"],
        "Clustered FL, a seed splitting {1}|{2,3}", clients)
  panel(axes[2], e3["federated_clustering"]["trajectory_seed0"],
        "Federated-Clustering", clients)
  fig.tight_layout()
  common.save_figure(fig, os.path.join(out, "example3.png"))
  plt.close(fig)


def summary(results: dict) -> str:
  """Human-readable outcome of the three examples."""
  e1, e2, e3 = results["example1"], results["example2"], results["example3"]
  fmt = lambda xs: "(" + ", ".join(f"{x:.3f}" for x in xs) + ")"
  m, f = e1["myopic"], e1["federated_clustering"]
  lines = [
      "Example 1 (Section 2, Fig. 1a), start x = 1.5:",
      f"  Myopic-Clustering, eta={m['eta']}, radius={m['radius']}: "
      f"clusters of rounds 1-3 {', '.join(m['first_partitions'])}; final x "
      f"{fmt(m['final_x'])}; one single cluster from round "
      f"{m['single_cluster_from_round']} on, final clusters "
      f"{m['final_partition']}.",
      f"  Federated-Clustering, eta={f['eta']}, radius={f['radius']:g} "
      f"(= 0.5/eta), {f['num_iters']} clustering iterations: final x "
      f"{fmt(f['final_x'])}.",
      "Example 2 (Fig. 1b), cluster models at (-1.5, 0):",
  ]
  for name in ("ifca_option1", "ifca_option2", "hypcluster"):
    r = e2[name]
    lines.append(
        f"  {name}: final cluster models {fmt(r['final_models'])}, "
        f"assignment {r['final_assignment']} (0-based), both clients in "
        f"cluster 2 every round: {r['always_cluster_2']}.")
  r = e2["federated_clustering"]
  lines.append(f"  Federated-Clustering, eta={r['eta']}, radius={r['radius']}: "
               f"final x {fmt(r['final_x'])}.")
  c, r = e3["cfl"], e3["federated_clustering"]
  lines += [
      "Example 3 (Fig. 1c), g1 = x, g2 = x - 1/2, g3 = x or x - 1:",
      f"  Clustered FL over {c['seeds']} seeds, {c['rounds']} rounds "
      f"(eta={c['eta']}, eps1={c['eps1']}, eps2={c['eps2']}, warm-up "
      f"{c['warmup_rounds']}): clients 2 and 3 separated in "
      f"{100 * c['separated_2_3_frequency']:.1f}% of the runs; final "
      f"partitions {c['final_partitions']}; first split at round(s) "
      f"{c['first_split_rounds']}.",
      f"  Federated-Clustering, radius={r['radius']}: mean final x over "
      f"seeds {fmt(r['mean_final_x'])} (std {fmt(r['std_final_x'])}).",
  ]
  return "\n".join(lines)


def validate(cfg: Config):
  """Rules that tie options together (each option is checked by its type)."""
  if cfg.cfl_warmup >= cfg.rounds_cfl:
    raise ValueError(
        f"`--cfl-warmup` ({cfg.cfl_warmup}) must be < `--rounds-cfl` "
        f"({cfg.rounds_cfl}): Clustered FL never splits during warm-up.")


def build_parser() -> argparse.ArgumentParser:
  """One option per `Config` field, each with its type from OPTION_TYPES."""
  p = cli.parser(__doc__, out=Config.out, smoke=SMOKE)
  for field in dataclasses.fields(Config):
    if field.name in ("out", "seed"):  # cli.parser has them.
      continue
    flag = "--" + field.name.replace("_", "-")
    if field.name == "plots":
      p.add_argument(flag, action=argparse.BooleanOptionalAction,
                     default=field.default)
    else:
      p.add_argument(flag, type=OPTION_TYPES[field.name],
                     default=field.default)
  return p


def parse(argv) -> tuple:
  """`(Config, argparse.Namespace)`; exits with a usage error on bad input."""
  names = {f.name for f in dataclasses.fields(Config)}
  to_config = lambda a: Config(**{k: v for k, v in vars(a).items()
                                  if k in names})
  args = cli.parse(build_parser(), argv,
                   check=lambda a: validate(to_config(a)))
  return to_config(args), args


def main(argv=None) -> dict:
  cfg, args = parse(argv)
  cli.write_config(cfg.out, cfg, extra={"smoke": args.smoke})
  results = {"config": dataclasses.asdict(cfg), "example1": example1(cfg),
             "example2": example2(cfg), "example3": example3(cfg)}
  common.write_json(os.path.join(cfg.out, "failure_modes.json"), results)
  if cfg.plots:
    plot(results, cfg.out)
  print(summary(results))
  print(f"Wrote {cfg.out}/failure_modes.json"
        + (" and example{1,2,3}.png" if cfg.plots else ""))
  return results


if __name__ == "__main__":
  main()
