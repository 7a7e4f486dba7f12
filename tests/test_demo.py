"""The demo as a user runs it: `make demo` as the README says (its folders, its defaults but one: the README's
shorter run, `DEMO_ARGS="--train_tokens 200000"`), with Ctrl-C in the middle of training (a SIGINT to the terminal's
whole foreground group: make, the demo, the script it runs), then the same command again, which resumes and
finishes. This is the one demo of a `make test-all` (CI runs no other): it replaces the demo's outputs (`make
clean-demo` first), and leaves a finished demo, whose packed dataset bench/recipe.py then reads.

Why the shorter run: every stage of the chain runs as with the defaults (the corpus, the tokenizer, the whole
packed dataset, training, perplexity, the benchmarks, plots, the export, the report's unigram check), and only the
training budget differs, a constant the trainer reads like any other; at 460k tokens the test took about 9 minutes
of CI's 30, the longest single test by far. The default demo's time and scores are measured as the README says
(bench/RESULTS.md), not here."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from sparknet.common.runtime import PROJECT_ROOT
from sparknet.demo.chain import _shown, demo_state
from sparknet.train.folders import incomplete, latest_complete_checkpoint
from tests.helpers import OFFLINE_ENV

SHORTER = "DEMO_ARGS=--train_tokens 200000"  # the README's shorter demo


def _make(target: str) -> subprocess.Popen:
    """`make <target>` in a session of its own, as in a terminal: a signal to the group reaches make and its
    children. The test's interpreter stands in for .venv's (the same install when run by `make test-all`)."""
    command = ["make", "-s", target, "STAMP=", f"PY={sys.executable}", SHORTER]
    # bytes, decoded by hand: text mode would turn a progress bar's carriage returns into newlines unseen
    return subprocess.Popen(command, cwd=PROJECT_ROOT, env={**os.environ, **OFFLINE_ENV}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _noise(out: str) -> list[str]:
    """What a log of the demo (its output sent to a file or a pipe) must not hold: blank lines before training (the
    tokenizer trainer's own bars printed three), carriage-return bars (lm-eval's, one 4 KB line in a log file),
    matplotlib's font-cache line, a bar that ends short of its total (`0% | 3.83M/1.86G` when the sources ran dry).
    The model's samples are text of its own: only the lines of bars and logs are read."""
    found = []
    setup = out.split("train  step")[0]  # the tokenizer and the build (later, the samples may hold blank lines)
    if "\n\n\n" in setup:
        found.append("blank lines: " + setup[max(0, setup.index("\n\n\n") - 200):setup.index("\n\n\n")])
    found += [f"a carriage-return bar: {line[:300]!r}" for line in out.split("\n") if "\r" in line and "%|" in line]
    if "matplotlib.font_manager" in out:
        found.append("matplotlib's log: " + out[out.index("matplotlib.font_manager"):][:200])
    last: dict[str, str] = {}  # each bar's last line, by its description
    for line in out.splitlines():
        if bar := re.match(r"\s*([^:|]+?):\s+\d+%\|", line):
            last[bar[1]] = line
    found += [f"a bar ending short: {line}" for line in last.values() if "100%|" not in line]
    return found


def _read_until(proc: subprocess.Popen, marker: str, lines: list[str], timeout: float = 600) -> None:
    found = threading.Event()

    def read() -> None:
        for raw in proc.stdout:  # type: ignore[union-attr]
            line = raw.decode(errors="replace")
            lines.append(line)
            if marker in line:
                found.set()
        found.set()

    threading.Thread(target=read, daemon=True).start()
    assert found.wait(timeout) and any(marker in line for line in lines), "".join(lines)[-3000:]


