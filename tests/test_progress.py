"""What long work shows: progress bars without an ETA from a slow start, and whole lines (no carriage-return
redraws) when the output is a file; a closed pipe ends a script quietly."""

from __future__ import annotations

import io
import subprocess
import sys
import time

from sparknet.common import progress as progress_module
from sparknet.common.progress import progress
from sparknet.common.runtime import PROJECT_ROOT


def test_written_to_a_file_a_bar_is_whole_lines_at_an_interval_and_its_end(monkeypatch) -> None:
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


def test_a_bar_that_goes_past_its_total_ends_full_at_what_was_done() -> None:
    """Work a little past its estimate (a last whole document, a last block): the bar ends at 100% of what was
    done, not without its total and percentage as tqdm draws it ("821k/?")."""
    out = io.StringIO()
    with progress(total=1000, desc="packing", unit="tok", file=out, mininterval=0) as bar:
        bar.update(1003)
    last = out.getvalue().splitlines()[-1]
    assert "100%" in last and "1003/1003" in last, last


def test_no_eta_before_the_first_seconds_and_percent(monkeypatch) -> None:
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


def test_a_library_thread_map_cannot_take_a_bars_lock_away(tmp_path) -> None:
    """datasets resolves a source's files through tqdm's thread_map, which lends its bar class a lock and deletes it
    afterwards when the class had none: a bar of that class made meanwhile (on another thread) then failed at its
    next update with "no attribute '_lock'" (a resumed build stopped on it). Opening a source first gives tqdm's
    base class its lock, which thread_map then finds and puts back. In new interpreters: the race needs a process
    whose bar classes have no lock yet."""
    data = tmp_path / "a.jsonl"
    data.write_text('{"text": "one"}\n')
    race = (
        "import io\n"
        "from tqdm.contrib.concurrent import ensure_lock\n"
        "from datasets.utils.tqdm import tqdm as datasets_bar\n"
        "with ensure_lock(datasets_bar, lock_name='mp_lock'):  # thread_map's lending of the lock\n"
        "    bar = datasets_bar(total=2, file=io.StringIO())  # made meanwhile\n"
        "bar.update(1)\n"
        "bar.close()\n"
        "print('drawn')\n"
    )
    opened = ("from sparknet.config.mix import SourceSpec\n"
              "from sparknet.data.source.opening import open_source\n"
              "import tqdm\n"
              f"open_source(SourceSpec(name='json', prob=1, data_files={str(data)!r}, label='a'))\n"
              "assert '_lock' in vars(tqdm.tqdm), 'opening a source left the base bar class without its lock'\n")
    shared = "from sparknet.common.progress import share_one_tqdm_lock\nshare_one_tqdm_lock()\n"
    for code, said in ((shared + race, "drawn\n"), (opened, "")):
        proc = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0 and proc.stdout == said, proc.stderr[-2000:]
