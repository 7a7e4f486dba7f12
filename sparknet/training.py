"""Training with the HF Trainer from a script's constants: arguments, run-folder guard, resume, signals, metadata.

Where the blocks come from (the packed dataset here) is the only thing a trainer script decides; everything else is
shared. A run lives in `checkpoints/<RUN_NAME>/` (Trainer checkpoints, samples, the final model) and
`logs/<RUN_NAME>/` (one TensorBoard stream).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import Trainer, TrainingArguments, default_data_collator
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from sparknet.callbacks import COMPLETE_MARKER, MetricsCallback, SafetyCallback, SamplingCallback
from sparknet.config import MixConfig, describe_changes
from sparknet.data.build import tokenizer_fingerprint
from sparknet.data.packed import PackedDataset, write_json_atomic
from sparknet.errors import UserError
from sparknet.evaluation import perplexity, utf8_bytes
from sparknet.model import build_model, flops_per_token, get_preset, parameter_count, peak_flops, preset_dict
from sparknet.runtime import device_info, project_path

log = logging.getLogger("sparknet.train")
# Reloading the best checkpoint reports the tied lm_head.weight as "missing": it is the token embedding, not lost.
logging.getLogger("transformers.trainer").addFilter(lambda record: "lm_head.weight" not in record.getMessage())
RUN_CONFIG = "run_config.json"
METADATA = "training_metadata.json"
BATCH_LOG = "batches.jsonl"
# Settings that change neither the model nor the order of the data nor the optimisation: they may differ on resume.
NON_IDENTITY = {"run_name", "eval_steps", "save_steps", "save_total_limit", "sample_steps", "sample_prompts",
                "sample_max_new_tokens", "sample_temperature", "sample_top_k", "sample_seed", "logging_steps",
                "compile", "allow_config_change", "record_batches", "peak_tflops", "nonfinite", "checkpoints_dir",
                "logs_dir"}


@dataclass
class TrainSettings:
    """A trainer script's constants, lower-cased."""

    run_name: str
    dataset_dir: str
    tokenizer_dir: str | None = None
    model_preset: str = "sparknet-70m"
    target_tokens: int | None = None
    batch_size: int = 32
    grad_accum: int = 4
    learning_rate: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_ratio: float = 0.02
    weight_decay: float = 0.1
    adam_betas: tuple[float, float] = (0.9, 0.95)
    max_grad_norm: float = 1.0
    dropout: float = 0.0
    eval_steps: int = 500
    save_steps: int = 1000
    save_total_limit: int = 3
    sample_steps: int = 1000
    sample_prompts: list[str] = field(default_factory=lambda: ["The meaning of"])
    sample_max_new_tokens: int = 64
    sample_temperature: float = 0.8
    sample_top_k: int = 50
    sample_seed: int = 1234
    logging_steps: int = 10
    compile: str = "auto"
    seed: int = 42
    peak_tflops: float = 0.0
    nonfinite: str = "stop"
    allow_config_change: bool = False
    record_batches: bool = False
    checkpoints_dir: str = "checkpoints"
    logs_dir: str = "logs"

    @classmethod
    def from_constants(cls, constants: dict[str, Any]) -> TrainSettings:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k.lower(): v for k, v in constants.items() if k.lower() in names})


@dataclass
class TrainResult:
    """How a run ended: "finished", "interrupted" (a signal; checkpoint saved), "diverged" or "already_finished"."""

    status: str
    run_dir: Path
    trainer: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    signal: int | None = None
    message: str = ""


