"""Every output location of every script is checked before any work: a folder that is a file, a path through a
file, a folder that cannot be written and a name the file system refuses (or whose lock file's name it refuses) are
one line naming the constant and the path, exit status 1, and nothing written; results of an evaluation land inside
EVAL_DIR however the model's path is spelled."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparknet.common.errors import UserError
from tests.helpers import build_args, run_script, stream_args, train_args, write_jsonl


@dataclass(frozen=True)
class Inputs:
    """Small real inputs that every script accepts, so that only the output location under test is wrong."""

    tmp: Path
    config: Path
    corpus: Path
    tokenizer: Path
    dataset: Path
    model: Path
    logs: Path


@pytest.fixture
def inputs(tmp_path: Path, corpus_config: Path, corpus_dir: Path, tokenizer_dir: Path, tiny_dataset: Path,
           random_model: Path) -> Inputs:
    from torch.utils.tensorboard import SummaryWriter

    logs = tmp_path / "tb" / "run"
    with SummaryWriter(str(logs)) as writer:  # a run's TensorBoard log, as plot_runs reads it
        for step in range(1, 4):
            writer.add_scalar("train/loss", 5.0 / step, step)
            writer.add_scalar("train/tokens_seen", step * 512, step)
    return Inputs(tmp_path, corpus_config, corpus_dir, tokenizer_dir, tiny_dataset, random_model, logs)


@dataclass(frozen=True)
class Case:
    """A script with `flag` pointing at the location under test (`constant` is what the message must name)."""

    script: str
    flag: str
    constant: str
    args: Callable[[Inputs], list[object]]  # the script's other arguments, all good

    def argv(self, inputs: Inputs, where: Path) -> list[object]:
        return [*self.args(inputs), f"--{self.flag}", where]

    def __str__(self) -> str:
        return f"{self.script}:{self.flag}"


def _model(inputs: Inputs) -> str:
    return json.dumps([str(inputs.model)])


CASES = [
    Case("train_tokenizer_v5.py", "output_dir", "OUTPUT_DIR", lambda i: [
        "--config", i.config, "--vocab_size", 1024, "--max_bytes", 300_000, "--heldout_docs", 10]),
    Case("build_dataset_v5.py", "output_dir", "OUTPUT_DIR",
         lambda i: build_args(i.config, i.tmp / "ds", i.tokenizer, "--val_tokens", 4_000)),
    Case("train_sparknet_v5.py", "checkpoints_dir", "CHECKPOINTS_DIR", lambda i: train_args(i.tmp, i.dataset)),
    Case("train_sparknet_v5.py", "logs_dir", "LOGS_DIR", lambda i: train_args(i.tmp, i.dataset)),
    Case("train_sparknet.py", "checkpoints_dir", "CHECKPOINTS_DIR",
         lambda i: stream_args(i.tmp, i.config, i.tokenizer, num_workers=0)),
    Case("eval_perplexity.py", "eval_dir", "EVAL_DIR", lambda i: [
        "--models", _model(i), "--data", i.corpus / "prose.val.jsonl", "--max_documents", 2, "--context", 16]),
    Case("eval_generation.py", "eval_dir", "EVAL_DIR", lambda i: [
        "--models", _model(i), "--max_new_tokens", 2, "--num_samples", 1]),
    Case("eval_benchmarks.py", "eval_dir", "EVAL_DIR", lambda i: [
        "--models", _model(i), "--suite_data", i.corpus / "prose.val.jsonl", "--suite_items", 4,
        "--suite_dir", i.tmp / "suite"]),
    Case("eval_benchmarks.py", "suite_dir", "SUITE_DIR", lambda i: [
        "--models", _model(i), "--suite_data", i.corpus / "prose.val.jsonl", "--suite_items", 4,
        "--eval_dir", i.tmp / "eval"]),
    Case("export_model.py", "output_dir", "OUTPUT_DIR", lambda i: ["--model", i.model]),
    Case("plot_runs.py", "eval_dir", "EVAL_DIR", lambda i: ["--runs", json.dumps([str(i.logs)])]),
    Case("prepare_demo_corpus.py", "output_dir", "OUTPUT_DIR", lambda i: ["--max_code_mb", 0.1]),
]


def _refused(proc: subprocess.CompletedProcess, *named: object) -> str:
    """The script stopped with exit status 1 and one line naming each of `named`, before any work (a log line or a
    progress bar would be a second line)."""
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    for part in named:
        assert str(part) in lines[0], (part, lines[0])
    return lines[0]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_an_output_location_through_a_file_is_one_line_before_any_work(case: Case, inputs: Inputs) -> None:
    blocker = inputs.tmp / "a-file"
    blocker.write_text("the user's own file")
    where = blocker / "out"
    line = _refused(run_script(case.script, *case.argv(inputs, where), timeout=120), case.constant, where, blocker)
    assert "is a file, not a folder" in line
    assert blocker.read_text() == "the user's own file"


@pytest.mark.parametrize("case", [c for c in CASES if c.script in (
    "train_tokenizer_v5.py", "export_model.py", "eval_perplexity.py", "train_sparknet_v5.py")], ids=str)
def test_an_output_folder_that_is_a_file_is_one_line_before_any_work(case: Case, inputs: Inputs) -> None:
    blocker = inputs.tmp / "a-file"
    blocker.write_text("the user's own file")
    line = _refused(run_script(case.script, *case.argv(inputs, blocker), timeout=120), case.constant, blocker)
    assert "is a file, not a folder" in line
    assert blocker.read_text() == "the user's own file"


PR_CAPBSET_DROP, CAP_DAC_OVERRIDE = 24, 1  # <linux/prctl.h>, <linux/capability.h>


def _without_root_override() -> None:
    """Run in the child before it executes the script: root gives up CAP_DAC_OVERRIDE (dropped from its bounding
    set, which caps what the executed program may hold), the one capability that lets it write where the permission
    bits say no, so that a folder's chmod binds it as it binds any user."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE)")


