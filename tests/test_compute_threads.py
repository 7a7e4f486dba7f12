"""The compute threads of a CPU run fit the cores it may use (issue 52, §1): those its affinity allows that other work
leaves free, shared among the processes on the node, or OMP_NUM_THREADS where set; the scripts say what they chose,
trainers choose again as the load changes, and the change is speed only: the losses of torch's default threads."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparknet.common.runtime import CoreLoad, compute_cores, compute_threads
from tests.helpers import stream_args

CORES = len(os.sched_getaffinity(0))  # the CPUs allowed
USED = compute_cores()  # the cores the rule counts among them (physical ones, at most a quota)
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
ROOT = Path(__file__).resolve().parent.parent

# in a fresh process: the affinity and the environment as the case says, then the rule's choice, torch's threads and
# what a trainer's callback does after a second of the load there
PROBE = """
import json, logging, os, sys, time
case = json.loads(sys.argv[1])
if case["cores"]:
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:case["cores"]])
from sparknet.common.runtime import use_compute_threads
from sparknet.train.callbacks import ComputeThreads
import torch
line = use_compute_threads(case["device"])
chosen = torch.get_num_threads()
torch.set_num_threads(4)
logging.basicConfig(level=logging.INFO)
callback = ComputeThreads(every=0.5)
for _ in range(2):  # a new count is taken when two readings agree
    time.sleep(0.6)
    callback.on_step_end(None, None, None)
