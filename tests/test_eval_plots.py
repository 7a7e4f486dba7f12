"""plot_runs: PNGs for each logged quantity against tokens seen; a resumed run (two event files that both log the
steps after the checkpoint) is one curve with each step once, the resumed run's values kept."""

from __future__ import annotations

from pathlib import Path

from sparknet.eval.plots import plot_runs, read_scalars, tokens_per_step
from tests.helpers import run_script

TOKENS_PER_STEP = 512


def _write_events(folder: Path, steps: range, loss_offset: float, created: int) -> None:
    """One event file as the trainer writes it, renamed so that its creation time is `created` (seconds)."""
    from torch.utils.tensorboard import SummaryWriter

    before = set(folder.glob("events.out.tfevents.*")) if folder.exists() else set()
    with SummaryWriter(str(folder)) as writer:
        for step in steps:
            writer.add_scalar("train/loss", 5.0 - step / 100 + loss_offset, step, walltime=created + step)
            writer.add_scalar("train/learning_rate", 1e-3, step, walltime=created + step)
            writer.add_scalar("perf/tokens_seen", step * TOKENS_PER_STEP, step, walltime=created + step)
            if step % 10 == 0:
                writer.add_scalar("eval/loss", 5.5 - step / 100, step, walltime=created + step)
    (new,) = set(folder.glob("events.out.tfevents.*")) - before
    new.rename(folder / f"events.out.tfevents.{created}.host.1.0")


def test_resumed_run_is_one_curve_and_pngs_are_written(tmp_path: Path) -> None:
    resumed = tmp_path / "logs" / "resumed"
    _write_events(resumed, range(1, 31), 0.0, created=1000)  # crashed after step 30, checkpoint at 20
    _write_events(resumed, range(21, 41), 0.5, created=2000)  # resumed from step 20
    scalars = read_scalars(resumed)
    steps = [step for step, _ in scalars["train/loss"]]
    assert steps == list(range(1, 41))  # each step once
    assert dict(scalars["train/loss"])[25] == 5.0 - 0.25 + 0.5  # the resumed run's value, not the replaced one
    assert tokens_per_step(scalars) == TOKENS_PER_STEP
    _write_events(tmp_path / "logs" / "other", range(1, 21), 0.2, created=3000)
    written = plot_runs([resumed, tmp_path / "logs" / "other"], tmp_path / "plots")
    assert sorted(p.name for p in written) == ["learning_rate.png", "loss.png"]  # nothing logged grad norm or MFU
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_script(tmp_path: Path) -> None:
    _write_events(tmp_path / "logs" / "a", range(1, 11), 0.0, created=1000)
    # a first matplotlib run (no font cache yet, as on a fresh machine or in the demo) says nothing of its own
    proc = run_script("plot_runs.py", "--runs", '["a"]', "--logs_dir", tmp_path / "logs", "--eval_dir",
                      tmp_path / "eval", env={"MPLCONFIGDIR": str(tmp_path / "mpl")})
    assert proc.returncode == 0, proc.stderr
    assert "matplotlib" not in proc.stdout + proc.stderr, proc.stderr
    assert (tmp_path / "eval" / "a" / "plots" / "loss.png").is_file()
    proc = run_script("plot_runs.py", "--runs", '["missing"]', "--logs_dir", tmp_path / "logs")
    assert proc.returncode == 1 and "no TensorBoard logs for run 'missing'" in proc.stderr


def test_axes_read_100k_and_1m_not_raw_numbers(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from sparknet.eval.plots import draw_figure, short_number

    assert [short_number(v) for v in (0, 500, 2500, 100_000, 1_000_000, 1.5e9)] == ["0", "500", "2.5k", "100k", "1M",
                                                                                     "1.5B"]
    _write_events(tmp_path / "run", range(1, 4001), 0.0, created=1000)  # 4000 steps x 512 tokens: up to 2M
    fig = draw_figure({"run": read_scalars(tmp_path / "run")}, "loss")
    fig.canvas.draw()
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels() if t.get_text()]
    assert "1M" in labels and any(label.endswith("k") for label in labels), labels
    assert not any(label.replace("−", "").replace(".", "").isdigit() and len(label) > 4 for label in labels)
