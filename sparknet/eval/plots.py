"""Run curves from TensorBoard logs (logs/RUN_NAME) as PNGs: loss (train and eval), eval loss per mix source,
learning rate, grad norm, tokens/s and MFU against tokens seen, several runs overlaid.

A resumed run writes a new event file into the same folder and logs again the steps after its checkpoint: files are
read in the order they were written and, for a step logged twice, the later value wins, so each run is one curve
with every step once (the steps the final weights actually went through).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparknet.common.errors import UserError

# figure file -> (title, [(tag, line style)]); a tag ending in "/*" stands for every tag under it (one line each: the
# sources' eval losses, eval/loss/<label>, whose labels may themselves hold "/")
FIGURES = {
    "loss": ("loss (nats/token)", [("train/loss", "-"), ("eval/loss", "--")]),
    "loss_per_source": ("eval loss per source (nats/token)", [("eval/loss/*", "-")]),
    "learning_rate": ("learning rate", [("train/learning_rate", "-")]),
    "grad_norm": ("grad norm (pre-clip)", [("train/grad_norm", "-")]),
    "tokens_per_second": ("tokens/s (training time)", [("perf/tokens_per_second", "-")]),
    "mfu": ("MFU (per device)", [("perf/mfu", "-")]),
}
TOKENS_TAG = "perf/tokens_seen"


def read_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of a run folder as (step, value) sorted by step, each step once (the last written)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(log_dir.glob("events.out.tfevents.*"), key=_written_at)
    if not files:
        raise UserError(f"{log_dir} holds no TensorBoard event files: pass logs/RUN_NAME of a run")
    by_tag: dict[str, dict[int, float]] = {}
    for path in files:
        accumulator = EventAccumulator(str(path), size_guidance={"scalars": 0})
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            events = by_tag.setdefault(tag, {})
            for event in sorted(accumulator.Scalars(tag), key=lambda e: e.wall_time):
                events[event.step] = event.value  # a replayed step: the resumed run's value replaces the first
    return {tag: sorted(points.items()) for tag, points in by_tag.items()}


def _written_at(path: Path) -> tuple[float, str]:
    """Event file names carry their creation time: events.out.tfevents.<seconds>.<host>..."""
    try:
        return float(path.name.split(".")[3]), path.name
    except (IndexError, ValueError):
        return path.stat().st_mtime, path.name


def tokens_per_step(scalars: dict[str, list[tuple[int, float]]]) -> float | None:
    """Tokens per optimizer step (constant in a run), from perf/tokens_seen; None when the run did not log it."""
    points = [(step, tokens) for step, tokens in scalars.get(TOKENS_TAG, []) if step > 0]
    if not points:
        return None
    ratios = sorted(tokens / step for step, tokens in points)
    return ratios[len(ratios) // 2]


def short_number(value: float, _position: object = None) -> str:
    """An axis label as people write counts: 500, 2.5k, 100k, 1M, 1.5B (a matplotlib tick formatter)."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def plot_runs(log_dirs: list[Path], out_dir: Path) -> list[Path]:
    """One PNG per figure that any run has data for; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    runs = {log_dir.name: read_scalars(log_dir) for log_dir in log_dirs}
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for figure in FIGURES:
        fig = draw_figure(runs, figure)
        if fig is None:
            continue
        path = out_dir / f"{figure}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def _matching(tag: str, scalars: dict[str, Any]) -> list[str]:
    """The tags of `scalars` that `tag` (of FIGURES) stands for: itself, or for "prefix/*" every tag under it."""
    if tag.endswith("/*"):
        return sorted(name for name in scalars if name.startswith(tag[:-1]))
    return [tag] if tag in scalars else []


def draw_figure(runs: dict[str, dict[str, list[tuple[int, float]]]], figure: str) -> Any:
    """The matplotlib figure `figure` (a key of FIGURES) of the runs' scalars, or None when no run logged it."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    title, tags = FIGURES[figure]
    if not any(_matching(tag, scalars) for scalars in runs.values() for tag, _ in tags):
        return None
    scales = {name: tokens_per_step(scalars) for name, scalars in runs.items()}
    by_tokens = all(scale is not None for scale in scales.values())
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    lines = 0
    for index, (name, scalars) in enumerate(runs.items()):
        for tag, style in tags:
            for matched in _matching(tag, scalars):
                # a run's lines share its colour; each of a wildcard's lines (a source) gets its own
                color = f"C{(lines if tag.endswith('/*') else index) % 10}"
                lines += 1
                steps, values = zip(*scalars[matched], strict=True)
                x = [step * scales[name] for step in steps] if by_tokens else list(steps)
                label = (f"{name} ({matched[len(tag) - 1:]})" if tag.endswith("/*") else
                         f"{name} ({tag.split('/')[0]})" if len(tags) > 1 else name)
                ax.plot(x, values, style, color=color, label=label, marker="o" if len(x) < 20 else None,
                        markersize=3)
    ax.set_xlabel("tokens seen" if by_tokens else "step")
    ax.xaxis.set_major_formatter(FuncFormatter(short_number))
    if figure == "tokens_per_second":
        ax.yaxis.set_major_formatter(FuncFormatter(short_number))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