@contextmanager
def read_only(folder: Path) -> Iterator[Callable[[], None] | None]:
    """`folder` made read-only (chmod 555) for the scripts run with the `preexec_fn` this yields: a user's chmod binds
    a user, and root runs the script without the capability that overrides it (_without_root_override), which works
    on any file system, tmpfs and overlayfs included. A probe process checks that it cannot write there; where it
    can (root without CAP_SETPCAP to give the capability up), the test is skipped saying why, which -ra prints."""
    folder.chmod(0o555)
    preexec = _without_root_override if os.geteuid() == 0 else None
    try:
        try:
            probe = subprocess.run([sys.executable, "-c", f"open({str(folder / 'probe')!r}, 'w')"],
                                   capture_output=True, text=True, preexec_fn=preexec)
        except subprocess.SubprocessError as exc:
            pytest.skip(f"the read-only case did not run: root could not give up CAP_DAC_OVERRIDE ({exc})")
        if probe.returncode == 0:
            pytest.skip(f"the read-only case did not run: {folder} stayed writable after chmod 555")
        assert "PermissionError" in probe.stderr, probe.stderr[-2000:]
        yield preexec
    finally:
        folder.chmod(0o755)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_a_read_only_output_folder_is_one_line_before_any_work(case: Case, inputs: Inputs) -> None:
    locked = inputs.tmp / "read-only"
    locked.mkdir()
    where = locked / "out"
    with read_only(locked) as preexec:
        proc = run_script(case.script, *case.argv(inputs, where), timeout=120, preexec_fn=preexec)
    line = _refused(proc, case.constant, where, locked)
    assert "cannot write in" in line
    assert list(locked.iterdir()) == []


def test_a_run_name_that_names_a_file_is_one_line(inputs: Inputs) -> None:
    (inputs.tmp / "ckpt").mkdir()
    (inputs.tmp / "ckpt" / "run").write_text("the user's own file")
    proc = run_script("train_sparknet_v5.py", *train_args(inputs.tmp, inputs.dataset), timeout=120)
    line = _refused(proc, "RUN_NAME", inputs.tmp / "ckpt" / "run")
    assert "is a file, not a folder" in line and not (inputs.tmp / "logs").exists()


