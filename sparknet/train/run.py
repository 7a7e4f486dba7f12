"""Training with the HF Trainer from a script's constants: the story both trainers share.

`train(settings, data)` reads top to bottom as its steps: check the settings, size the budget, open the run folder
(refusing a reused RUN_NAME, finding the resume point), build the Trainer, train under signal handling, then
conclude (final eval, export, metadata) according to how training ended. Where the blocks come from is the
`DataPlan` (sparknet.train.data_plan), the only thing the two trainer scripts choose differently. A run lives in
`checkpoints/<RUN_NAME>/` and `logs/<RUN_NAME>/` (sparknet.train.folders).
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import subprocess
import time
from contextlib import closing, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import default_data_collator
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from sparknet.common.errors import UserError
from sparknet.common.locks import exclusive
from sparknet.common.runtime import (
    device_info,
    follow_umask,
    process_rank,
    project_path,
    use_compute_threads,
    world_size,
    write_json_atomic,
    writes_to,
)
from sparknet.config.checks import RULES
from sparknet.model.metrics import bytes_of_tokens, perplexity, tokens_and_bytes_by_source
from sparknet.model.presets import (
    DEFAULT_PRESET,
    Preset,
    build_model,
    flops_per_token,
    get_preset,
    parameter_count,
    peak_flops,
    set_for_use,
)
from sparknet.run_files import METADATA
from sparknet.tokenizer import portable_config
from sparknet.train.batch import BatchPlan, TokenCount, budget, check_enough_blocks, plan_batch
from sparknet.train.callbacks import (
    LAYOUT,
    ComputeThreads,
    MetricsCallback,
    MetricsSpec,
    SamplingCallback,
    has_layout,
)
from sparknet.train.data_plan import DataPlan
from sparknet.train.folders import EVAL_START, RunFolder, checkpoint_context, latest_complete_checkpoint, open_run
from sparknet.train.fused_loss import fuse_head
from sparknet.train.hf_trainer import SparkTrainer, check_launch, compiles, training_arguments
from sparknet.train.init_from import (
    BASE_RECORD,
    BaseModel,
    base_preset,
    check_base,
    load_base,
    read_base_record,
    resolve_run_base,
)
from sparknet.train.periodic_benchmark import PeriodicBenchmark, suite_documents
from sparknet.train.safety import Interrupted, SafetyCallback, signals_interrupt, stop_on_signals
from sparknet.train.settings import TrainSettings, check_settings
from sparknet.train.step_speed import collector_paused, pad_head

log = logging.getLogger("sparknet.train")
# Reloading the best checkpoint reports the tied lm_head.weight as "missing": it is the token embedding, not lost.
logging.getLogger("transformers.trainer").addFilter(lambda record: "lm_head.weight" not in record.getMessage())
BATCH_LOG = "batches.jsonl"
Status = Literal["finished", "interrupted", "diverged", "already_finished"]


@dataclass
class TrainResult:
    """How a run ended: "finished", "interrupted" (a signal; checkpoint saved), "diverged" or "already_finished"."""

    status: Status
    run_dir: Path
    trainer: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    signal: int | None = None
    message: str = ""


def train(settings: TrainSettings, data: DataPlan) -> TrainResult:
    """Trains on `data`: fresh, resumed, already finished, or refused on a settings conflict."""
    started = time.time()
    check_settings(settings)
    check_launch(settings, device_info())
    run_dir = project_path(settings.checkpoints_dir) / settings.run_name
    base = resolve_run_base(settings.init_from, run_dir) if settings.init_from else None
    settings.model_preset = preset_name(settings.model_preset, base)
    preset = model_preset(settings, data, base)
    batch, target, max_steps, tokens_per_step = step_budget(settings, data.block_size, data.target_tokens)
    if data.train_blocks is not None:
        check_enough_blocks(data.train_blocks, batch.global_batch)
    log_budget(data, target, max_steps, tokens_per_step, batch)
    phase_steps = data.plan_phases(max_steps, batch)
    # one training of a RUN_NAME at a time (the main process holds the lock; the others are its own ranks)
    writes_to(run_dir.parent, project_path(settings.logs_dir))
    with exclusive(run_dir, "a training run") if process_rank() == 0 else nullcontext():
        run = open_run(settings.run_name, settings.checkpoints_dir, settings.logs_dir,
                       run_identity(settings, data, target), settings.allow_config_change, process_rank() == 0,
                       fixed=data.fixed_identity)
        data.prepare_run(run.run_dir, run.resume)
        if base is not None and run.resume is None and run.finished_metadata is None and process_rank() == 0:
            write_json_atomic(run.run_dir / BASE_RECORD, base.record())  # once, as the run starts from it
        if run.finished_metadata is not None:
            return TrainResult("already_finished", run.run_dir, metadata=run.finished_metadata)
        parts = build_trainer(settings, data, run, preset, max_steps, batch, tokens_per_step, base, phase_steps)
        with parts.writer, closing(data):
            runtime_seconds = train_steps(run, parts, max_steps)
            try:
                with signals_interrupt():
                    return conclude(settings, data, run, parts, started, runtime_seconds)
            except Interrupted as stop:  # the training is done and saved; only the final eval and export are lost
                return TrainResult("interrupted", run.run_dir, parts.trainer, signal=stop.signum, message=(
                    f"stopped by {signal.Signals(stop.signum).name} while writing the final model: the training "
                    "itself is saved; run the same command to write the final model and metadata (it trains no "
                    "more steps)"))


def step_budget(settings: TrainSettings, block_size: int, default_target: int) -> tuple[BatchPlan, int, int, int]:
    """The global batch on this many devices, the tokens to train, the optimizer steps and the tokens per step:
    TARGET_TOKENS or MAX_STEPS, else the data's `default_target`."""
    batch = plan_batch(settings.global_batch_size, settings.batch_size, world_size())
    asked = settings.tokens_asked(block_size)  # MAX_STEPS gives a whole number of steps: exactly those
    target = asked if asked is not None else default_target
    max_steps, tokens_per_step = budget(target, block_size, batch.global_batch)
    if target < tokens_per_step:  # one step would train on more than asked, all of it inside the warmup
        raise UserError(f"TARGET_TOKENS={target:,} is less than one optimizer step of {tokens_per_step:,} tokens "
                        f"(GLOBAL_BATCH_SIZE={batch.global_batch} blocks x {block_size} tokens): raise "
                        "TARGET_TOKENS or lower GLOBAL_BATCH_SIZE")
    return batch, target, max_steps, tokens_per_step