@pytest.mark.slow
def test_ctrl_c_in_make_demo_saves_and_the_same_command_resumes() -> None:
    assert _make("clean-demo").wait(timeout=60) == 0
    first = _make("demo")
    lines: list[str] = []
    _read_until(first, "train  step     10/", lines)
    os.killpg(first.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
    first.wait(timeout=120)
    time.sleep(0.5)  # the reader thread takes the last lines
    out = "".join(lines)
    assert first.returncode != 0, out[-3000:]
    assert "saving a checkpoint" in out and "Traceback" not in out, out[-3000:]
    assert "sampling text" in out and not _noise(out), _noise(out)
    assert "demo stopped during 'training'" in out and "run the same command (make demo) to resume" in out
    run_dir = PROJECT_ROOT / "checkpoints" / "demo"
    checkpoint = latest_complete_checkpoint(run_dir)
    assert checkpoint is not None and incomplete(checkpoint) is None, out[-3000:]
    step = int(checkpoint.name.split("-")[1])
    assert 10 <= step < 100  # the stop's own checkpoint: the demo saves every 100 steps

    second = _make("demo")
    out = second.communicate(timeout=1200)[0].decode(errors="replace")
    print(out)  # the demo's report, as `make demo` prints it (CI's log shows it with -s or on failure)
    assert second.returncode == 0, out[-4000:]
    assert f"resuming the interrupted demo (checkpoints/demo/checkpoint-{step} saved)" in out
    assert "is there: reused" in out  # the tokenizer was not trained again
    assert f"resuming from {run_dir / f'checkpoint-{step}'}" in out
    assert "demo finished" in out and (run_dir / "training_metadata.json").is_file()
    assert "benchmarks" in out and not _noise(out), _noise(out)  # training, eval, lm-eval, plots, export
    # the report: the model learned more than token frequencies (the demo fails otherwise), and the export is there
    loss = re.search(r"eval loss: ([\d.]+) at start -> ([\d.]+) at the end", out)
    assert loss and float(loss[2]) < float(loss[1]), out[-4000:]
    assert (PROJECT_ROOT / "exports" / "demo" / "README.md").is_file()
    assert demo_state("demo", "datasets/demo", "exports/demo")[0] == "finished"


def test_demo_state_tells_new_interrupted_and_finished_apart(tmp_path: Path) -> None:
    run = f"test-demo-{uuid.uuid4().hex[:8]}"
    run_dir = PROJECT_ROOT / "checkpoints" / run
    try:
        assert demo_state(run, str(tmp_path / "ds"), str(tmp_path / "export"))[0] == "new"
        (tmp_path / ".ds.building").mkdir()  # a dataset build stopped half way
        state, line = demo_state(run, str(tmp_path / "ds"), str(tmp_path / "export"))
        assert state == "interrupted" and "its dataset build stopped" in line
        (tmp_path / ".ds.building").rmdir()
        run_dir.mkdir(parents=True)
        (run_dir / "run_config.json").write_text("{}")
        assert "no checkpoint yet" in demo_state(run, str(tmp_path / "ds"), str(tmp_path / "export"))[1]
        (run_dir / "training_metadata.json").write_text("{}")  # trained, but stopped before the export
        state, line = demo_state(run, str(tmp_path / "ds"), str(tmp_path / "export"))
        assert state == "interrupted" and "its training finished" in line
        (tmp_path / "export").mkdir()
        (tmp_path / "export" / "README.md").write_text("card")
        assert demo_state(run, str(tmp_path / "ds"), str(tmp_path / "export"))[0] == "finished"
        assert _shown(tmp_path / "export") == str(tmp_path / "export")  # outside the project: shown whole
        assert _shown(run_dir) == f"checkpoints/{run}"
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_to_the_demo_reaches_its_step_once(sig: signal.Signals, tmp_path: Path) -> None:
    """The demo passes SIGTERM and SIGHUP (a closed terminal) on to the running step, which stops as it would on its
    own (the trainers save); the step here counts what it received."""
    from sparknet.demo.chain import run_forwarding_signals

    step, ready, got = tmp_path / "step.py", tmp_path / "ready", tmp_path / "got"
    step.write_text(
        "import signal, sys, time\n"
        "def stop(signum, frame):\n"
        "    open(sys.argv[2], 'a').write(signal.Signals(signum).name + '\\n')\n"
        "    time.sleep(0.5)\n"  # a second delivery would be counted meanwhile
        "    sys.exit(128 + signum)\n"
        f"signal.signal({int(sig)}, stop)\n"
        "open(sys.argv[1], 'w').close()\n"
        "time.sleep(60)\n")

    def send_when_ready() -> None:
        deadline = time.time() + 30
        while not ready.exists() and time.time() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), sig)

    before = signal.getsignal(sig)
    threading.Thread(target=send_when_ready, daemon=True).start()
    code, stopped_by = run_forwarding_signals([sys.executable, str(step), str(ready), str(got)])
    assert (code, stopped_by) == (128 + sig, sig)
    assert got.read_text().split() == [sig.name]
    assert signal.getsignal(sig) == before  # put back
