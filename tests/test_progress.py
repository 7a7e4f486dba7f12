"""What long work shows: progress bars without an ETA from a slow start, and whole lines (no carriage-return
redraws) when the output is a file; a closed pipe ends a script quietly."""

from __future__ import annotations

import io
import subprocess
import sys
import time

from sparknet import progress as progress_module
from sparknet.progress import progress
from sparknet.runtime import PROJECT_ROOT


def test_written_to_a_file_a_bar_is_whole_lines_at_an_interval_and_its_end(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(progress_module, "PLAIN_INTERVAL", 0.2)
    out = io.StringIO()
    with progress(total=1000, desc="packing", unit="tok", file=out, mininterval=0) as bar:
        for _ in range(10):
            bar.update(100)
            time.sleep(0.05)
    text = out.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and text.endswith("\n")
    assert 2 <= len(lines) <= 6, lines  # about one per 0.2 s of 0.5 s, and the last
    assert lines[0].startswith("packing:") and "1000/1000" in lines[-1] and "<00:00" in lines[-1]


def test_no_eta_before_the_first_seconds_and_percent(monkeypatch) -> None:  # noqa: ANN001
    out = io.StringIO()
    bar = progress(total=10_000, desc="packing", file=out, mininterval=0)
    bar.update(1)  # a slow start: one unit in the first moment would extrapolate to hours
    assert "<?" in str(bar)
    monkeypatch.setattr(progress_module, "WARM_SECONDS", 0.0)
    bar.update(999)  # 10% done: now there is a rate to go by
    assert "<?" not in str(bar)
    bar.close()


def test_help_into_a_closed_pipe_is_no_traceback() -> None:
    proc = subprocess.Popen([sys.executable, "scripts/train_sparknet.py", "--help"], cwd=PROJECT_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # `| head` that has read what it wanted
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
