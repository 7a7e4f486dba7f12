"""Training on the packed dataset: budget, TensorBoard, samples, export, resume, signals, conflicts, divergence."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch

from sparknet.train.batch import budget
from sparknet.train.data_plan import packed_plan
from sparknet.train.folders import latest_complete_checkpoint
from tests.helpers import (
    kill_when,
    read_events,
    read_steps,
    run_script,
    start_script,
    train_args,
    train_packed,
    train_settings,
    wait_for,
)


def test_budget_arithmetic() -> None:
    assert budget(1_000_000_000, 1024, 128) == (7630, 131072)  # ceil(1e9 / 131072) = ceil(7629.39)
    assert budget(1_000_000_000, 1024, 1024) == (954, 1048576)
    assert budget(131072, 1024, 128) == (1, 131072)


def test_tensorboard_tags_present_once_and_finite(finished) -> None:
    result, tmp = finished
    log_dir = tmp / "logs" / "run"
    assert len(list(log_dir.glob("events.out.tfevents.*"))) == 1  # one event stream
    events = read_events(log_dir)
    expected = {"train/loss", "train/perplexity", "train/learning_rate", "train/grad_norm", "perf/tokens_per_second",
                "perf/examples_per_second", "perf/tokens_seen", "perf/mfu", "eval/loss", "eval/perplexity",
                "eval/bits_per_byte", "eval/bits_per_byte/prose", "eval/bits_per_byte/code"}
    assert expected <= set(events), expected - set(events)
    # on a CPU there is no device memory: no figure that would be the process's instead; a packed run has no data/
    assert "perf/device_memory_gb" not in events and not [tag for tag in events if tag.startswith("data/")], events
    # the Custom Scalars tab: the loss first, then bits per byte, speed and LR, each chart on tags the run wrote
    (categories, step), = _layout(log_dir)
    assert step == 0 and [title for title, _ in categories] == ["Loss", "Bits per byte", "Speed", "Learning rate"]
    shown = {title: sorted(tag for tag in events if any(re.match(regex, tag) for regex in regexes))
             for title, regexes in categories}
    assert shown == {"Loss": ["eval/loss", "train/loss"],
                     "Bits per byte": ["eval/bits_per_byte", "eval/bits_per_byte/code", "eval/bits_per_byte/prose"],
                     "Speed": ["perf/tokens_per_second"], "Learning rate": ["train/learning_rate"]}, shown
    samples = [tag for tag in events if tag.startswith("text:samples")]
    assert len(samples) == 1 and [s for s, _ in events[samples[0]]] == [8, 16, 24, 32, 40]
    for tag, points in events.items():
        steps = [s for s, _ in points]
        assert len(steps) == len(set(steps)), f"{tag} written twice at one step"
        assert all(math.isfinite(v) for _, v in points), tag
    assert [s for s, _ in events["train/grad_norm"]] == list(range(1, 41))  # every optimizer step
    assert [s for s, _ in events["train/loss"]] == list(range(2, 41, 2))
    assert [s for s, _ in events["eval/loss"]] == [0, *range(4, 41, 4)]
    assert events["perf/tokens_seen"][-1] == (40, 40 * 4 * 128)
    assert events["eval/loss"][-1][1] < events["eval/loss"][0][1]  # it learns
    assert all(0 < v < 10 for _, v in events["eval/bits_per_byte"])


def _layout(log_dir: Path) -> list[tuple[list[tuple[str, list[str]]], int]]:
    """The Custom Scalars layouts a run's event files hold, as TensorBoard's plugin reads them: each one's categories
    (title, the tag regexes of their charts) and its step."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.custom_scalar import layout_pb2

    layouts = []
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.tag == "custom_scalars__config__":
                    layout = layout_pb2.Layout.FromString(value.tensor.string_val[0])
                    layouts.append(([(category.title, [regex for chart in category.chart
                                                       for regex in chart.multiline.tag])
                                     for category in layout.category], event.step))
    return layouts