@pytest.mark.parametrize("script", ["train_sparknet_v5.py", "train_sparknet.py"])
def test_a_run_name_too_long_for_its_lock_file_is_one_line(script: str, inputs: Inputs) -> None:
    name = "r" * 250
    args = (train_args(inputs.tmp, inputs.dataset, run_name=name) if script == "train_sparknet_v5.py" else
            stream_args(inputs.tmp, inputs.config, inputs.tokenizer, run_name=name, num_workers=0))
    line = _refused(run_script(script, *args, timeout=120), "RUN_NAME", inputs.tmp / "ckpt" / name)
    assert f"at most {os.pathconf(inputs.tmp, 'PC_NAME_MAX') - len('...lock.json.tmp')} bytes" in line
    assert not (inputs.tmp / "ckpt").exists() and not (inputs.tmp / "logs").exists()


def test_the_longest_name_allowed_takes_its_lock_and_one_more_is_refused(tmp_path: Path) -> None:
    """The limit is the lock's own: a folder of the longest name allowed is locked (its lock files written and
    removed); one byte more is refused before anything is written."""
    from sparknet.common.locks import exclusive
    from sparknet.common.outputs import Output, check_outputs

    limit = os.pathconf(tmp_path, "PC_NAME_MAX") - len("...lock.json.tmp")  # the lock record's temporary file
    longest = tmp_path / ("x" * limit)
    check_outputs(Output("OUTPUT_DIR", longest, locked=True))
    with exclusive(longest, "a test"):
        longest.mkdir()
    with pytest.raises(UserError, match=f"at most {limit} bytes"):
        check_outputs(Output("OUTPUT_DIR", tmp_path / ("x" * (limit + 1)), locked=True))
    check_outputs(Output("EVAL_DIR", tmp_path / ("x" * (limit + 1))))  # no lock beside it: the folder's own limit
    with pytest.raises(UserError, match="EVAL_DIR="):
        check_outputs(Output("EVAL_DIR", tmp_path / ("x" * (limit + 17))))
    assert sorted(p.name for p in tmp_path.iterdir()) == [longest.name]  # the lock's files removed when it ended


def test_no_lock_file_stays_beside_an_output_and_the_lock_still_holds(tmp_path: Path) -> None:
    """A job's one-writer lock (and a results file's) leaves no `.NAME.lock` behind once it ends; while it runs, a
    second one is refused, and the next one after it takes the lock."""
    from sparknet.common.locks import exclusive
    from sparknet.eval.reports import merge_json

    target = tmp_path / "out"
    with exclusive(target, "a test"):
        assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", ".out.lock.json"]
        with pytest.raises(UserError, match="is in use: a second into it is running as process"):
            with exclusive(target, "a second"):
                pass
    assert list(tmp_path.iterdir()) == []
    with exclusive(target, "the next"):
        pass
    merge_json(tmp_path / "eval" / "perplexity.json", "k", {"nll": 1.0})
    assert [p.name for p in (tmp_path / "eval").iterdir()] == ["perplexity.json"]


def test_every_problem_is_listed_at_once_and_nothing_is_created(tmp_path: Path) -> None:
    from sparknet.common.outputs import Output, check_outputs

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    outputs = [Output("CHECKPOINTS_DIR", blocker / "run", name_constant="RUN_NAME", locked=True),
               Output("LOGS_DIR", blocker / "logs" / "run", name_constant="RUN_NAME"),
               Output("EVAL_DIR", tmp_path / "new" / "deeper")]
    with pytest.raises(UserError) as caught:
        check_outputs(*outputs)
    message = str(caught.value)
    assert "\n" not in message and message.count("is a file, not a folder") == 2
    assert "CHECKPOINTS_DIR=" in message and "LOGS_DIR=" in message and "EVAL_DIR" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # the good one is not created by the check


