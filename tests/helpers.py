"""Helpers shared by the test modules: the scripts run as a user runs them, small inputs written, what a run wrote
read back (its per-step block log, TensorBoard), the settings of the tiny runs, and the Hub datasets the Hub tests
serve. Fixtures live in conftest.py; a helper used by one module stays in that module."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparknet.runtime import PROJECT_ROOT

if TYPE_CHECKING:
    import torch

    from sparknet.testing.hub_server import HubServer
    from sparknet.train.run import TrainResult
    from sparknet.train.settings import TrainSettings

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


# -- running the scripts ----------------------------------------------------------------------------------------------

def run_script(script: str, *args: object, cwd: Path | None = None, timeout: int = 300,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Runs scripts/<script> as a user would, offline (or with `env`'s variables: the Hub server's online ones),
    capturing its output."""
    env = {**os.environ, **OFFLINE_ENV, **(env or {})}
    return subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "scripts" / script), *(str(a) for a in args)],
        cwd=cwd or PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_script(script: str, args: list[object], processes: int = 1, own_group: bool = False,
                 env: dict[str, str] | None = None) -> subprocess.Popen:
    """scripts/<script> started in the background (under torchrun with `processes` > 1), its output merged into
    one pipe; `own_group` puts it in a session of its own, as a terminal's foreground job."""
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
                if processes > 1 else [sys.executable])
    return subprocess.Popen([*launcher, f"scripts/{script}", *map(str, args)], cwd=PROJECT_ROOT,
                            env={**os.environ, **OFFLINE_ENV, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=own_group)


def finish(proc: subprocess.Popen, timeout: float = 400) -> str:
    """Waits for `proc` (its whole group, if it has one of its own, is killed on a timeout: a hung run must not
    outlive the test) and returns its output."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"no end after {timeout} s: {out[-3000:]}") from None
    return out


def finish_ok(proc: subprocess.Popen, timeout: float = 400) -> str:
    out = finish(proc, timeout)
    assert proc.returncode == 0, out[-3000:]
    return out


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.005)


def kill_when(path: Path, proc: subprocess.Popen) -> None:
    """kill -9 the run as soon as `path` exists (e.g. a checkpoint's completion marker)."""
    wait_for(path, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def stopped_checkpoint(out: str, run_dir: Path) -> Path:
    """The checkpoint a stopped run says it saved ("stopped at step N: checkpoint saved in ..."), checked to be
    the newest complete one: the stop saved its own step, it did not just name it."""
    from sparknet.train.folders import latest_complete_checkpoint

    said = re.findall(r"stopped at step (\d+): checkpoint saved in", out)
    assert said, out[-3000:]
    checkpoint = run_dir / f"checkpoint-{said[-1]}"
    assert latest_complete_checkpoint(run_dir) == checkpoint, (out[-3000:], latest_complete_checkpoint(run_dir))
    return checkpoint


def checkpoint_step(folder: Path) -> int:
    return int(folder.name.split("-")[1])


def encoder_processes(pid: int) -> list[int]:
    """The spawned encoder processes under process `pid` (not multiprocessing's resource tracker)."""
    import psutil

    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "spawn_main" in " ".join(child.cmdline()):
                found.append(child.pid)
        except psutil.Error:
            pass
    return found


# -- inputs ------------------------------------------------------------------------------------------------------------

def write_jsonl(path: Path, texts: list[str], field: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({field: t}) + "\n")
    return path


def write_config(path: Path, mix: list[dict], **top: object) -> Path:
    data = {"seed": 1, "context_length": 128, "target_tokens": 10_000, "mix": mix, **top}
    path.write_text(json.dumps(data))
    return path


def read_texts(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text().splitlines()]


def random_run_folder(tokenizer_dir: Path, out: Path, seed: int = 0) -> Path:
    """A randomly initialised 2-layer GPT-2 (context 32) with the test tokenizer, saved at `out` as a run folder."""
    import shutil

    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = GPT2Config(vocab_size=len(tok), n_positions=32, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
    GPT2LMHeadModel(config).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out / name)
    return out


def assert_saves_alike(plain: torch.nn.Module, changed: torch.nn.Module, tmp_path: Path) -> None:
    """`save_pretrained` of both writes the same files, byte for byte."""
    plain.save_pretrained(tmp_path / "plain")
    changed.save_pretrained(tmp_path / "changed")
    names = sorted(p.name for p in (tmp_path / "plain").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "changed").iterdir()) and "model.safetensors" in names
    for name in names:
        assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "changed" / name).read_bytes(), name


# -- the packed build --------------------------------------------------------------------------------------------------

def build_args(cfg: Path, out: Path, tokenizer_dir: Path, *extra: object) -> list[object]:
    """scripts/build_dataset_v5.py's arguments for a small build in this process's encoder (`extra` overrides)."""
    return ["--config", cfg, "--tokenizer_dir", tokenizer_dir, "--output_dir", out, "--val_tokens", 10_000,
            "--num_workers", 0, *extra]


def stop_build_after_saves(monkeypatch: Any, stops: list[Callable[[str, dict], bool]]) -> None:
    """Makes the packed build raise KeyboardInterrupt (a Ctrl-C) right after a save of its position for which the
    first of `stops` (split, writers) holds; each stop is used once and removed from the list."""
    from sparknet.data.packed import build as build_module

    real_save = build_module.save_state

    def save_then_stop(folder: Path, **kw: Any) -> None:
        real_save(folder, **kw)
        if stops and stops[0](kw["split"], kw["writers"]):
            stops.pop(0)
            raise KeyboardInterrupt

    monkeypatch.setattr(build_module, "save_state", save_then_stop)


def run_where_a_local_folder_is(hub: HubServer, cwd: Path, script: str, *args: object) -> tuple[list[str], float]:
    """`script` run online (through the loopback Hub) from `cwd`: its non-empty stderr lines and its seconds."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(PROJECT_ROOT / "scripts" / script), *map(str, args)], cwd=cwd,
                          env=hub.env(cwd), capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-3000:]
    return lines, time.monotonic() - started


def build_position(building: Path) -> dict | None:
    """An interrupted build's saved position, or None while there is none (or it is being replaced)."""
    try:
        return json.loads((building / "build_state.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def build_until(argv: list[str], building: Path, stop: Callable[[dict], bool], sig: int,
                env: dict[str, str] | None = None) -> str:
    """Runs the build script until its saved position satisfies `stop`, then sends `sig`; returns its stderr."""
    proc = subprocess.Popen(argv, env={**os.environ, **OFFLINE_ENV, **(env or {})}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while proc.poll() is None and time.time() < deadline:
        state = build_position(building)
        if state is not None and stop(state):
            proc.send_signal(sig)
            break
        time.sleep(0.02)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0, "the build finished before it was interrupted"
    return err


# -- training ----------------------------------------------------------------------------------------------------------

# 40 steps of 4 blocks of 128 tokens: a few seconds with the tiny preset.
FAST = dict(model_preset="sparknet-tiny", target_tokens=40 * 4 * 128, global_batch_size=4, batch_size=4,
            learning_rate=3e-3, eval_steps=4, save_steps=8, sample_steps=8, logging_steps=2,
            sample_prompts=["def ", "The "], sample_max_new_tokens=8, seed=0)
# the streaming trainer's additions for the tests: a small hold-out and shuffle buffer, two encoder processes
STREAM = dict(val_tokens=2048, shuffle_buffer=50, num_workers=2, sample_steps=0)


def train_settings(tmp_path: Path, **kw: object) -> TrainSettings:
    """The packed trainer's settings for a FAST run named `run` under `tmp_path` (`kw` overrides)."""
    from sparknet.cli import script_constants
    from sparknet.train.settings import TrainSettings

    values = {**FAST, "run_name": "run", "checkpoints_dir": str(tmp_path / "ckpt"), "logs_dir": str(tmp_path / "logs"),
              **kw}
    return TrainSettings.from_constants(script_constants("train_sparknet_v5.py"), **values)


def train_packed(settings: TrainSettings, dataset: Path, tokenizer_dir: str | None = None) -> TrainResult:
    """The packed trainer in this process, as scripts/train_sparknet_v5.py runs it."""
    from sparknet.train.data_plan import packed_plan
    from sparknet.train.run import train

    return train(settings, packed_plan(str(dataset), tokenizer_dir, None))


def train_streamed(tmp_path: Path, config: Path, tokenizer_dir: Path, **kw: object) -> TrainResult:
    """The streaming trainer in this process, as scripts/train_sparknet.py runs it: a FAST run (with STREAM's data
    settings) of the mix `config` under `tmp_path` (`kw` overrides either)."""
    from sparknet.cli import script_constants
    from sparknet.config import load_config
    from sparknet.train.run import train
    from sparknet.train.settings import TrainSettings
    from sparknet.train.stream_plan import StreamSpec, stream_plan

    data = {**STREAM, **{k: v for k, v in kw.items() if k in STREAM}}
    values = {**FAST, "run_name": "run", "checkpoints_dir": str(tmp_path / "ckpt"), "logs_dir": str(tmp_path / "logs"),
              **{k: v for k, v in kw.items() if k not in STREAM}, "sample_steps": data["sample_steps"]}
    settings = TrainSettings.from_constants(script_constants("train_sparknet.py"), **values)
    mix = load_config(config)
    spec = StreamSpec(config=mix, tokenizer_dir=str(tokenizer_dir), block_size=mix.context_length,
                      val_tokens=data["val_tokens"], seed=mix.seed, shuffle_buffer=data["shuffle_buffer"],
                      on_exhausted="renormalise", num_workers=data["num_workers"], target_tokens=settings.target_tokens)
    return train(settings, stream_plan(spec, tmp_path / "ckpt" / "run"))


def _flags(values: dict[str, Any]) -> list[str]:
    args: list[str] = []
    for key, value in values.items():
        args += [f"--{key}", json.dumps(value) if isinstance(value, list) else str(value)]
    return args


def train_args(tmp_path: Path, dataset: Path, **kw: object) -> list[str]:
    """scripts/train_sparknet_v5.py's arguments for a FAST run on `dataset` under `tmp_path` (`kw` overrides)."""
    values = {**FAST, "run_name": "run", "dataset_dir": str(dataset), "checkpoints_dir": str(tmp_path / "ckpt"),
              "logs_dir": str(tmp_path / "logs"),
              "config": json.loads((dataset / "manifest.json").read_text())["config"]["path"], **kw}
    return _flags(values)


def stream_args(tmp: Path, config: Path, tokenizer: Path, **kw: object) -> list[str]:
    """scripts/train_sparknet.py's arguments for a FAST streamed run of `config` under `tmp` (`kw` overrides)."""
    return _flags({**FAST, **STREAM, "run_name": "run", "config": str(config), "tokenizer_dir": str(tokenizer),
                   "checkpoints_dir": str(tmp / "ckpt"), "logs_dir": str(tmp / "logs"), **kw})


def read_steps(batch_log: Path) -> dict[int, dict]:
    """RECORD_BATCHES' log by optimizer step: its LR, blocks and weights digest (a step replayed after a resume
    overwrites the one before the kill)."""
    steps: dict[int, dict] = {}
    for line in batch_log.read_text().splitlines():
        record = json.loads(line)
        steps[record["step"]] = record
    return steps


def step_blocks(run_dir: Path) -> dict[int, tuple[list[str], float]]:
    """Each optimizer step's blocks over all ranks (as a sorted list) and its LR."""
    out: dict[int, tuple[list[str], float]] = {}
    for log in sorted(run_dir.glob("batches*.jsonl")):
        for step, record in read_steps(log).items():
            blocks, lr = out.get(step, ([], record["lr"]))
            assert lr == record["lr"], (log, step)
            out[step] = (sorted(blocks + record["blocks"]), lr)
    return out


def read_events(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """A run's TensorBoard scalars as {tag: [(step, value)]}, and its text tags as "text:<tag>" (value 0)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    out = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    out.update({f"text:{tag}": [(e.step, 0.0) for e in acc.Tensors(tag)] for tag in acc.Tags()["tensors"]})
    return out


# -- the Hub datasets of the Hub tests ---------------------------------------------------------------------------------

HUB_REPO = "sparknet-test/prose"
HUB_MANY = "sparknet-test-many/prose"  # the same label, prose: short documents in 64 shards


def hub_readme() -> str:
    from sparknet.testing.hub_server import dataset_card

    return dataset_card("data/train-*.jsonl", "Prose for SparkNet's tests")


def write_shards(texts: list[str], folder: Path, stem: str, n: int = 8) -> list[Path]:
    """`n` JSONL shards of `texts`, in order (JSONL, so that the local twin is read by the same builder under the
    same label, `prose`: the label seeds the source's shuffle)."""
    return [write_jsonl(folder / f"{stem}.{i}.jsonl", texts[i::n]) for i in range(n)]


def add_many_shards(hub: HubServer, corpus_dir: Path, tmp_path: Path) -> list[Path]:
    """The prose's lines three by three as documents in 64 shards, served as HUB_MANY, and their local twin:
    short documents, so that the encoders' batches are read all along a run and a fault hits it mid-run."""
    lines = [line for text in read_texts(corpus_dir / "prose.train.jsonl") for line in text.splitlines()
             if line.strip()]
    local = write_shards(["\n".join(lines[i:i + 3]) for i in range(0, len(lines), 3)], tmp_path / "many", "prose",
                         n=64)
    hub.add_dataset(HUB_MANY, {**{f"data/train-{i:05d}.jsonl": p.read_bytes() for i, p in enumerate(local)},
                               "README.md": hub_readme()})
    return local


def hub_mix(corpus_dir: Path, tmp_path: Path, local: list[Path], prose: float = 0.5,
            repo: str = HUB_REPO) -> tuple[Path, Path]:
    """The Hub prose (`repo`) plus the local code, and the same mix with the prose's local twin."""
    code = str(corpus_dir / "code.train.jsonl")
    online = write_config(tmp_path / "hub.json", [{"name": repo, "split": "train", "prob": prose},
                                                  {"name": "json", "data_files": code, "prob": 1 - prose}])
    offline = write_config(tmp_path / "local.json", [{"name": "json", "data_files": [str(p) for p in local],
                                                      "prob": prose},
                                                     {"name": "json", "data_files": code, "prob": 1 - prose}])
    return online, offline


def hub_build(cfg: Path, out: Path, tokenizer_dir: Path, env: dict[str, str] | None = None,
              *extra: object) -> subprocess.CompletedProcess:
    """A small packed build of `cfg` (60k training tokens) in its own process, with `env` (the Hub server's)."""
    return run_script("build_dataset_v5.py", "--config", cfg, "--tokenizer_dir", tokenizer_dir, "--output_dir", out,
                      "--target_tokens", 60_000, "--val_tokens", 6_000, "--num_workers", 0, *extra, env=env)