def test_samples_written(finished) -> None:
    result, _ = finished
    names = sorted(p.name for p in result.run_dir.glob("sample_step*.txt"))
    assert names == [f"sample_step{s:06d}.txt" for s in (8, 16, 24, 32, 40)]
    text = (result.run_dir / "sample_step000040.txt").read_text()
    assert text.startswith("step 40") and "def " in text and "The " in text


def test_export_loads_with_automodel_and_matches_logits(finished) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    result, _ = finished
    model = AutoModelForCausalLM.from_pretrained(str(result.run_dir)).eval()
    tok = AutoTokenizer.from_pretrained(str(result.run_dir))
    ids = tok("def main():\n    return", return_tensors="pt")["input_ids"]
    trained = result.trainer.model.eval()
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, trained(ids).logits, atol=1e-5)
    out = model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=tok.eos_token_id)
    assert out.shape[1] == ids.shape[1] + 5
    # padding works out of the box for batched generation and evaluation: <|endoftext|> is the pad token
    assert tok.pad_token == tok.eos_token == "<|endoftext|>" and model.config.pad_token_id == tok.eos_token_id
    saved = json.loads((result.run_dir / "tokenizer_config.json").read_text())
    assert saved["tokenizer_class"] == "PreTrainedTokenizerFast" and "local_files_only" not in saved
    # the run folder and its checkpoints encode the eos string as the eos id for plain AutoTokenizer, as the export
    # does (sparknet.tokenizer's rule: the flag the trainer's in-memory tokenizer carries is not saved)
    checkpoints = sorted(result.run_dir.glob("checkpoint-*"))
    assert checkpoints
    for folder in (result.run_dir, *checkpoints):
        assert "split_special_tokens" not in json.loads((folder / "tokenizer_config.json").read_text()), folder
    assert tok("def main():" + tok.eos_token)["input_ids"][-1] == tok.eos_token_id
    tok.padding_side = "left"
    batch = tok(["def main():\n    return", "The"], return_tensors="pt", padding=True)
    out = model.generate(**batch, max_new_tokens=4, do_sample=False)
    alone = model.generate(tok(["The"], return_tensors="pt")["input_ids"], max_new_tokens=4, do_sample=False)
    assert out[1, -4:].tolist() == alone[0, -4:].tolist()
    assert model.config.eos_token_id == tok.eos_token_id == model.generation_config.eos_token_id
    # trained without a KV cache (TrainingArguments.use_cache), exported with the library's default on
    assert json.loads((result.run_dir / "config.json").read_text())["use_cache"] is True
    with torch.no_grad():
        assert model(ids).past_key_values is not None
    meta = json.loads((result.run_dir / "training_metadata.json").read_text())
    assert meta["tokens_seen"] == 40 * 4 * 128 and meta["model"]["parameters"] == model.num_parameters()
    assert meta["metrics"]["eval_loss"] < meta["metrics"]["eval_loss_start"]
    assert set(meta["versions"]) >= {"torch", "transformers", "datasets"}
    assert set(meta["dataset"]["realised_mixture"]["train"]) == {"prose", "code"}


@pytest.mark.slow
def test_same_run_name_with_other_settings_is_refused(finished, tiny_dataset: Path, tmp_path: Path) -> None:
    import shutil

    _, tmp = finished
    shutil.copytree(tmp / "ckpt", tmp_path / "ckpt")
    (tmp_path / "ckpt" / "run" / "training_metadata.json").unlink()  # as if killed before the export
    # CONFIG left out: the dataset's mix, and its target_tokens the budget (the same run but for the LR)
    proc = run_script("train_sparknet_v5.py", *train_args(tmp_path, tiny_dataset, learning_rate=1e-4, config=None))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "CONFIG not given: the mix is the dataset's" in proc.stderr
    assert "run run exists with other settings (LEARNING_RATE: 0.003 -> 0.0001)" in proc.stderr
    assert "--allow_config_change true" in proc.stderr


