"""Where a run's progress and curves go: a progress bar and TensorBoard.

`prfl.train` reports progress through its `log=` hook, one line per compiled
chunk: `[round 30/600] eval/accuracy=0.8583 train/loss=0.1681 | 24.9s
elapsed, ~58.2s left`. A `Tracker` adapts that hook (the library holds no
configuration objects): with `progress="bar"` the lines drive a tqdm bar per
run (round, the evaluation metrics, time left); with "lines" they are printed
as they come; with "off" only the experiment's own summary lines remain.
When a run ends, its exact history (every round's step metrics, every
evaluation, per cluster too) goes to TensorBoard event files through
tensorboardX (pure Python, no TensorFlow): `<out>/tensorboard/<run tag>/`.

  with tracking.Tracker(out, progress="bar", tensorboard=True) as tracker:
    result = prfl.train(..., log=tracker.train_log("rotation/fc", rounds))
    tracker.history("rotation/fc", result.history)
    tracker.log("[1/22] rotation FC: accuracy 96.4%")
"""

import os
import re
import sys
from typing import Callable, Optional

import numpy as np

_LINE = re.compile(r"^\[round (\d+)/(\d+)\] (.*?) \| .*$")
_SHOWN = ("eval/accuracy", "eval/loss", "eval/error", "train/loss")


def parse_train_line(line: str) -> Optional[tuple]:
  """`(round, total, {metric: float})` of a `prfl.train` progress line, or
  None for another line."""
  match = _LINE.match(line)
  if not match:
    return None
  metrics = {}
  for part in match.group(3).split():
    name, _, value = part.partition("=")
    try:
      metrics[name] = float(value)
    except ValueError:
      continue
  return int(match.group(1)), int(match.group(2)), metrics


def check(progress: str, tensorboard: bool):
  """Raises ValueError if a requested display needs a missing package."""
  if tensorboard and not _installed("tensorboardX"):
    raise ValueError("--tensorboard needs tensorboardX (pip install -e "
                     "'.[plot]'); or pass --no-tensorboard.")
  if progress == "bar" and not _installed("tqdm"):
    raise ValueError("--progress bar needs tqdm (pip install -e '.[plot]'); "
                     "or pass --progress lines.")


def _installed(module: str) -> bool:
  import importlib.util  # pylint: disable=import-outside-toplevel
  return importlib.util.find_spec(module) is not None


class Tracker:
  """Progress display and TensorBoard writer of one experiment."""

  def __init__(self, out: str, *, progress: str = "lines",
               tensorboard: bool = False, stream=None):
    if progress == "auto":
      stream_ = stream or sys.stderr
      tty = getattr(stream_, "isatty", lambda: False)()
      progress = "bar" if tty and _installed("tqdm") else "lines"
    self.out, self.progress, self.tensorboard = out, progress, tensorboard
    self.stream = stream or sys.stdout
    self._bar = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self._close_bar()

  def log(self, text: str):
    """An experiment's own line (printed above a running bar)."""
    if self._bar is not None:
      self._bar.write(text, file=self.stream)
    else:
      print(text, file=self.stream, flush=True)

  def train_log(self, tag: str, rounds: int) -> Callable[[str], None]:
    """The `log=` hook of `prfl.train` for run `tag` of `rounds` rounds."""
    if self.progress == "off":
      return lambda line: None
    if self.progress == "lines":
      return lambda line: self.log(f"  {tag}: {line}")
    self._close_bar()
    from tqdm import auto as tqdm  # pylint: disable=import-outside-toplevel
    self._bar = tqdm.tqdm(total=rounds, desc=tag, unit="round",
                          dynamic_ncols=True, leave=False, file=sys.stderr)
    bar = self._bar

    def hook(line: str):
      parsed = parse_train_line(line)
      if parsed is None:
        self.log(line)
        return
      done, _, metrics = parsed
      bar.set_postfix({k.split("/", 1)[1]: f"{v:.4g}" for k, v in
                       metrics.items() if k in _SHOWN}, refresh=False)
      bar.update(max(0, done - bar.n))
    return hook

  def _close_bar(self):
    if self._bar is not None:
      self._bar.close()
      self._bar = None

  def history(self, tag: str, history: dict):
    """Writes a `prfl.train` history to `<out>/tensorboard/<tag>/`.

    Step metrics (`train/...`, `[T]`) at their rounds; evaluations
    (`eval/...`) at `eval_round`, per-cluster ones as
    `eval/<name>/cluster_<k>`. Non-finite values are skipped.
    """
    self._close_bar()
    if not self.tensorboard:
      return
    import tensorboardX  # pylint: disable=import-outside-toplevel
    writer = tensorboardX.SummaryWriter(
        logdir=os.path.join(self.out, "tensorboard", tag))
    try:
      for name, steps, values in scalar_series(history):
        for step, value in zip(steps, values):
          if np.isfinite(value):
            writer.add_scalar(name, float(value), int(step))
    finally:
      writer.close()


def scalar_series(history: dict) -> list:
  """`(name, steps, values)` of every scalar curve of a `prfl.train` history."""
  series = []
  for name, values in history.items():
    values = np.asarray(values)
    if name.startswith("train/") and values.ndim == 1:
      series.append((name, history["round"], values))
    elif name.startswith("eval/") and values.ndim == 1:
      series.append((name, history["eval_round"], values))
    elif name.startswith("eval/") and values.ndim == 2:
      for k in range(values.shape[1]):
        series.append((f"{name}/cluster_{k}", history["eval_round"],
                       values[:, k]))
  return series