def train_steps(run: RunFolder, parts: TrainerParts, max_steps: int) -> float:
    """The Trainer's training from the resume point, under the signal handlers that save and stop; its seconds."""
    if run.resume_step >= max_steps:  # died after the last save, before the export: nothing left to train
        log.info("%s is the run's last step: going straight to the final eval and export", run.resume)
        parts.trainer.restore_finished(run.resume)
        return 0.0
    if run.resume:
        log.info("resuming from %s", run.resume)
    with stop_on_signals(parts.safety), collector_paused():
        output = parts.trainer.train(resume_from_checkpoint=str(run.resume) if run.resume else None)
    return output.metrics.get("train_runtime", 0.0)


def report_outcome(result: TrainResult, logs_dir: str) -> None:
    """A trainer script's ending: the model's place and eval loss, or exit 128+signal after a stop, or the
    divergence as an error."""
    if result.status == "interrupted":
        print(result.message)
        raise SystemExit(128 + (result.signal or 0))
    if result.status == "diverged":
        raise UserError(result.message)
    if process_rank() != 0:
        return
    m = result.metadata.get("metrics", {})
    start = m.get("eval_loss_start")
    start_text = f"{start:.3f} at start -> " if start is not None else ""
    print(f"model: {result.run_dir}  (eval loss {start_text}{m.get('eval_loss', float('nan')):.3f}; "
          f"tensorboard --logdir {logs_dir}/{result.run_dir.name})")


def preset_name(asked: str | None, base: BaseModel | None) -> str | None:
    """MODEL_PRESET as the run records it: as set; not set, the preset of INIT_FROM's shape (None for a base of a shape
    no preset has), else DEFAULT_PRESET. A set one that contradicts the base is refused by `check_base`."""
    if asked is not None:
        return asked
    if base is None:
        return DEFAULT_PRESET
    name = base_preset(base)
    if name is not None:
        log.info("MODEL_PRESET not set: %s, the shape of INIT_FROM=%s", name, base.spec)
    return name