def test_a_finished_run_with_other_settings_says_to_choose_a_new_run_name(finished, tiny_dataset: Path) -> None:
    """Continuing a finished run with the flag would only end in "already finished": the hint is the new name. (The
    trainer as the script runs it; the script's one line for such a refusal: the test above.)"""
    from sparknet.common.errors import UserError

    _, tmp = finished
    with pytest.raises(UserError) as caught:
        train_packed(train_settings(tmp, learning_rate=1e-4), tiny_dataset)
    error = str(caught.value)
    assert "\n" not in error and "run run already finished" in error, error
    assert "LEARNING_RATE: 0.003 -> 0.0001" in error and "choose a new RUN_NAME" in error
    assert "allow_config_change" not in error


def test_a_resume_refused_for_a_rebuilt_dataset_names_the_changed_file_and_both_sums(finished, tiny_dataset: Path,
                                                                                     tmp_path: Path) -> None:
    """The run trained on the dataset before one of its files was edited and the dataset rebuilt: the refusal names
    the file's key and both sha256 (once two identical 80-character prefixes of the whole inputs)."""
    import shutil

    _, tmp = finished
    shutil.copytree(tmp / "ckpt", tmp_path / "ckpt")
    identity_path = tmp_path / "ckpt" / "run" / "run_config.json"
    identity = json.loads(identity_path.read_text())
    sums = identity["dataset_inputs"]["local_files_sha256"]
    edited = sorted(sums)[-1]
    before = sums[edited] = "0" * 40 + sums[edited][40:]  # the file as it was when the run trained on it
    identity_path.write_text(json.dumps(identity))
    from sparknet.common.errors import UserError

    with pytest.raises(UserError) as caught:  # the trainer as the script runs it
        train_packed(train_settings(tmp_path), tiny_dataset)
    error = [str(caught.value)]
    now = json.loads((tiny_dataset / "manifest.json").read_text())["inputs"]["local_files_sha256"][edited]
    assert "\n" not in error[0] and f"DATASET_INPUTS.local_files_sha256.{edited}: " in error[0], error
    shown = error[0].split(f"local_files_sha256.{edited}: ")[1]
    old, new = shown.split(" -> ")[0], shown.split(" -> ")[1].split(")")[0]
    assert old != new and old.strip('"…').startswith(before[:8]) and new.strip('"…').startswith(now[:8]), error


