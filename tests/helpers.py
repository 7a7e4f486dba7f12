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

from sparknet.common.runtime import PROJECT_ROOT

if TYPE_CHECKING:
    import torch

    from sparknet.train.run import TrainResult
    from sparknet.train.settings import TrainSettings
    from tests.hub_server import HubServer

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


# -- running the scripts ----------------------------------------------------------------------------------------------

def run_script(script: str, *args: object, cwd: Path | None = None, timeout: int = 300,
               env: dict[str, str] | None = None, preexec_fn: Callable[[], None] | None = None,
               file_size_limit: int | None = None) -> subprocess.CompletedProcess:
    """Runs scripts/<script> as a user would, offline (or with `env`'s variables: the Hub server's online ones),
    capturing its output; `preexec_fn` runs in the child before the script (e.g. to give up a privilege);
    `file_size_limit`: the largest file it may write, in bytes (`ulimit -f`: a write fault that holds for root
    too, where a read-only folder does not)."""
    env = {**os.environ, **OFFLINE_ENV, **(env or {})}

    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    return subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "scripts" / script), *(str(a) for a in args)],
        cwd=cwd or PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=(lambda: (limit(), preexec_fn and preexec_fn())) if file_size_limit is not None else preexec_fn,
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


def split_in_two_files(config: Path, folder: Path) -> Path:
    """The mix with each source's file cut into two: shards that divide among two processes."""
    mix = []
    for entry in json.loads(config.read_text())["mix"]:
        lines = Path(entry["data_files"]).read_text(encoding="utf-8").splitlines(keepends=True)
        halves = [folder / f"{Path(entry['data_files']).stem}-{k}.jsonl" for k in range(2)]
        for k, half in enumerate(halves):
            half.write_text("".join(lines[k * len(lines) // 2:(k + 1) * len(lines) // 2]), encoding="utf-8")
        mix.append({**entry, "data_files": [str(h) for h in halves]})
    return write_config(folder / "mix.json", mix, context_length=128)


def read_texts(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text().splitlines()]


# -- documents tagged with their source: who owns each token, read from the text alone ---------------------------------

def tagged_owners(tokens: Any, eos: int, decode: Callable[[list[int]], str], tags: dict[str, int],
                  untagged: int = -1, block_size: int | None = None, rests: dict[str, str] | None = None) -> Any:
    """Who owns each token of `tokens` (an int array of the same shape; flat ones need `block_size`, blocks give
    theirs), independently of what SparkNet recorded, for test documents that start with their source's tag and a
    five-digit number ("a00012 ", "b00345 "): `tags[the tag's letter]`, read back by `tagged_documents` (a long
    document's pieces, each ending with its block, its owner's; `rests`, by tag, the rest of each document whose
    start the validation split took: `held_out_rests`); `untagged` for a document begun before `tokens`."""
    import numpy as np

    shape = np.shape(tokens)
    flat = np.asarray(tokens).reshape(-1)
    size = block_size or shape[-1]
    index, docs = tagged_documents(flat, size, eos, decode,
                                   lambda text: match.group(0) if (match := re.match(r"\w\d{5}", text)) and
                                   text[0] in tags else None, rests)
    source = np.array([tags[doc["tag"][0]] for doc in docs] + [untagged], dtype=np.int64)
    return source[index].reshape(shape)  # (index -1 is the last entry: `untagged`)


def held_out_rests(rows: dict[str, Any], texts: dict[str, list[str]], encode: Callable[[str], list[int]],
                   decode: Callable[[list[int]], str]) -> dict[str, str]:
    """The text of the rest of each document the hold-out cut (which training takes first, with no tag of its
    own), by the tag ("a00012", "a-huge") the document starts with; `rows`: per source, the hold-out's
    `HeldOutRows` or their `to_dict()` (as a dataset's position.json records them under "held_out"), `texts`: each
    source's documents."""
    out = {}
    for label, held in rows.items():
        rests = held["rests"] if isinstance(held, dict) else held.rests
        for row, token in dict(rests).items():
            text = texts[label][int(row)]
            out[text.split(" ", 1)[0]] = decode(encode(text)[int(token):])
    return out


def assert_every_prefix_mixed(owner: Any, share: float, block_size: int, *, whole_within: float,
                              prefix_within: float = 0.12, skip: int = 32) -> None:
    """The mix holds from the start: in `owner` (per token of whole blocks, 1 for source a and 0 for the others, as
    `tagged_owners` gives it), source a's share of every prefix of whole blocks from `skip` blocks on is within
    `prefix_within` of `share`, and of the whole within `whole_within`. A source's document handed out in a piece
    of up to 8 blocks is half a prefix of 16, so nothing much tighter holds in the first blocks."""
    import numpy as np

    per_block = np.asarray(owner).reshape(-1, block_size).mean(axis=1)
    prefix = np.cumsum(per_block) / np.arange(1, len(per_block) + 1)
    worst = np.abs(prefix[skip - 1:] - share).max()
    assert worst <= prefix_within, f"a prefix's share of source a is {share}±{worst:.3f}"
    assert abs(prefix[-1] - share) <= whole_within, f"the whole's share of source a is {prefix[-1]:.4f}, not {share}"


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


def stop_build_after_saves(monkeypatch: Any, stops: list[Callable[[dict], bool]]) -> None:
    """Makes the packed build raise KeyboardInterrupt (a Ctrl-C) right after a save of its position for which the
    first of `stops` (given the saved state: its "written" blocks per split, its "position") holds; each stop is used
    once and removed from the list."""
    from sparknet.data.packed import build as build_module

    real_save = build_module._Writing.save

    def save_then_stop(self: Any, loop: Any) -> None:
        real_save(self, loop)
        if stops and stops[0](self.saved):
            stops.pop(0)
            raise KeyboardInterrupt

    monkeypatch.setattr(build_module._Writing, "save", save_then_stop)


def stream_of(config: Any, tokenizer_json: str, eos_id: int, **kw: Any) -> Any:
    """A TokenStream of `config` whose DataSpec and Part take their fields from `kw` (`block_size` and `seed`
    default to 128 and 0; `held_out`, per source, may give a row count for `HeldOutRows`)."""
    import dataclasses

    from sparknet.data.spec import DataSpec, HeldOutRows, Part
    from sparknet.data.stream.token_stream import TokenStream

    data = {f.name for f in dataclasses.fields(DataSpec)}
    held = {label: rows if isinstance(rows, HeldOutRows) else HeldOutRows(rows)
            for label, rows in dict(kw.pop("held_out", {})).items()}
    if "exclude" in kw:
        kw["exclude"] = frozenset(kw["exclude"])
    spec = DataSpec(config=config, tokenizer_json=tokenizer_json, eos_id=eos_id,
                    **{"block_size": 128, "seed": 0, **{k: v for k, v in kw.items() if k in data}})
    return TokenStream(spec, Part(held_out=held, **{k: v for k, v in kw.items() if k not in data}))


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
        return json.loads((building / "position.json").read_text())
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
    from sparknet.config.cli import script_constants
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
    from sparknet.config.cli import script_constants
    from sparknet.config.mix import load_config
    from sparknet.train.run import train
    from sparknet.train.settings import TrainSettings
    from sparknet.train.stream_plan import StreamSpec, stream_plan

    window = kw.pop("shuffle_window", script_constants("train_sparknet.py")["SHUFFLE_WINDOW"])
    data = {**STREAM, **{k: v for k, v in kw.items() if k in STREAM}}
    values = {**FAST, "run_name": "run", "checkpoints_dir": str(tmp_path / "ckpt"), "logs_dir": str(tmp_path / "logs"),
              **{k: v for k, v in kw.items() if k not in STREAM}, "sample_steps": data["sample_steps"]}
    settings = TrainSettings.from_constants(script_constants("train_sparknet.py"), **values)
    mix = load_config(config)
    spec = StreamSpec(config=mix, tokenizer_dir=str(tokenizer_dir), block_size=mix.context_length,
                      val_tokens=data["val_tokens"], seed=mix.seed, shuffle_buffer=data["shuffle_buffer"],
                      on_exhausted="renormalise", num_workers=data["num_workers"], target_tokens=settings.target_tokens,
                      window_blocks=window)
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


def weights_apart(a: Path, b: Path) -> float:
    """|a - b| / |b| over all parameters of two saved models (folders with model.safetensors). Not bit for bit
    across process counts: the reductions differ (equal weights after step 1, about 1e-6 apart after step 2), and
    120 AdamW steps grow that to about 1e-3; other blocks or another LR in a single step would put them far further
    apart."""
    import torch
    from safetensors.torch import load_file

    first, second = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    diff = torch.sqrt(sum(((first[k] - second[k]) ** 2).sum() for k in second))
    return float(diff / torch.sqrt(sum((second[k] ** 2).sum() for k in second)))


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
    from tests.hub_server import dataset_card

    return dataset_card("data/train-*.jsonl", "Prose for SparkNet's tests")


def write_shards(texts: list[str], folder: Path, stem: str, n: int = 8) -> list[Path]:
    """`n` JSONL shards of `texts`, in order (JSONL, so that the local twin is read by the same builder under the
    same label, `prose`: the label seeds the source's shuffle)."""
    return [write_jsonl(folder / f"{stem}.{i}.jsonl", texts[i::n]) for i in range(n)]


def many_shards(corpus_dir: Path, folder: Path) -> list[Path]:
    """The prose's lines three by three as documents in 64 local shards: short documents, so that the encoders'
    batches are read all along a run and a fault hits it mid-run."""
    lines = [line for text in read_texts(corpus_dir / "prose.train.jsonl") for line in text.splitlines()
             if line.strip()]
    return write_shards(["\n".join(lines[i:i + 3]) for i in range(0, len(lines), 3)], folder, "prose", n=64)


def add_many_shards(hub: HubServer, corpus_dir: Path, tmp_path: Path) -> list[Path]:
    """many_shards served as HUB_MANY, and their local twin."""
    local = many_shards(corpus_dir, tmp_path / "many")
    hub.add_dataset(HUB_MANY, {**{f"data/train-{i:05d}.jsonl": p.read_bytes() for i, p in enumerate(local)},
                               "README.md": hub_readme()})
    return local


# The streamed run of the Hub-fault scenarios on HUB_MANY's mix: 120 steps of 8 blocks in two micro-batches (a step
# can be cut mid-way), one step's blocks per window (the stream reads only a step ahead), checkpoints every 20 steps.
MANY_RUN = dict(target_tokens=120 * 8 * 128, eval_steps=20, save_steps=20, logging_steps=10, record_batches=True,
                shuffle_buffer=4, global_batch_size=8, batch_size=4, num_workers=0, shuffle_window=8)


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


# -- reading tagged documents back from packed tokens -----------------------------------------------------------------

def tagged_documents(tokens: Any, block_size: int, eos_id: int, decode: Callable[[list[int]], str],
                     tag_of: Callable[[str], str | None],
                     rests: dict[str, str] | None = None) -> tuple[Any, list[dict[str, Any]]]:
    """Who owns each token of `tokens` (flat, whole blocks), read back from the text alone: every test document
    starts with a tag (`tag_of(text)` gives it, None for text that does not start with one). A document is cut
    into segments at its <|endoftext|>, at block ends, and where a long document is handed out in pieces (a piece
    ends with its block; the next piece follows later, after other documents): a segment without a tag is the
    document that ran into the end of the previous block (when it opens a block), else the last document left
    unfinished (the tests mix at most one source of long documents, so that one is unambiguous). `rests`: the text
    of documents whose start the validation split took, by tag (a training split starts with them, untagged).
    Returns the index of each token's document (-1: a document begun before `tokens`) and the documents: tag,
    text, tokens, pieces, and whether it is such a rest."""
    import numpy as np

    segments = []  # (start, end, opens a block, runs into the block's end)
    for block_start in range(0, len(tokens), block_size):
        block = tokens[block_start:block_start + block_size]
        cuts = [0, *(np.flatnonzero(block == eos_id) + 1)]
        if cuts[-1] != len(block):
            cuts.append(len(block))
        segments += [(block_start + a, block_start + b, a == 0, b == len(block) and block[-1] != eos_id)
                     for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    owner = np.full(len(tokens), -1, dtype=np.int64)
    docs: list[dict[str, Any]] = []
    straddling: int | None = None  # the document that ran into the end of the previous block, unfinished
    suspended: list[int] = []  # documents left unfinished at a block end, continued later
    unseen = dict(rests or {})
    for k, (start, end, opens, runs_on) in enumerate(segments):
        text = decode(tokens[start:end].tolist())
        tag = tag_of(text)
        # a document that runs into the next block may have its tag (or the rest's start) cut by the block end
        joined = decode(tokens[start:segments[k + 1][1]].tolist()) \
            if runs_on and k + 1 < len(segments) and segments[k + 1][2] else text
        if tag is None:
            tag = tag_of(joined)
        if tag is None and runs_on and re.fullmatch(r"[A-Za-z]\d{0,4}", text) and tag_of(text.ljust(6, "0") + " "):
            tag = text  # a validation piece cut at its block's end inside its tag (the rest was training's)
        probe = joined.rstrip("\ufffd")[:60]  # (a segment may end inside a character)
        # a rest is known by its first 20+ characters (or all of a shorter one): a chance match is then out of reach
        rest = None if tag is not None else next(
            (name for name, rest_text in unseen.items()
             if rest_text.startswith(probe) and (len(probe) >= 20 or probe == rest_text)), None)
        if tag is not None or rest is not None:
            index = len(docs)
            docs.append({"tag": tag or rest, "ids": [], "tokens": 0, "pieces": 1, "rest": rest is not None})
            unseen.pop(rest, None)
        elif opens and straddling is not None:
            index = straddling
        elif suspended:
            index = suspended.pop()
            docs[index]["pieces"] += 1
        else:
            index = -1
        if opens and straddling is not None and index != straddling:
            suspended.append(straddling)  # a piece that ended with its block: its document goes on later
        if opens:
            straddling = None
        owner[start:end] = index
        if index >= 0:
            docs[index]["ids"] += tokens[start:end].tolist()
            docs[index]["tokens"] += end - start
        if runs_on:
            straddling = index if index >= 0 else None
    for doc in docs:  # decoded whole: a character may straddle two segments
        doc["text"] = decode(doc.pop("ids"))
    return owner, docs