class SparkTrainer(Trainer):
    """The HF Trainer plus per-step bookkeeping kept on the device: pre-clip grad norms, the first non-finite step,
    and (when asked) a log of each step's LR and blocks for checking that a resumed run matches."""

    def __init__(self, *args: Any, nonfinite: str = "stop", batch_log: Path | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.nonfinite = nonfinite
        self.grad_norms: list[tuple[int, Any]] = []
        self._first_bad: torch.Tensor | None = None
        self.batch_log = batch_log
        self._step_blocks: list[list[int]] = []

    def _observe(self, value: torch.Tensor, step: int) -> None:
        value = value.detach()
        if self._first_bad is None:
            self._first_bad = torch.full((), -1, dtype=torch.long, device=value.device)
        bad = ~torch.isfinite(value.float()).all()
        self._first_bad = torch.where(bad & (self._first_bad < 0), torch.full_like(self._first_bad, step),
                                      self._first_bad)

    def first_nonfinite_step(self) -> int | None:
        """The first step with a non-finite loss or grad norm so far (one device read), or None."""
        if self._first_bad is None:
            return None
        step = int(self._first_bad.item())
        return step if step >= 0 else None

    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
        if self.batch_log is not None:
            self._step_blocks += inputs["input_ids"][:, :8].tolist()
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._observe(loss, self.state.global_step + 1)
        return loss

    def _get_grad_norm(self, model: Any, grad_norm: Any = None) -> Any:
        norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        step = self.state.global_step + 1
        if isinstance(norm, torch.Tensor):
            self.grad_norms.append((step, norm.detach()))
            self._observe(norm, step)
            if self.nonfinite == "skip" and not bool(torch.isfinite(norm)):  # a sync per step, in skip mode only
                log.warning("non-finite grad norm at step %d: update skipped", step)
                for p in model.parameters():
                    p.grad = None
        if self.batch_log is not None:
            with self.batch_log.open("a") as f:
                lr = self.optimizer.param_groups[0]["lr"]
                f.write(json.dumps({"step": step, "lr": lr, "blocks": self._step_blocks}) + "\n")
            self._step_blocks = []
        return norm


class NullWriter:
    """Stands in for the TensorBoard writer on processes other than the main one."""

    def __getattr__(self, _name: str) -> Any:
        return lambda *args, **kwargs: None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=project_path("."), capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def latest_complete_checkpoint(run_dir: Path) -> Path | None:
    """The highest-step checkpoint that was fully written (has the completion marker); half-written ones are
    skipped with a warning."""
    found = []
    for path in run_dir.glob("checkpoint-*"):
        suffix = path.name.split("-", 1)[1]
        if path.is_dir() and suffix.isdigit():
            found.append((int(suffix), path))
    for _step, path in sorted(found, reverse=True):
        if (path / COMPLETE_MARKER).is_file():
            return path
        log.warning("skipping %s: it was not completely written (the process died while saving)", path)
    return None


def _check_settings(s: TrainSettings) -> None:
    if not s.run_name or "/" in s.run_name or s.run_name.startswith("."):
        raise UserError(f"RUN_NAME={s.run_name!r}: expected a plain folder name such as sparknet-70m-v5")
    for name in ("batch_size", "grad_accum", "eval_steps", "save_steps", "logging_steps", "save_total_limit"):
        if getattr(s, name) <= 0:
            raise UserError(f"{name.upper()}={getattr(s, name)}: expected a positive integer")
    if s.target_tokens is not None and s.target_tokens <= 0:
        raise UserError(f"TARGET_TOKENS={s.target_tokens}: expected a positive number of tokens")
    if not (math.isfinite(s.learning_rate) and s.learning_rate > 0):
        raise UserError(f"LEARNING_RATE={s.learning_rate}: expected a positive number")
    if s.sample_steps < 0 or s.max_grad_norm < 0 or not 0 <= s.dropout < 1:
        raise UserError(f"SAMPLE_STEPS={s.sample_steps}, MAX_GRAD_NORM={s.max_grad_norm}, DROPOUT={s.dropout}: "
                        "expected SAMPLE_STEPS >= 0, MAX_GRAD_NORM >= 0 and DROPOUT in [0, 1)")
    if s.save_steps % s.eval_steps:
        raise UserError(f"SAVE_STEPS={s.save_steps} must be a multiple of EVAL_STEPS={s.eval_steps} (the best "
                        "checkpoint is chosen on eval loss)")
    if not 0 <= s.warmup_ratio < 1:
        raise UserError(f"WARMUP_RATIO={s.warmup_ratio}: expected a fraction in [0, 1)")
    if not 0 <= s.min_lr_ratio <= 1:
        raise UserError(f"MIN_LR_RATIO={s.min_lr_ratio}: expected a fraction in [0, 1]")
    if s.compile not in ("auto", "on", "off"):
        raise UserError(f"COMPILE={s.compile!r}: expected auto, on or off")
    if s.nonfinite not in ("stop", "skip"):
        raise UserError(f"NONFINITE={s.nonfinite!r}: expected stop or skip")
    if len(s.adam_betas) != 2 or not all(0 <= b < 1 for b in s.adam_betas):
        raise UserError(f"ADAM_BETAS={list(s.adam_betas)}: expected two numbers in [0, 1)")


def budget(target_tokens: int, block: int, batch: int, accum: int, world: int) -> tuple[int, int]:
    """(optimizer steps, tokens per step) for a token budget: steps = ceil(target / tokens per step)."""
    per_step = block * batch * accum * world
    return math.ceil(target_tokens / per_step), per_step


def train_packed(s: TrainSettings, config: MixConfig | None = None) -> TrainResult:
    """Trains on a packed dataset (scripts/build_dataset_v5.py): fresh, resumed, or refused on a config conflict.

    `config`, the script's CONFIG, is checked against the mix the dataset was built from."""
    from sparknet.tokenizer import load_tokenizer

    _check_settings(s)
    started = time.time()
    train_ds = PackedDataset(s.dataset_dir, "train")
    val_ds = PackedDataset(s.dataset_dir, "val")
    manifest = train_ds.manifest
    if config is not None and config.to_dict()["mix"] != manifest["config"]["mix"]:
        log.warning("dataset %s was built from another mix than CONFIG=%s (%s): the metadata records the dataset's",
                    train_ds.folder, config.path, manifest["config"]["path"])
    tokenizer_source = s.tokenizer_dir or manifest["tokenizer"]["path"]
    tokenizer = load_tokenizer(tokenizer_source)
    if tokenizer_fingerprint(tokenizer_source, tokenizer) != manifest["tokenizer"]["sha256"]:
        raise UserError(f"tokenizer {tokenizer_source} is not the one dataset {train_ds.folder} was built with "
                        f"({manifest['tokenizer']['path']}, sha256 {manifest['tokenizer']['sha256'][:12]}...): "
                        "rebuild the dataset with this tokenizer, or point TOKENIZER_DIR at the original one")
    if len(val_ds) == 0:
        raise UserError(f"dataset {val_ds.folder} has no validation blocks: rebuild it with VAL_TOKENS > 0")
    preset = get_preset(s.model_preset)
    block = train_ds.block_size
    if block > preset.n_positions:
        raise UserError(f"the dataset's blocks of {block} tokens exceed {s.model_preset}'s context of "
                        f"{preset.n_positions}: rebuild the dataset with a smaller BLOCK_SIZE")

    device = device_info()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    target = s.target_tokens if s.target_tokens is not None else manifest["config"]["target_tokens"]
    max_steps, tokens_per_step = budget(target, block, s.batch_size, s.grad_accum, world)
    epochs = max_steps * s.batch_size * s.grad_accum * world / max(len(train_ds), 1)
    log.info("budget: %s tokens = %s steps x %s tokens (%d blocks x %d tokens x %d accum x %d device(s)); "
             "%.2f passes over %s", f"{target:,}", f"{max_steps:,}", f"{tokens_per_step:,}", s.batch_size, block,
             s.grad_accum, world, epochs, train_ds.folder)

    run_dir = project_path(s.checkpoints_dir) / s.run_name
    log_dir = project_path(s.logs_dir) / s.run_name
    identity = {k: v for k, v in dataclasses.asdict(s).items() if k not in NON_IDENTITY}
    identity.update({"adam_betas": list(s.adam_betas), "dataset_inputs": manifest.get("inputs"),
                     "target_tokens": target, "world_size": world})
    resume = None
    main_process = int(os.environ.get("RANK", "0")) == 0  # under torchrun, one process writes the run's files
    if (run_dir / RUN_CONFIG).is_file():
        previous = json.loads((run_dir / RUN_CONFIG).read_text())
        changes = describe_changes(previous, identity, upper=True)
        if changes and not s.allow_config_change:
            raise UserError(f"run {s.run_name} exists with other settings ({'; '.join(changes)}). Choose a new "
                            "RUN_NAME, or pass --allow_config_change true to continue it with the new settings")
        if changes:
            log.warning("continuing run %s with changed settings (%s); the checkpoint's optimizer and LR-scheduler "
                        "state are restored as saved, so a changed peak LR does not take effect", s.run_name,
                        "; ".join(changes))
        if (run_dir / METADATA).is_file():
            log.info("run %s already finished (%s): choose a new RUN_NAME to train again", s.run_name,
                     run_dir / METADATA)
            return TrainResult("already_finished", run_dir, metadata=json.loads((run_dir / METADATA).read_text()))
        resume = latest_complete_checkpoint(run_dir)
    elif main_process and run_dir.exists() and any(run_dir.iterdir()):  # other ranks may see it being created
        raise UserError(f"{run_dir} exists but is not a SparkNet run (no {RUN_CONFIG}): choose another RUN_NAME")
    if main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        if resume is None and log_dir.exists():
            shutil.rmtree(log_dir)  # a fresh start: events of an attempt that never saved a checkpoint are void
        write_json_atomic(run_dir / RUN_CONFIG, identity)

    torch.manual_seed(s.seed)
    model = build_model(preset, len(tokenizer), tokenizer.eos_token_id, tokenizer.bos_token_id, s.dropout)
    n_params = parameter_count(preset, len(tokenizer))
    cuda = device["kind"] == "cuda"
    bf16 = bool(device["bf16"])
    compile_model = s.compile == "on" or (s.compile == "auto" and cuda)
    args = TrainingArguments(
        output_dir=str(run_dir),
        max_steps=max_steps,
        per_device_train_batch_size=s.batch_size,
        per_device_eval_batch_size=s.batch_size,
        gradient_accumulation_steps=s.grad_accum,
        learning_rate=s.learning_rate,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": s.min_lr_ratio},
        warmup_steps=s.warmup_ratio,
        weight_decay=s.weight_decay,
        adam_beta1=s.adam_betas[0],
        adam_beta2=s.adam_betas[1],
        max_grad_norm=s.max_grad_norm,
        optim="adamw_torch_fused" if cuda else "adamw_torch",
        bf16=bf16,
        tf32=bool(device["tf32"]) or None,
        torch_compile=compile_model,
        eval_strategy="steps",
        eval_steps=s.eval_steps,
        save_strategy="steps",
        save_steps=s.save_steps,
        save_total_limit=s.save_total_limit,
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
        greater_is_better=False,
        prediction_loss_only=True,
        logging_strategy="steps",
        logging_steps=s.logging_steps,
        logging_nan_inf_filter=s.nonfinite == "skip",
        report_to="none",
        disable_tqdm=True,
        seed=s.seed,
        data_seed=s.seed,
        dataloader_pin_memory=cuda,
        # Reading from the memmap in the main process costs under 1% of a 70M step even on an H100 (bench:
        # ~20,000 random batches/s), and no worker processes means none for Ctrl-C to kill mid-save.
        dataloader_num_workers=0,
        use_cpu=device["kind"] == "cpu",
    )
    from torch.utils.tensorboard import SummaryWriter

    # purge what a killed attempt logged after its checkpoint: the resumed run writes those steps again
    writer = (SummaryWriter(str(log_dir), purge_step=int(resume.name.split("-")[1]) + 1 if resume else None)
              if main_process else NullWriter())
    # bits per byte over what the loss averages: every token of a block but the first is predicted
    predicted = np.asarray(val_ds.tokens)[:, 1:]
    eval_bytes = utf8_bytes(tokenizer, predicted)
    # default_data_collator only stacks the fixed-size blocks: nothing is padded, so nothing is masked as padding
    batch_log = BATCH_LOG if main_process else f"batches.rank{os.environ['RANK']}.jsonl"
    trainer = SparkTrainer(model=model, args=args, train_dataset=train_ds, eval_dataset=val_ds,
                           processing_class=tokenizer, data_collator=default_data_collator, nonfinite=s.nonfinite,
                           batch_log=run_dir / batch_log if s.record_batches else None)
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    peak = s.peak_tflops * 1e12 if s.peak_tflops > 0 else (
        peak_flops(str(device["name"]), "bf16" if bf16 else "fp32") if cuda else None)
    metrics = MetricsCallback(writer, tokens_per_step, block, flops_per_token(preset, len(tokenizer), block), peak,
                              world, trainer.grad_norms, int(predicted.size), eval_bytes, str(device["kind"]))
    sampler = SamplingCallback(tokenizer, list(s.sample_prompts), s.sample_steps, run_dir, writer, metrics,
                               s.sample_max_new_tokens, s.sample_temperature, s.sample_top_k, s.sample_seed)
    safety = SafetyCallback(trainer)
    for cb in (metrics, sampler, safety):
        trainer.add_callback(cb)

    log.info("model %s: %s parameters, vocab %d, context %d; device %s (%s)%s", s.model_preset, f"{n_params:,}",
             len(tokenizer), preset.n_positions, device["name"], "bf16" if bf16 else "fp32",
             "; torch.compile on" if compile_model else "")
    log.info("outputs: %s  |  tensorboard --logdir %s", run_dir, log_dir)
    start_file = run_dir / "eval_start.json"
    if resume is None:
        initial_eval = trainer.evaluate()["eval_loss"]
        if main_process:
            write_json_atomic(start_file, {"eval_loss": initial_eval})
    else:
        log.info("resuming from %s", resume)
        initial_eval = json.loads(start_file.read_text())["eval_loss"] if start_file.is_file() else None

    previous_handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def on_signal(signum: int, _frame: Any) -> None:
        log.warning("received %s: saving a checkpoint at the end of this step, then stopping (again to abort)",
                    signal.Signals(signum).name)
        safety.request_stop(signum)
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)

    for sig in previous_handlers:
        signal.signal(sig, on_signal)
    try:
        output = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    finally:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
        writer.flush()

    step = trainer.state.global_step
    if safety.diverged_at is not None:
        good = latest_complete_checkpoint(run_dir)
        writer.close()
        return TrainResult("diverged", run_dir, trainer, message=(
            f"training stopped: non-finite loss or grad norm at step {safety.diverged_at}; the last good checkpoint "
            f"is {good or 'none'}. Start a new RUN_NAME with a lower LEARNING_RATE or MAX_GRAD_NORM, or set "
            "NONFINITE=skip to skip such updates"))
    if safety.stop_signal is not None:
        writer.close()
        return TrainResult("interrupted", run_dir, trainer, signal=safety.stop_signal, message=(
            f"stopped at step {step}: checkpoint saved in {run_dir / f'checkpoint-{step}'}; run the same command "
            "to resume"))

    final_eval = trainer.evaluate()["eval_loss"]
    trainer.save_model(str(run_dir))
    metadata = {
        "run_name": s.run_name,
        "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(s).items()},
        "config": manifest["config"],
        "dataset": {"path": str(train_ds.folder), "inputs": manifest.get("inputs"),
                    "realised_mixture": {k: v["sources"] for k, v in manifest["splits"].items()}},
        "tokenizer": {"path": tokenizer_source, "vocab_size": len(tokenizer), "eos_token_id": tokenizer.eos_token_id},
        "model": {**preset_dict(s.model_preset), "vocab_size": len(tokenizer), "parameters": n_params},
        "steps": step,
        "tokens_seen": step * tokens_per_step,
        "metrics": {
            "train_loss": metrics.last_train.get("loss"),
            "eval_loss_start": initial_eval,
            "eval_loss": final_eval,
            "eval_perplexity": perplexity(final_eval),
            "eval_bits_per_byte": metrics.last_eval.get("bits_per_byte"),
            "best_checkpoint": trainer.state.best_model_checkpoint,
            "tokens_per_second": metrics.last_train.get("tokens_per_second"),
        },
        "device": device,
        "wall_seconds": round(time.time() - started, 1),
        "train_runtime_seconds": round(output.metrics.get("train_runtime", 0.0), 1),
        "versions": _versions(),
        "git_commit": _git_commit(),
    }
    if main_process:
        write_json_atomic(run_dir / METADATA, metadata)
    writer.close()
    return TrainResult("finished", run_dir, trainer, metadata=metadata)


def _versions() -> dict[str, str]:
    import datasets
    import transformers

    import sparknet

    return {"torch": torch.__version__, "transformers": transformers.__version__, "datasets": datasets.__version__,
            "sparknet": sparknet.__version__}