@pytest.mark.slow
def test_kill_then_resume_reproduces_lr_and_batch_order(tiny_dataset: Path, tmp_path: Path) -> None:
    long = dict(target_tokens=120 * 4 * 128, eval_steps=10, save_steps=10, sample_steps=0, record_batches=True)
    reference = train_packed(train_settings(tmp_path / "a", **long), tiny_dataset)
    expected = read_steps(reference.run_dir / "batches.jsonl")
    assert len(expected) == 120

    args = train_args(tmp_path / "b", tiny_dataset, **long)
    run_dir = tmp_path / "b" / "ckpt" / "run"
    kill_when(run_dir / "checkpoint-20" / ".complete", start_script("train_sparknet_v5.py", args))
    assert not (run_dir / "training_metadata.json").exists()
    latest = latest_complete_checkpoint(run_dir)
    step = int(latest.name.split("-")[1])
    partial = run_dir / f"checkpoint-{step + 10}"  # as if the process had died while writing the next checkpoint
    partial.mkdir(exist_ok=True)
    (partial / "model.safetensors").write_bytes(b"truncated")
    (partial / ".complete").unlink(missing_ok=True)
    assert latest_complete_checkpoint(run_dir) == latest

    resumed = run_script("train_sparknet_v5.py", *args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"skipping {partial}" in resumed.stderr and f"resuming from {latest}" in resumed.stderr
    for bar in ("Writing model shards", "Loading weights"):  # transformers' bars at every save and load: hidden
        assert bar not in resumed.stdout + resumed.stderr, bar
    got = read_steps(run_dir / "batches.jsonl")
    assert sorted(got) == sorted(expected)
    for step in expected:
        assert got[step]["lr"] == expected[step]["lr"], step
        assert got[step]["blocks"] == expected[step]["blocks"], step
    # TensorBoard, as one stream: every step once, what the killed attempt logged past its checkpoint purged
    events = read_events(tmp_path / "b" / "logs" / "run")
    reference_events = read_events(tmp_path / "a" / "logs" / "run")
    for tag in ("train/loss", "train/learning_rate", "train/grad_norm", "eval/loss"):
        assert [s for s, _ in events[tag]] == [s for s, _ in reference_events[tag]], tag
    assert [v for _, v in events["train/learning_rate"]] == [v for _, v in reference_events["train/learning_rate"]]
    # the Custom Scalars layout once per run: the resume's event file adds none
    log_dir = tmp_path / "b" / "logs" / "run"
    assert len(list(log_dir.glob("events.out.tfevents.*"))) == 2 and _layout(log_dir) == _layout(
        tmp_path / "a" / "logs" / "run") and len(_layout(log_dir)) == 1


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])  # Ctrl-C; the terminal or SSH session closed
def test_a_stop_signal_saves_a_checkpoint_then_exits(sig: signal.Signals, tiny_dataset: Path, tmp_path: Path) -> None:
    args = train_args(tmp_path, tiny_dataset, target_tokens=4000 * 4 * 128, eval_steps=50, save_steps=100,
                        sample_steps=0, logging_steps=1000)
    run_dir = tmp_path / "ckpt" / "run"
    proc = start_script("train_sparknet_v5.py", args)
    wait_for(run_dir / "eval_start.json", proc)
    time.sleep(1.0)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, out[-2000:]
    assert "Traceback" not in out
    saved = latest_complete_checkpoint(run_dir)
    assert saved is not None and f"checkpoint saved in {saved}" in out
    stop = int(saved.name.split("-")[1])
    assert stop < 4000
    # what happened since the last log reaches TensorBoard: every grad norm, and the loss at the stop
    events = read_events(tmp_path / "logs" / "run")
    assert [s for s, _ in events["train/grad_norm"]] == list(range(1, stop + 1))
    assert [s for s, _ in events["train/loss"]] == [stop]
    # no "final" sample: after a stop the Trainer reloads the best checkpoint, which is not the stop step's model
    assert not list(run_dir.glob("sample_step*.txt"))


@pytest.mark.slow
def test_non_finite_loss_stops_cleanly_and_keeps_the_last_good_checkpoint(tiny_dataset: Path,
                                                                          tmp_path: Path) -> None:
    from safetensors.torch import load_file

    args = train_args(tmp_path, tiny_dataset, learning_rate=1e30, max_grad_norm=0.0, warmup_ratio=0.0,
                        eval_steps=1, save_steps=1, sample_steps=0, logging_steps=1)
    proc = run_script("train_sparknet_v5.py", *args)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "error: training stopped: non-finite loss or grad norm at step" in proc.stderr
    bad_step = int(proc.stderr.split("grad norm at step ")[1].split(";")[0])
    run_dir = tmp_path / "ckpt" / "run"
    saved = sorted(int(p.name.split("-")[1]) for p in run_dir.glob("checkpoint-*"))
    # step 1 starts from the initial weights (finite loss and grads): its checkpoint is kept, none at or after the bad
    # step is written, and the error names the last good one
    assert saved and saved[-1] == bad_step - 1, (saved, bad_step)
    assert f"the last good checkpoint is {run_dir / f'checkpoint-{bad_step - 1}'}" in proc.stderr
    weights = load_file(str(run_dir / f"checkpoint-{saved[-1]}" / "model.safetensors"))
    assert all(torch.isfinite(w).all() for w in weights.values())
    assert not (run_dir / "training_metadata.json").exists()