# -- where evaluation results go ---------------------------------------------------------------------------------------

@pytest.fixture
def run_with_checkpoint(random_model: Path, tmp_path: Path) -> Path:
    """A run folder (a copy of the random model) with a checkpoint-1 folder inside, for paths through it."""
    run = tmp_path / "runs" / "run"
    shutil.copytree(random_model, run)
    shutil.copytree(random_model, run / "checkpoint-1")
    return run


def test_perplexity_results_land_inside_eval_dir_however_the_model_is_spelled(
        run_with_checkpoint: Path, corpus_dir: Path, tmp_path: Path) -> None:
    """Through the script once, relative to the shell's folder and through a checkpoint and back up (the spelling
    that wrote outside EVAL_DIR); every other spelling names the same results folder (the script's eval_dir of the
    resolved model's name)."""
    from sparknet.eval.models import resolve_model
    from sparknet.eval.reports import eval_dir

    eval_root = tmp_path / "results" / "eval"
    for spelling in ("{run}/", "{run}/.", "{run}", "{run}/../run", "{run}/checkpoint-1/.."):
        assert eval_dir(resolve_model(spelling.format(run=run_with_checkpoint)).name, str(eval_root)) == \
            eval_root / "run", spelling
    model = "runs/run/checkpoint-1/.."  # from tmp_path, the script's folder below
    proc = run_script("eval_perplexity.py", "--models", json.dumps([model]), "--data", corpus_dir / "prose.val.jsonl",
                      "--max_documents", 2, "--context", 16, "--eval_dir", eval_root, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = sorted(p.relative_to(tmp_path / "results") for p in (tmp_path / "results").rglob("*") if p.is_file())
    assert written == [Path("eval/run/perplexity.json"), Path("eval/run/perplexity.md")]  # no lock file left
    assert f"results: {eval_root / 'run'}/perplexity.json" in proc.stdout


@pytest.mark.slow  # lm-eval's import and run: about 20 s
def test_generation_and_benchmark_results_land_inside_eval_dir(run_with_checkpoint: Path, tmp_path: Path) -> None:
    eval_root = tmp_path / "results" / "eval"
    model = json.dumps([f"{run_with_checkpoint}/checkpoint-1/.."])
    proc = run_script("eval_generation.py", "--models", model, "--max_new_tokens", 2, "--num_samples", 1,
                      "--eval_dir", eval_root, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # documents of short words: the suite's continuations fit the random model's 32-token context
    words = write_jsonl(tmp_path / "words.jsonl", [" ".join(["the", "cat", "sat", "on", "a", "mat", "and", "ran"][
        (i * 3 + j) % 8] for j in range(40)) for i in range(8)])
    proc = run_script("eval_benchmarks.py", "--models", model, "--suite_data", words, "--suite_items", 4,
                      "--suite_dir", tmp_path / "suite", "--eval_dir", eval_root, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = sorted(p.relative_to(tmp_path / "results") for p in (tmp_path / "results").rglob("*") if p.is_file())
    assert written == [Path("eval/run/benchmarks.json"), Path("eval/run/benchmarks.md"),
                       Path("eval/run/generation.md")]


def test_a_model_is_named_by_its_resolved_folder_and_a_hub_id_stays_inside(run_with_checkpoint: Path,
                                                                           tmp_path: Path) -> None:
    from sparknet.eval.models import resolve_model
    from sparknet.eval.reports import eval_dir

    assert resolve_model(f"{run_with_checkpoint}/checkpoint-1/..").name == "run"
    assert resolve_model(f"{run_with_checkpoint}/checkpoint-1/../checkpoint-1/").name == "run/checkpoint-1"
    hub = resolve_model("openai-community/gpt2")
    assert eval_dir(hub.name, str(tmp_path / "eval")).parent == tmp_path / "eval"
    for name in ("..", "", "run/..", "/etc"):
        with pytest.raises(UserError, match="inside EVAL_DIR"):
            eval_dir(name, str(tmp_path / "eval"))