def model_preset(settings: TrainSettings, data: DataPlan, base: BaseModel | None = None) -> Preset:
    """The model's shape: the preset's width and depth, and a context that follows the data. A model trained from
    scratch gets the blocks' length; a run that resumes keeps its model's (from its checkpoint), which must hold
    the blocks: checked here, before the run folder is touched. A run from a base model (INIT_FROM) has the base's
    shape and context (sparknet.train.init_from.check_base)."""
    preset = get_preset(settings.model_preset) if settings.model_preset is not None else None
    if not RULES["BLOCK_SIZE"].test(data.block_size):  # a dataset not built by SparkNet (the build refuses them)
        raise UserError(f"blocks of {data.block_size} token: a block needs 2 tokens or more (one to predict the next "
                        "from): use a larger BLOCK_SIZE (or context_length)")
    if base is not None:
        preset = check_base(base, settings.model_preset, data.block_size, data.tokenizer, data.tokenizer_source)
    run_dir = project_path(settings.checkpoints_dir) / settings.run_name
    saved = checkpoint_context(run_dir)
    if saved is not None and data.block_size > saved[0]:
        raise UserError(f"run {settings.run_name}'s model has a context of {saved[0]} tokens ({saved[1]}), shorter "
                        f"than the data's blocks of {data.block_size} tokens: train it on blocks of at most "
                        f"{saved[0]} tokens, or choose a new RUN_NAME")
    # runs begun before the context followed the data kept the preset's, which may be longer than their blocks
    if base is None:
        assert preset is not None  # preset_name gives one without a base
        preset = dataclasses.replace(preset, n_positions=data.block_size if saved is None else saved[0])
    if settings.sample_prompts and settings.sample_max_new_tokens >= preset.n_positions:
        raise UserError(f"SAMPLE_MAX_NEW_TOKENS={settings.sample_max_new_tokens} leaves no room for a prompt in "
                        f"the model's context of {preset.n_positions} tokens: lower it")
    return preset


def log_budget(data: DataPlan, target: int, max_steps: int, per_step: int, batch: BatchPlan) -> None:
    if batch.note:
        log.info("%s", batch.note)
    passes = (f"; {max_steps * batch.global_batch / max(data.train_blocks, 1):.2f} passes over the data"
              if data.train_blocks is not None else "")
    log.info("budget: %s tokens = %s steps x %s tokens (global batch %d blocks of %d tokens = micro-batch %d x "
             "accum %d x %d device(s))%s", f"{target:,}", f"{max_steps:,}", f"{per_step:,}", batch.global_batch,
             data.block_size, batch.micro, batch.accum, batch.devices, passes)


def run_identity(s: TrainSettings, data: DataPlan, target: int) -> dict[str, Any]:
    """What makes a run this run: settings that change the model, the data order or the optimisation. Not the
    device count: the global batch is the recipe, the same on any count (a stream's per-rank position is the data
    plan's `fixed_identity`)."""
    identity = s.identity()
    identity.update({**data.identity, "target_tokens": target})
    return identity


@dataclass
class TrainerParts:
    trainer: SparkTrainer
    writer: Any
    metrics: MetricsCallback
    safety: SafetyCallback
    n_params: int
    device: dict[str, Any]
    preset: Preset  # the model's shape, its context included
    base: BaseModel | None = None  # the model the run started from (INIT_FROM), None for a fresh one


