"""The failure-mode examples' figures and summary."""

import os

import numpy as np

from experiments import files


def plot(results: dict, out: str):
  """Writes one PNG of trajectories per example."""
  plt = files.pyplot()

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
  files.save_figure(fig, os.path.join(out, "example1.png"))
  plt.close(fig)

  e2 = results["example2"]
  fig, axes = plt.subplots(1, 4, figsize=(15, 3.5))
  for ax, name in zip(axes, ["ifca_option1", "ifca_option2", "hypcluster"]):
    panel(ax, e2[name]["trajectory"], f"{name}: selected model x",
          clients[:2])
  panel(axes[3], e2["federated_clustering"]["trajectory"],
        "Federated-Clustering", clients[:2])
  fig.tight_layout()
  files.save_figure(fig, os.path.join(out, "example2.png"))
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
  files.save_figure(fig, os.path.join(out, "example3.png"))
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
