"""experiments/tracking.py: progress from prfl.train's log hook, TensorBoard.

Mutations seen to fail these tests: `parse_train_line` dropping the last
metric, `history` writing evaluations at `round` instead of `eval_round`.
"""

import io
import struct

import numpy as np
import pytest

from experiments import tracking

LINE = ("[round 30/600] eval/accuracy=0.8583 eval/lambda=0.5 eval/loss=0.3218 "
        "train/grad_norm=0.636 train/loss=0.1681 | 24.9s elapsed, ~58.2s "
        "left")


def test_parse_train_line():
  done, total, metrics = tracking.parse_train_line(LINE)
  assert (done, total) == (30, 600)
  assert metrics == {"eval/accuracy": 0.8583, "eval/lambda": 0.5,
                     "eval/loss": 0.3218, "train/grad_norm": 0.636,
                     "train/loss": 0.1681}
  assert tracking.parse_train_line("Data: digits") is None


def test_lines_and_off_modes():
  stream = io.StringIO()
  tracker = tracking.Tracker("unused", progress="lines", stream=stream)
  tracker.train_log("rotation/fc", 600)(LINE)
  tracker.log("[1/2] done")
  assert stream.getvalue() == f"  rotation/fc: {LINE}\n[1/2] done\n"
  stream = io.StringIO()
  tracker = tracking.Tracker("unused", progress="off", stream=stream)
  tracker.train_log("rotation/fc", 600)(LINE)
  assert stream.getvalue() == ""


def test_bar_mode_follows_the_rounds(capsys):
  pytest.importorskip("tqdm")
  stream = io.StringIO()
  with tracking.Tracker("unused", progress="bar", stream=stream) as tracker:
    hook = tracker.train_log("rotation/fc", 600)
    hook(LINE)
    assert tracker._bar.n == 30  # pylint: disable=protected-access
    hook(LINE.replace("30/600", "60/600"))
    assert tracker._bar.n == 60  # pylint: disable=protected-access
    tracker.log("[1/2] done")
  assert "[1/2] done" in stream.getvalue()
  assert "rotation/fc" in capsys.readouterr().err  # The bar, on stderr.


def _scalars(directory) -> dict:
  """tag -> [(step, value)] of the event files in `directory` (TFRecords of
  `Event` protos: length, its CRC, the bytes, their CRC)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
  out = {}
  for path in sorted(directory.glob("events.*")):
    raw = path.read_bytes()
    at = 0
    while at < len(raw):
      (length,) = struct.unpack("<Q", raw[at:at + 8])
      event = event_pb2.Event.FromString(raw[at + 12:at + 12 + length])
      at += 12 + length + 4
      for v in event.summary.value:
        out.setdefault(v.tag, []).append((event.step,
                                          round(v.simple_value, 6)))
  return out


def test_history_to_tensorboard_events(tmp_path):
  pytest.importorskip("tensorboardX")
  history = {"round": np.arange(1, 5), "train/loss": np.array([4., 3, 2, 1]),
             "eval_round": np.array([0, 2, 4]),
             "eval/accuracy": np.array([0.1, 0.5, np.nan]),
             "eval/accuracy/per_cluster": np.array([[0.1, 0.2], [0.5, 0.6],
                                                    [0.7, 0.8]])}
  tracker = tracking.Tracker(str(tmp_path), progress="off", tensorboard=True)
  tracker.history("rotation/fc", history)
  scalars = _scalars(tmp_path / "tensorboard" / "rotation" / "fc")
  read = scalars.get
  assert read("train/loss") == [(1, 4.0), (2, 3.0), (3, 2.0), (4, 1.0)]
  assert read("eval/accuracy") == [(0, 0.1), (2, 0.5)]  # NaN skipped.
  assert read("eval/accuracy/per_cluster/cluster_1") == [
      (0, 0.2), (2, 0.6), (4, 0.8)]


def test_missing_packages_are_option_errors(monkeypatch):
  monkeypatch.setattr(tracking, "_installed", lambda module: False)
  with pytest.raises(ValueError, match="--no-tensorboard"):
    tracking.check("lines", True)
  with pytest.raises(ValueError, match="--progress lines"):
    tracking.check("bar", False)
  tracking.check("lines", False)