def test_sampling_leaves_rng_and_train_mode_as_they_were(finished, tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter
    from transformers import AutoTokenizer, TrainerState

    from sparknet.train.callbacks import MetricsCallback, MetricsSpec, SamplingCallback

    result, _ = finished
    model = result.trainer.model.train()
    tok = AutoTokenizer.from_pretrained(str(result.run_dir))
    writer = SummaryWriter(str(tmp_path / "tb"))
    spec = MetricsSpec(tokens_per_step=512, block_size=128, flops_per_token=1.0, peak_flops=None, world_size=1,
                       eval_tokens=0, eval_bytes=0, device_kind="cpu")
    metrics = MetricsCallback(spec=spec, writer=writer, grad_norms=[])
    settings = train_settings(tmp_path, sample_prompts=["def "], sample_steps=1, sample_max_new_tokens=6,
                              sample_temperature=0.8, sample_top_k=50, sample_seed=7)
    sampler = SamplingCallback(tok, settings, tmp_path, writer, metrics)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    state = TrainerState()
    state.global_step = 5
    first = sampler.sample(model, state)
    assert torch.equal(torch.get_rng_state(), before) and model.training
    assert sampler.sample(model, state) == first  # fixed sampling seed: the same text
    assert (tmp_path / "sample_step000005.txt").read_text() == first


def test_a_different_tokenizer_than_the_datasets_is_refused(tiny_dataset: Path, tokenizer_dir: Path,
                                                            tmp_path: Path) -> None:
    import shutil

    from sparknet.common.errors import UserError

    other = tmp_path / "tok"
    shutil.copytree(tokenizer_dir, other)
    data = json.loads((other / "tokenizer.json").read_text())
    (other / "tokenizer.json").write_text(json.dumps(data, indent=1))  # same vocabulary, another file
    with pytest.raises(UserError, match="is not the one dataset .* was built with"):
        train_packed(train_settings(tmp_path), tiny_dataset, str(other))


def test_a_budget_below_one_step_is_refused(tiny_dataset: Path, tmp_path: Path) -> None:
    """One step would train on more tokens than asked, all of it inside the warmup (LR 0): a mistake, not a run."""
    from sparknet.common.errors import UserError

    with pytest.raises(UserError, match=r"TARGET_TOKENS=100 is less than one optimizer step of 512 tokens"):
        train_packed(train_settings(tmp_path, target_tokens=100), tiny_dataset)
    assert not (tmp_path / "ckpt" / "run").exists()


def test_throughput_counts_each_pause_once_and_the_last_step_is_logged(tiny_dataset: Path, tmp_path: Path) -> None:
    """Sampling on an eval/save step that is not a logging step used to be subtracted twice (1.5e12 tokens/s)."""
    result = train_packed(train_settings(tmp_path, logging_steps=3, eval_steps=4, save_steps=8, sample_steps=4),
                          tiny_dataset)
    events = read_events(tmp_path / "logs" / "run")
    assert [s for s, _ in events["train/loss"]] == [*range(3, 40, 3), 40]  # and the last step, off the grid
    assert [s for s, _ in events["train/grad_norm"]] == list(range(1, 41))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "logs" / "run"))
    acc.Reload()
    loss_times = {e.step: e.wall_time for e in acc.Scalars("train/loss")}
    rates = dict(events["perf/tokens_per_second"])
    previous = 0
    for step, rate in sorted(rates.items()):
        tokens = (step - previous) * 4 * 128
        if previous:  # a window's training time is at most its wall time, so its rate is at least this
            assert rate >= tokens / (loss_times[step] - loss_times[previous]) * 0.99, (step, rate)
        previous = step
    # nothing absurd (the bug gave 1.5e12): no window beats the whole run's wall-clock rate by orders of magnitude,
    # a bound loose enough for a busy machine
    overall = 40 * 4 * 128 / (loss_times[40] - acc.Scalars("eval/loss")[0].wall_time)
    assert max(rates.values()) < 50 * overall, (rates, overall)
    meta = result.metadata["metrics"]
    assert meta["tokens_per_second"] == pytest.approx(rates[40], rel=1e-6)
    # the run's mean rate is its tokens over the windows' summed training time, which the logged rates give back
    # (a pause counted twice would shorten that time and raise the mean), and at least the wall-clock rate
    windows = zip([0, *sorted(rates)][:-1], sorted(rates.items()), strict=True)
    training_seconds = sum((step - before) * 4 * 128 / rate for before, (step, rate) in windows)
    assert meta["tokens_per_second_mean"] == pytest.approx(40 * 4 * 128 / training_seconds, rel=1e-3)
    assert meta["tokens_per_second_mean"] >= overall * 0.99