class NullWriter:
    """Stands in for the TensorBoard writer on processes other than the main one."""

    def __getattr__(self, _name: str) -> Any:
        return lambda *args, **kwargs: None

    def __enter__(self) -> NullWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def build_trainer(s: TrainSettings, data: DataPlan, run: RunFolder, preset: Preset, max_steps: int,
                  batch: BatchPlan, tokens_per_step: int, base: BaseModel | None = None,
                  phase_steps: list[int] | None = None) -> TrainerParts:
    """The model, the Trainer and the callbacks that show and guard the run."""
    from torch.utils.tensorboard import SummaryWriter

    device = device_info()
    threads = use_compute_threads(str(device["kind"]))  # before the model: its first ops use them
    main_process = process_rank() == 0
    tokenizer = data.tokenizer
    torch.manual_seed(s.seed)
    # from a base model, its weights (a resume then loads the run's own checkpoint over them, as from scratch)
    model = (load_base(base, s.dropout) if base is not None else
             build_model(preset, len(tokenizer), tokenizer.eos_token_id, tokenizer.bos_token_id, s.dropout))
    if s.fused_cross_entropy:
        fuse_head(model)
    else:
        pad_head(model)
    args = training_arguments(s, output_dir=run.run_dir, max_steps=max_steps, batch=batch, device=device,
                              fresh=run.resume is None, data_arguments=data.trainer_arguments, phase_steps=phase_steps)
    # purge what a killed attempt logged after its checkpoint: the resumed run writes those steps again
    if main_process:
        logged_layout = has_layout(run.log_dir)  # before the writer makes its own event file
        writer = SummaryWriter(str(run.log_dir), purge_step=run.resume_step + 1 if run.resume else None)
        if not logged_layout:  # once per run, so that a resume adds no second one
            writer.add_custom_scalars(LAYOUT)
            writer.flush()
    else:
        writer = NullWriter()
    batch_log = run.run_dir / (BATCH_LOG if main_process else f"batches.rank{process_rank()}.jsonl")
    # default_data_collator only stacks the fixed-size blocks: nothing is padded, so nothing is masked as padding
    trainer = SparkTrainer(model=model, args=args, train_dataset=data.train, eval_dataset=data.eval_dataset(),
                           processing_class=tokenizer, data_collator=default_data_collator, nonfinite=s.nonfinite,
                           batch_log=batch_log if s.record_batches else None,
                           settings=s,
                           global_batch=batch.global_batch, phase_steps=phase_steps,
                           source_labels=data.source_labels if data.val_sources is not None else None)
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    bf16 = bool(device["bf16"])
    peak = s.peak_tflops * 1e12 if s.peak_tflops > 0 else (
        peak_flops(str(device["name"]), "bf16" if bf16 else "fp32") if device["kind"] == "cuda" else None)
    if peak is None and device["kind"] == "cuda":
        log.warning("no peak FLOP/s known for %s: set PEAK_TFLOPS to see MFU", device["name"])
    predicted = data.val_tokens[:, 1:]  # bits per byte over what the loss averages: all tokens but each block's first
    by_source = (tokens_and_bytes_by_source(tokenizer, predicted, data.val_sources[:, 1:], data.source_labels)
                 if data.val_sources is not None else None)
    spec = MetricsSpec(tokens_per_step=tokens_per_step, block_size=data.block_size,
                       flops_per_token=flops_per_token(preset, len(tokenizer), data.block_size), peak_flops=peak,
                       world_size=world_size(), eval_tokens=int(predicted.size),
                       eval_bytes=bytes_of_tokens(tokenizer, predicted), device_kind=str(device["kind"]),
                       compile_warmup=compiles(s, device), eval_sources=by_source or {})
    metrics = MetricsCallback(spec=spec, writer=writer, grad_norms=trainer.grad_norms,
                              start_file=run.run_dir / EVAL_START if main_process else None,
                              logged_eval_steps={run.resume_step} if run.resume else None)
    sampler = SamplingCallback(tokenizer, s, run.run_dir, writer, metrics)
    safety = SafetyCallback(trainer)
    # safety last: it marks checkpoints complete
    # the threads again as the load changes, where SparkNet chose them (not OMP_NUM_THREADS)
    rethread = [ComputeThreads()] if "busy with other work" in threads and not compiles(s, device) else []
    for callback in (TokenCount(tokens_per_step), metrics, sampler, *benchmark(s, data, run, writer),
                     *data.callbacks(writer), *rethread, safety):
        trainer.add_callback(callback)
    n_params = parameter_count(preset, len(tokenizer))
    log.info("model %s: %s parameters, vocab %d, context %d; device %s (%s)%s%s", s.model_preset, f"{n_params:,}",
             len(tokenizer), preset.n_positions, device["name"], "bf16" if bf16 else "fp32",
             f", {threads}" if threads else "", "; torch.compile on" if compiles(s, device) else "")
    if base is not None:
        log.info("starting from %s (%s): its weights, with a fresh optimizer, LR schedule and data position",
                 base.spec, base.name)
    log.info("outputs: %s  |  tensorboard --logdir %s", run.run_dir, run.log_dir)
    return TrainerParts(trainer, writer, metrics, safety, n_params, device, preset, base)


def benchmark(s: TrainSettings, data: DataPlan, run: RunFolder, writer: Any) -> list[PeriodicBenchmark]:
    """BENCHMARK_EVERY's callback (none when 0), its offline suite made from the validation blocks."""
    if not s.benchmark_every:
        return []
    return [PeriodicBenchmark(every=s.benchmark_every, tasks=list(s.benchmark_tasks), limit=s.benchmark_limit,
                              writer=writer, tokenizer=data.tokenizer,
                              suite_texts=suite_documents(data.tokenizer, data.val_tokens), run_dir=run.run_dir)]