print(json.dumps({"line": line, "torch": chosen, "again": torch.get_num_threads()}))
"""


def _probe(cores: int = 0, device: str = "cpu", **env: str) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "LOCAL_WORLD_SIZE")}
    case = json.dumps({"cores": cores, "device": device})
    out = subprocess.run([sys.executable, "-c", PROBE, case], env={**base, **env}, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return {**json.loads(out.stdout), "log": out.stderr}


@pytest.fixture
def busy_cores() -> Iterator[None]:
    """Every allowed core kept busy by another program, as on a machine shared with other work."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(CORES)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def test_the_rule_s_arithmetic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    plural = "s" if USED > 1 else ""
    assert compute_threads() == (USED, f"{USED} core{plural} allowed")  # no reading: every core
    assert compute_threads(0.0) == (USED, f"{USED} core{plural} allowed, 0.0 busy with other work")
    assert compute_threads(USED + 3.0)[0] == 1  # never none
    if USED >= 2:
        assert compute_threads(USED - 1.4)[0] == 1  # 1.4 cores free: one thread
        assert compute_threads(USED - 1.6)[0] == 2  # 1.6 free: two (a core more than half free counts)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun without OMP_NUM_THREADS: the cores shared
    assert compute_threads()[0] == max(1, USED // 2)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert compute_threads(USED + 3.0) == (3, "OMP_NUM_THREADS=3")
    for junk in ("junk", "0"):  # not a count: the rule
        monkeypatch.setenv("OMP_NUM_THREADS", junk)
        assert compute_threads()[0] == max(1, USED // 2)


def _stat(cpus: dict[int, tuple[int, int]]) -> str:
    """/proc/stat's text for CPUs of (busy, idle) jiffies: busy as user time, the rest zero."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    lines += [f"cpu{n} {busy} 0 0 {idle} 0 0 0 0 0 0" for n, (busy, idle) in cpus.items()]
    return "\n".join([*lines, "intr 1 2 3", "ctxt 5"]) + "\n"


def _own(utime: int, stime: int) -> str:
    """/proc/self/stat's text with these utime and stime (fields 14 and 15); the name holds a space and a ')'."""
    fields = ["S", *["0"] * 10, str(utime), str(stime), *["0"] * 30]
    return f"1234 (py thon) x) {' '.join(fields)}\n"


def test_the_load_is_the_allowed_cpus_less_this_process_s_own_time(tmp_path: Path) -> None:
    """Two CPUs over 100 jiffies each: 150 busy, 100 of them this process's own: 50 jiffies of other work, a quarter
    of the two CPUs' time, so half of two cores; a CPU not allowed is not counted, nor one missing from the file."""
    stat, own = tmp_path / "stat", tmp_path / "self"
    stat.write_text(_stat({0: (10, 10), 1: (10, 10), 2: (0, 0)}))
    own.write_text(_own(5, 5))
    load = CoreLoad({0, 1}, stat, own)
    stat.write_text(_stat({0: (10 + 100, 10), 1: (10 + 50, 10 + 50), 2: (500, 0)}))
    own.write_text(_own(5 + 70, 5 + 30))
    assert load.busy_elsewhere(2) == pytest.approx(0.5)
    assert load.busy_elsewhere(2) is None  # no time since: nothing to tell
    missing = CoreLoad({0, 5}, stat, own)  # CPU 5 not in /proc/stat (renumbered by lxcfs): nothing known
    assert missing.last is None and missing.busy_elsewhere(2) is None


def test_one_allowed_core_is_one_thread_and_omp_num_threads_is_used_as_it_is() -> None:
    one = _probe(cores=1)
    assert one["torch"] == 1 and re.fullmatch(r"1 compute thread \(1 core allowed, [\d.]+ busy with other work\)",
                                               one["line"]), one
    given = _probe(cores=1, OMP_NUM_THREADS="3")
    assert given["torch"] == 3 and given["line"] == "3 compute threads (OMP_NUM_THREADS=3)"
    gpu = _probe(cores=1, device="cuda")
    assert gpu["line"] == ""  # on an accelerator: torch's default, and nothing said


@pytest.mark.skipif(USED < 2, reason="one core: one thread whatever the load")
def test_cores_busy_with_other_work_leave_one_thread_and_a_trainer_follows_the_load(busy_cores: None) -> None:
    probe = _probe()
    said = re.fullmatch(rf"1 compute thread \({USED} cores? allowed, ([\d.]+) busy with other work\)", probe["line"])
    assert said and float(said[1]) >= USED / 2 and probe["torch"] == 1, probe
    # the callback, given 4 threads, measures the load again and goes back to one, saying so
    assert probe["again"] == 1 and "compute threads 4 -> 1" in probe["log"], probe["log"]


def _train_losses(run_dir: Path) -> list[float]:
    state = sorted(run_dir.glob("checkpoint-*/trainer_state.json"))[-1]
    return [entry["loss"] for entry in json.loads(state.read_text())["log_history"] if "loss" in entry]


@pytest.mark.slow
def test_a_streamed_run_says_its_threads_and_trains_as_with_torch_s_default(corpus_config: Path, tokenizer_dir: Path,
                                                                             tmp_path: Path) -> None:
    """The streaming trainer (its encoder processes beside it) with SparkNet's threads, with torch's own default
    (OMP_NUM_THREADS set to the cores, as torch takes them) and with one thread: the same losses, to the order of
    the additions, whichever count the rule picks under the load of the moment."""
    base = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    counts = {"rule": None, "default": USED, "one": 1}
    runs = {}
    for name, count in counts.items():
        env = {**base, **OFFLINE, **({"OMP_NUM_THREADS": str(count)} if count else {})}
        args = stream_args(tmp_path / name, corpus_config, tokenizer_dir, target_tokens=12 * 4 * 128, eval_steps=6,
                           save_steps=12)
        proc = subprocess.run([sys.executable, "scripts/train_sparknet.py", *args], env=env, capture_output=True,
                              text=True, timeout=300, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = (proc.stderr, tmp_path / name / "ckpt" / "run")
    assert re.search(rf"device cpu \(fp32\), \d+ compute threads? \({USED} cores? allowed, [\d.]+ busy with other "
                     r"work\)", runs["rule"][0]), runs["rule"][0][-2000:]
    assert f"{USED} compute thread{'s' if USED > 1 else ''} (OMP_NUM_THREADS={USED})" in runs["default"][0]
    assert "1 compute thread (OMP_NUM_THREADS=1)" in runs["one"][0]
    losses = {name: _train_losses(run_dir) for name, (_, run_dir) in runs.items()}
    evals = {name: json.loads((run_dir / "training_metadata.json").read_text())["metrics"]["eval_loss"]
             for name, (_, run_dir) in runs.items()}
    assert len(losses["default"]) >= 5
    for name in ("rule", "one"):  # the threads split the same sums: the order of the additions only
        assert losses[name] == pytest.approx(losses["default"], rel=1e-4), name
        assert evals[name] == pytest.approx(evals["default"], rel=1e-4), name