def test_resume_from_a_checkpoint_at_the_last_step_exports_without_training(
        tiny_dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from safetensors.torch import load_file

    settings = train_settings(tmp_path, eval_steps=8, save_steps=8, sample_steps=0)
    first = train_packed(settings, tiny_dataset)
    run_dir = first.run_dir
    exported = load_file(str(run_dir / "model.safetensors"))
    for name in ("training_metadata.json", "model.safetensors", "config.json"):  # died right after the last save
        (run_dir / name).unlink()
    checkpoints = {p: p.stat().st_mtime_ns for p in run_dir.glob("checkpoint-*/*")}
    with caplog.at_level("INFO"):
        again = train_packed(settings, tiny_dataset)
    assert again.status == "finished"
    assert "checkpoint-40 is the run's last step: going straight to the final eval and export" in caplog.text
    # no step trained again: the checkpoints are the ones the first attempt wrote, untouched
    assert {p: p.stat().st_mtime_ns for p in run_dir.glob("checkpoint-*/*")} == checkpoints
    reexported = load_file(str(run_dir / "model.safetensors"))
    assert all(torch.equal(exported[k], reexported[k]) for k in exported)
    assert again.metadata["steps"] == 40 and again.metadata["metrics"]["eval_loss"] == pytest.approx(
        first.metadata["metrics"]["eval_loss"], abs=1e-6)


def test_sigterm_while_the_final_model_is_written_says_so_and_the_same_command_completes(
        tiny_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sparknet.train import run as run_module

    real_export = run_module.export

    def export_then_sigterm(*args: object, **kwargs: object) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # systemd/Slurm stopping the job in the last seconds
        real_export(*args, **kwargs)

    monkeypatch.setattr(run_module, "export", export_then_sigterm)
    settings = train_settings(tmp_path, eval_steps=8, save_steps=8, sample_steps=0)
    stopped = train_packed(settings, tiny_dataset)
    assert stopped.status == "interrupted" and stopped.signal == signal.SIGTERM
    assert "while writing the final model" in stopped.message and "run the same command" in stopped.message
    assert not (stopped.run_dir / "training_metadata.json").exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers are put back
    monkeypatch.undo()
    again = train_packed(settings, tiny_dataset)
    assert again.status == "finished" and again.metadata["steps"] == 40


def test_our_code_reads_no_device_value_outside_logging_steps(tiny_dataset: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A device read (.item(), .cpu(), .tolist(), bool(), ...) stalls the GPU's queue: SparkNet's own code does one
    only at logging, eval and save steps. Counted by patching the tensor methods and looking for a sparknet frame in
    the direct caller (the libraries' own reads, e.g. transformers' mask checks in eager mode, are theirs)."""
    import traceback

    from transformers import TrainerCallback

    import sparknet
    from sparknet.train import run as training

    ours = str(Path(sparknet.__file__).parent)
    step = {"now": 0}
    reads: dict[int, list[str]] = {}

    def counting(name: str):
        original = getattr(torch.Tensor, name)

        def method(self, *args, **kwargs):
            caller = traceback.extract_stack(limit=2)[0]  # the code that asked for the value
            # SparkTrainer._get_num_items_in_batch counts the labels only of batches still on the host (it hands
            # device batches to the Trainer's own count): on a GPU its reads are host reads, not device reads
            host_only = caller.name == "<genexpr>" and self.device.type == "cpu" and any(
                f.name == "_get_num_items_in_batch" for f in traceback.extract_stack(limit=4))
            if step["now"] and caller.filename.startswith(ours) and not host_only:
                reads.setdefault(step["now"], []).append(f"{name} at {caller.name}:{caller.lineno}")
            return original(self, *args, **kwargs)

        return method

    for name in ("item", "cpu", "tolist", "numpy", "__bool__", "__int__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, counting(name))

    class StepNumber(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            step["now"] = state.global_step + 1

    build = training.build_trainer

    def with_step_numbers(*args, **kwargs):
        parts = build(*args, **kwargs)
        parts.trainer.add_callback(StepNumber())
        return parts

    monkeypatch.setattr(training, "build_trainer", with_step_numbers)
    train_packed(train_settings(tmp_path, target_tokens=24 * 4 * 128, global_batch_size=8, logging_steps=5,
                                eval_steps=8, save_steps=8, sample_steps=0), tiny_dataset)
    sync_points = {5, 8, 10, 12}  # logging every 5 and at the last step (12), eval and save at 8
    assert set(reads) <= sync_points, {s: r for s, r in reads.items() if s not in sync_points}
    assert reads  # the counting works: logging does read the device


def test_a_train_bin_with_ids_beyond_the_vocabulary_is_one_line(tiny_dataset: Path, tmp_path: Path) -> None:
    import shutil

    import numpy as np

    from sparknet.common.errors import UserError

    damaged = tmp_path / "ds"
    shutil.copytree(tiny_dataset, damaged)
    tokens = np.memmap(damaged / "train.bin", dtype=np.uint16, mode="r+")
    tokens[-1] = 65_535  # same size: only the ids can tell
    tokens.flush()
    with pytest.raises(UserError, match=r"train.bin holds token id 65535 .*rebuild the dataset"):
        packed_plan(str(damaged), None, None)


def test_a_config_of_another_mix_than_the_datasets_is_refused(tiny_dataset: Path, corpus_config: Path, tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """CONFIG is recorded as the run's mix: one that is not the dataset's is refused in one line naming both and the
    change, before any work; the dataset's own config (or none: then the dataset's is taken, said in a line) is
    accepted."""
    from sparknet.common.errors import UserError
    from sparknet.config.mix import load_config
    from tests.helpers import write_config

    mix = json.loads(corpus_config.read_text())["mix"]
    other = write_config(tmp_path / "other.json", [{**mix[0], "prob": 0.9}, {**mix[1], "prob": 0.1}],
                         context_length=128)
    with pytest.raises(UserError) as caught:
        packed_plan(str(tiny_dataset), None, load_config(other))
    message = str(caught.value)
    assert f"dataset {tiny_dataset} was built from another mix than CONFIG={other} (mix[0].prob: 0.6 -> 0.9; " \
           "mix[1].prob: 0.4 -> 0.1;" in message
    assert f"it was built from {corpus_config}): pass that config, or leave CONFIG out" in message
    assert packed_plan(str(tiny_dataset), None, load_config(corpus_config)).target_tokens == 10_000
    with caplog.at_level("INFO", logger="sparknet"):
        packed_plan(str(tiny_dataset), None, None)
    assert f"CONFIG not given: the mix is the dataset's, {corpus_config}" in caplog.text
    assert "\n" not in message and not (tmp_path / "ckpt").exists()  # one line, before any work


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt", "rng_state.pth", "trainer_state.json"])
def test_a_checkpoint_damaged_in_place_is_skipped_naming_the_file(finished, name: str, tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    import shutil

    result, _ = finished
    run_dir = tmp_path / "run"
    shutil.copytree(result.run_dir, run_dir)
    latest = latest_complete_checkpoint(run_dir, verify=True)
    path = latest / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2: len(data) // 2 + 64] = bytes(64)  # zeroed in place: the same size
    path.write_bytes(bytes(data))
    fallback = latest_complete_checkpoint(run_dir, verify=True)
    from sparknet.run_files import checkpoint_step

    assert fallback is not None and checkpoint_step(fallback) < checkpoint_step(latest)  # the one before
    assert f"skipping {latest}: its {name} is not the file that was saved" in caplog.text


@pytest.mark.slow
def test_resume_skips_a_damaged_checkpoint_and_matches_the_uninterrupted_run(tiny_dataset: Path,
                                                                             tmp_path: Path) -> None:
    long = dict(target_tokens=60 * 4 * 128, eval_steps=10, save_steps=10, sample_steps=0, record_batches=True,
                save_total_limit=5)
    expected = read_steps(train_packed(train_settings(tmp_path / "a", **long), tiny_dataset).run_dir / "batches.jsonl")
    args = train_args(tmp_path / "b", tiny_dataset, **long)
    run_dir = tmp_path / "b" / "ckpt" / "run"
    kill_when(run_dir / "checkpoint-30" / ".complete", start_script("train_sparknet_v5.py", args))
    weights = run_dir / "checkpoint-30" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-4000:] = bytes(4000)  # 4 kB of weights zeroed in place (a size check cannot see it)
    weights.write_bytes(bytes(data))
    resumed = run_script("train_sparknet_v5.py", *args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "its model.safetensors is not the file that was saved" in resumed.stderr
    assert f"resuming from {run_dir / 'checkpoint-20'}" in resumed.stderr
    got = read_steps(run_dir / "batches.jsonl")
    assert all((got[s]["lr"], got[s]["blocks"], got[s]["weights"]) == (
        expected[s]["lr"], expected[s]["blocks"], expected[s]["weights"]) for s in expected)


def test_a_checkpoint_that_lost_a_file_since_it_was_saved_is_skipped_naming_the_file(
        finished, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A file deleted (or cut short) after the checkpoint was marked complete: the warning names it, and does not
    say the process died while saving; only a checkpoint without its marker is said to be half-written."""
    import shutil

    from sparknet.run_files import checkpoint_step
    from sparknet.train.folders import COMPLETE_MARKER

    result, _ = finished
    run_dir = tmp_path / "run"
    shutil.copytree(result.run_dir, run_dir)
    checkpoints = sorted(run_dir.glob("checkpoint-*"), key=checkpoint_step)
    latest, before = checkpoints[-1], checkpoints[-2]
    (latest / "optimizer.pt").unlink()
    (before / "model.safetensors").write_bytes(b"cut")
    (checkpoints[-3] / COMPLETE_MARKER).unlink()
    latest_complete_checkpoint(run_dir)
    assert f"skipping {latest}: its optimizer.pt is missing (deleted since the checkpoint was saved)" in caplog.text
    size = json.loads((before / COMPLETE_MARKER).read_text())["files"]["model.safetensors"]["size"]
    assert (f"skipping {before}: its model.safetensors holds 3 bytes, {size:,} were saved (cut short since)"
            in caplog.text)
    assert f"skipping {checkpoints[-3]}: it was not completely written (the process died while saving)" \
        in caplog.text
    assert caplog.text.count("died while saving") == 1


def test_one_step_with_the_default_warmup_trains_at_a_nonzero_lr(tiny_dataset: Path, tmp_path: Path) -> None:
    """MAX_STEPS 1 with WARMUP_RATIO 0.02: the warmup rounded up to the one step trained it at LR 0 (eval loss
    6.237 -> 6.237, exit 0). The warmup leaves the last step out: that step is at the peak, and the model moves."""
    from tests.helpers import read_steps

    settings = train_settings(tmp_path, max_steps=1, target_tokens=None, warmup_ratio=0.02, record_batches=True,
                              sample_prompts=[])
    result = train_packed(settings, tiny_dataset)
    assert result.status == "finished"
    assert read_steps(result.run_dir / "batches.jsonl")[1]["lr"] == pytest.approx(settings.learning_rate)
    metrics = result.metadata["metrics"]
    assert metrics["eval_loss"] < metrics["eval_loss_start"] - 0.01, metrics
    # a longer run keeps its warmup: 2% of 100 steps is 2 steps, as transformers rounds it
    from sparknet.train.hf_trainer import warmup_steps

    assert [warmup_steps(0.02, n) for n in (1, 2, 50, 100, 101)] == [0, 1, 1, 2, 3]