def conclude(s: TrainSettings, data: DataPlan, run: RunFolder, parts: TrainerParts, started: float,
             runtime_seconds: float) -> TrainResult:
    """The outcome: diverged or interrupted (nothing exported), or finished (final eval, export, metadata)."""
    trainer, safety = parts.trainer, parts.safety
    step = trainer.state.global_step
    if safety.diverged_at is not None:
        good = latest_complete_checkpoint(run.run_dir, verify=True)
        return TrainResult("diverged", run.run_dir, trainer, message=(
            f"training stopped: non-finite loss or grad norm at step {safety.diverged_at}; the last good checkpoint "
            f"is {good or 'none'}. Start a new RUN_NAME with a lower LEARNING_RATE or MAX_GRAD_NORM, or set "
            "NONFINITE=skip to skip such updates"))
    if safety.stop_signal is not None:
        return TrainResult("interrupted", run.run_dir, trainer, signal=safety.stop_signal, message=(
            f"stopped at step {step}: checkpoint saved in {run.run_dir / f'checkpoint-{step}'}; run the same command "
            "to resume"))
    if 0 < trainer.state.max_steps and step < trainer.state.max_steps:  # the stream's sources all ran dry first
        log.warning("the run ended at step %d of %d: its training data ran out (said above); the model and its "
                    "metadata are of step %d", step, trainer.state.max_steps, step)
    final_eval = trainer.evaluate()["eval_loss"]
    export(trainer, data.tokenizer, run.run_dir)
    metadata = run_metadata(s, data, run, parts, final_eval)
    metadata.update(wall_seconds=round(time.time() - started, 1), train_runtime_seconds=round(runtime_seconds, 1))
    if process_rank() == 0:
        write_json_atomic(run.run_dir / METADATA, metadata)
    return TrainResult("finished", run.run_dir, trainer, metadata=metadata)


def export(trainer: SparkTrainer, tokenizer: Any, out_dir: Path) -> None:
    """Saves the (best) model and its tokenizer for `from_pretrained`, configured for use (`set_for_use`: a pad
    token, the KV cache on)."""
    set_for_use(trainer.model, tokenizer)
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    if trainer.is_fsdp_enabled and plugin is not None and "FULL_STATE_DICT" not in str(plugin.state_dict_type):
        # checkpoints stay sharded (fast to save and resume), but a SHARDED_STATE_DICT save_model writes no weights
        # (transformers issue 30491): the export gathers the full weights for from_pretrained
        plugin.set_state_dict_type("FULL_STATE_DICT")
    trainer.save_model(str(out_dir))
    if process_rank() == 0:
        follow_umask(out_dir)  # safetensors writes 0600
    if process_rank() == 0 and (out_dir / "tokenizer_config.json").is_file():
        portable_config(out_dir)


def run_metadata(s: TrainSettings, data: DataPlan, run: RunFolder, parts: TrainerParts,
                 final_eval: float) -> dict[str, Any]:
    trainer, metrics = parts.trainer, parts.metrics
    tokenizer = data.tokenizer
    step = trainer.state.global_step
    train_losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    mean = metrics.mean_tokens_per_second
    # None for a base model of a shape no preset has (INIT_FROM's, MODEL_PRESET ignored)
    same_shape = s.model_preset is not None and dataclasses.replace(
        get_preset(s.model_preset), n_positions=parts.preset.n_positions) == parts.preset
    preset_name = s.model_preset if same_shape else None
    return {
        "run_name": s.run_name,
        "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(s).items()},
        **data.metadata(),
        "tokenizer": {"path": data.tokenizer_source, "vocab_size": len(tokenizer),
                      "eos_token_id": tokenizer.eos_token_id},
        "model": {"name": preset_name, **dataclasses.asdict(parts.preset), "vocab_size": len(tokenizer),
                  "parameters": parts.n_params},
        "steps": step,
        # the model it started from and the commit or weights hash it was (INIT_FROM), as recorded when the run
        # started (a resume may go on without the base); None: trained from scratch
        "base_model": read_base_record(run.run_dir) or (parts.base.record() if parts.base is not None else None),
        "tokens_seen": trainer.state.num_input_tokens_seen,  # counted step by step (TokenCount), resumes included
        "world_size": world_size(),
        "metrics": {
            "train_loss": metrics.last_train.get("loss", train_losses[-1] if train_losses else None),
            "eval_loss_start": run.initial_eval(),
            "eval_loss": final_eval,
            "eval_perplexity": perplexity(final_eval),
            "eval_bits_per_byte": metrics.last_eval.get("bits_per_byte"),
            # per mix source, over the predicted tokens of that source: {label: {"loss", "bits_per_byte", "tokens"}}
            "eval_per_source": metrics.last_eval_per_source,
            "best_checkpoint": trainer.state.best_model_checkpoint,
            # global (all devices), training time only; the mean covers this process's training, warm-up excluded
            "tokens_per_second": metrics.last_train.get("tokens_per_second"),
            "tokens_per_second_mean": round(mean, 1) if mean else None,
        },
        "device": parts.device,
        "versions": _versions(),
        "git_commit": _git_commit(),
    }


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=project_path("."), capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _versions() -> dict[str, str]:
    import datasets
    import transformers

    import sparknet

    return {"torch": torch.__version__, "transformers": transformers.__version__, "datasets": datasets.__version__,
            "sparknet": sparknet.__version__}
