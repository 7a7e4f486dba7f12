"""The HF Trainer as SparkNet runs it: `TrainingArguments` from the settings, and a Trainer subclass that keeps
per-step bookkeeping on the device (pre-clip grad norms, the first non-finite step) and, when asked, a log of each
step's LR, blocks and weights for checking resume and data parallelism; and, when the validation blocks carry the
source of each token, the eval loss per source (packing joins documents of several sources in one block, so the
loss is split per token, not per block)."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from sparknet.common.errors import UserError
from sparknet.config.mix import phase_ends
from sparknet.train.batch import BatchPlan, GlobalBatchSampler
from sparknet.train.safety import SafetyCallback
from sparknet.train.settings import TrainSettings
from sparknet.train.step_speed import CountedParameters, StepSpeed

log = logging.getLogger("sparknet.train")


def training_arguments(settings: TrainSettings, *, output_dir: Path, max_steps: int, batch: BatchPlan,
                       device: dict[str, Any], fresh: bool, data_arguments: dict[str, Any] | None = None,
                       phase_steps: list[int] | None = None) -> TrainingArguments:
    """The Trainer's arguments: the global batch as micro-batches and accumulation on this many devices,
    cosine-with-floor LR, AdamW (fused on CUDA), bf16/TF32 where the GPU has them, periodic eval and save, the best
    checkpoint (eval loss) kept and reloaded at the end; plus those the data plan needs (`data_arguments`)."""
    cuda = device["kind"] == "cuda"
    return TrainingArguments(
        output_dir=str(output_dir),
        max_steps=max_steps,
        per_device_train_batch_size=batch.micro,
        per_device_eval_batch_size=batch.micro,
        gradient_accumulation_steps=batch.accum,
        learning_rate=settings.learning_rate,
        **lr_schedule(settings, max_steps, phase_steps),
        warmup_steps=warmup_steps(settings.warmup_ratio, max_steps),
        weight_decay=settings.weight_decay,
        adam_beta1=settings.adam_betas[0],
        adam_beta2=settings.adam_betas[1],
        max_grad_norm=settings.max_grad_norm,
        # read by OPTIMIZER=adamw only (sparknet.model.optimizers)
        optim="adamw_torch_fused" if cuda else "adamw_torch",
        bf16=bool(device["bf16"]),
        tf32=bool(device["tf32"]) or None,
        torch_compile=compiles(settings, device),
        # The step-0 eval runs inside train(), after the model is wrapped for data parallelism: an evaluate()
        # before train() makes accelerate prepare the model for evaluation, and train() then never wraps it in DDP.
        eval_on_start=fresh,
        eval_strategy="steps",
        eval_steps=settings.eval_steps,
        save_strategy="steps",
        save_steps=settings.save_steps,
        save_total_limit=settings.save_total_limit,
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
        greater_is_better=False,
        prediction_loss_only=True,
        logging_strategy="steps",
        logging_steps=settings.logging_steps,
        logging_nan_inf_filter=settings.nonfinite == "skip",
        report_to="none",
        disable_tqdm=True,
        seed=settings.seed,
        data_seed=settings.seed,
        dataloader_pin_memory=cuda,
        # batches go to the GPU without the host waiting for the GPU's queue: a blocking copy from pinned memory
        # synchronises the stream at every micro-batch, so the Trainer's Python work is no longer hidden
        accelerator_config={"non_blocking": cuda},
        # Reading from the memmap in the main process costs under 1% of a 70M step even on an H100 (bench:
        # ~20,000 random batches/s), and no worker processes means none for Ctrl-C to kill mid-save.
        dataloader_num_workers=0,
        use_cpu=device["kind"] == "cpu",
        ddp_find_unused_parameters=False,  # every parameter gets a gradient: skip DDP's extra graph traversal
        ddp_timeout=collective_timeout_s(),
        # the validation items carry their tokens' sources and their index (SourcedBlocks): the default would drop
        # every key the model's forward does not take; SparkTrainer.compute_loss takes them off before the forward
        remove_unused_columns=False,
        **(data_arguments or {}),
    )


def collective_timeout_s() -> int:
    """How long a process waits for the others at a collective: the Trainer's 30 minutes, or longer where a Hub
    source may be retried for longer (HUB_RETRY_MINUTES), since the other processes wait at the step's agreement
    meanwhile (SparkTrainer.get_batch_samples) and would otherwise time out first."""
    from sparknet.data.source import hub_retries

    return max(1800, int(hub_retries.HUB_RETRY_SECONDS) + 600)


def fsdp_launched() -> bool:
    """Whether `accelerate launch` was given an FSDP config (distributed_type FSDP: configs/accelerate_fsdp.yaml)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def check_launch(settings: TrainSettings, device: dict[str, Any]) -> None:
    """Refuses, before anything is written, a launch that would not run as asked: FSDP off CUDA (accelerate then
    runs plain data parallelism without a word), Muon under FSDP (its update orthogonalises whole matrices, and
    FSDP gives each process a shard of each), FUSED_CROSS_ENTROPY without its package, COMPILE or
    FUSED_CROSS_ENTROPY on a CPU without a C++ compiler, or EMBEDDING_LEARNING_RATE with an optimizer that does not
    read it."""
    from sparknet.model.optimizers import OPTIMIZERS

    choice = OPTIMIZERS[settings.optimizer]
    if settings.embedding_learning_rate is not None and "embedding_learning_rate" not in choice.settings:
        raise UserError(f"EMBEDDING_LEARNING_RATE={settings.embedding_learning_rate:g} with OPTIMIZER="
                        f"{settings.optimizer}, which trains the embedding at LEARNING_RATE: set OPTIMIZER=muon, or "
                        "EMBEDDING_LEARNING_RATE=None")
    if settings.fused_cross_entropy:
        from sparknet.train.fused_loss import linear_cross_entropy

        linear_cross_entropy()  # the package's absence is one line now, not after the run folder is made
    # on a CPU, torch.compile's inductor builds C++ kernels (the fused loss's CPU implementation is compiled too):
    # without a compiler the first step failed in a long traceback, after the run folder was made.
    # (setting, its value here, the value that turns it off)
    wants = [want for want, on in ((("COMPILE", "on", "off"), compiles(settings, device)),
                                   (("FUSED_CROSS_ENTROPY", "True", "False"), settings.fused_cross_entropy)) if on]
    if device["kind"] == "cpu" and wants and (missing := _no_cpp_compiler()):
        raise UserError(f"{' and '.join(f'{name}={value}' for name, value, _ in wants)} on a CPU need a C++ "
                        f"compiler (torch.compile builds its CPU kernels with one), and {missing}: install one (e.g. "
                        "`apt install g++`) or point CXX at it, or set "
                        f"{' and '.join(f'{name}={off}' for name, _, off in wants)}")
    if not fsdp_launched():
        return
    if device["kind"] != "cuda":
        raise UserError(f"an FSDP launch (accelerate config distributed_type: FSDP) on a machine without CUDA GPUs "
                        f"({device['name']}): accelerate would run plain data parallelism instead. Launch with "
                        "`torchrun --nproc_per_node N` or `accelerate launch --multi_gpu --num_processes N` here")
    if why := choice.not_under_fsdp:
        raise UserError(f"OPTIMIZER={settings.optimizer} under FSDP: {why}. Use OPTIMIZER=adamw with FSDP, or "
                        f"OPTIMIZER={settings.optimizer} with DDP (torchrun)")


def lr_schedule(settings: TrainSettings, max_steps: int, phase_steps: list[int] | None = None) -> dict[str, Any]:
    """LR_SCHEDULE as Trainer arguments: cosine from the peak to MIN_LR_RATIO x peak after the warmup, or wsd
    (warmup, stable at the peak, then a linear decay to the floor over the last DECAY_RATIO of the steps; in a run
    of several phases, whose step ends are `phase_steps`, over exactly the last phase's steps: the first of them at
    the peak, each later one lower)."""
    if settings.lr_schedule == "wsd":
        return {"lr_scheduler_type": "warmup_stable_decay",
                "lr_scheduler_kwargs": {"num_decay_steps": wsd_decay_steps(max_steps, phase_steps,
                                                                           settings.decay_ratio),
                                        "decay_type": "linear", "min_lr_ratio": settings.min_lr_ratio}}
    return {"lr_scheduler_type": "cosine_with_min_lr", "lr_scheduler_kwargs": {"min_lr_rate": settings.min_lr_ratio}}


def wsd_decay_steps(max_steps: int, phase_steps: list[int] | None = None, decay_ratio: float = 0.2) -> int:
    """The steps LR_SCHEDULE=wsd decays over: the last phase's in a run of several (`phase_steps`: where each ends),
    else the last DECAY_RATIO of the steps; at least one."""
    decay = (max_steps - phase_steps[-2] if phase_steps is not None and len(phase_steps) > 1
             else round(decay_ratio * max_steps))
    return max(1, decay)


def warmup_steps(warmup_ratio: float, max_steps: int) -> int:
    """WARMUP_RATIO of `max_steps` in whole steps, rounded up as transformers rounds a fraction given as
    `warmup_steps` (tests/test_hf_private_apis.py pins it), and at most all but the last step. The Trainer's linear
    warmup runs step k at k/warmup of the peak, so its first step is at LR 0: a warmup over every step of a run of
    one step trained that step at LR 0 (the weights unchanged, exit 0). Capped, the last step is at the peak."""
    return max(0, min(math.ceil(warmup_ratio * max_steps), max_steps - 1))


def _no_cpp_compiler() -> str | None:
    """Why torch.compile's inductor finds no C++ compiler here (its own search: $CXX, else g++), or None if it does."""
    from torch._inductor.cpp_builder import get_cpp_compiler
    from torch._inductor.exc import InvalidCxxCompiler

    try:
        get_cpp_compiler()
    except InvalidCxxCompiler:
        cxx = os.environ.get("CXX")
        return f"none runs here (tried {cxx} from CXX)" if cxx else "none runs here (tried g++; CXX is not set)"
    return None


def compiles(settings: TrainSettings, device: dict[str, Any]) -> bool:
    """Whether torch.compile is on: COMPILE=on, or auto on CUDA."""
    return settings.compile == "on" or (settings.compile == "auto" and device["kind"] == "cuda")


def weights_digest(model: torch.nn.Module) -> str:
    """A short hash of every parameter's bytes: equal on all ranks exactly when data parallelism keeps them in step."""
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        digest.update(name.encode())
        digest.update(param.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


class SparkTrainer(Trainer):
    """The HF Trainer plus per-step bookkeeping kept on the device: pre-clip grad norms, the first non-finite step,
    and (when `batch_log` is set) one line per optimizer step with its LR, a digest of each of its blocks and a hash
    of the weights it starts from."""

    def __init__(self, *args: Any, nonfinite: str = "stop", batch_log: Path | None = None,
                 settings: TrainSettings | None = None, global_batch: int | None = None,
                 phase_steps: list[int] | None = None, source_labels: list[str] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # the mix's labels, which the eval items' "source_ids" index: the eval loss per source (evaluation_loop)
        self.source_labels = list(source_labels or [])
        self._source_sums: torch.Tensor | None = None
        self._eval_blocks = 0
        self.global_batch = global_batch  # set: a packed dataset is drawn in whole global batches (GlobalBatchSampler)
        self.phase_steps = phase_steps  # where each phase's steps end (a packed dataset built in phases)
        self.train_sampler: GlobalBatchSampler | None = None
        self.add_callback(_SamplerEpoch(self))
        self.add_callback(StepSpeed())
        self._counted = CountedParameters()
        self.settings = settings  # its OPTIMIZER is built by sparknet.model.optimizers (None: the Trainer's own AdamW)
        self.nonfinite = nonfinite
        self.grad_norms: list[tuple[int, Any]] = []
        self._first_bad: torch.Tensor | None = None
        self.batch_log = batch_log
        self._step_blocks: list[str] = []

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

    def create_optimizer(self, model: Any = None) -> Any:
        """The settings' OPTIMIZER, from the registry (sparknet.model.optimizers)."""
        if self.settings is None:
            return super().create_optimizer(model)
        if self.optimizer is None:
            from sparknet.model.optimizers import OPTIMIZERS

            model = self.model if model is None else model
            self.optimizer = OPTIMIZERS[self.settings.optimizer].build(self, model)
        return self.optimizer

    def get_train_dataloader(self) -> Any:
        """A stream (IterableDataset) is read as it is, in this process: it shards itself by rank and keeps its own
        exact position, so accelerate's re-sharding (every rank reading all blocks and keeping its slice) and
        read-ahead (which would put the stream's position ahead of what was trained) must not wrap it."""
        if not isinstance(self.train_dataset, torch.utils.data.IterableDataset):
            return super().get_train_dataloader()
        return torch.utils.data.DataLoader(self.train_dataset, batch_size=self._train_batch_size,
                                           collate_fn=self.data_collator, num_workers=0,
                                           pin_memory=self.args.dataloader_pin_memory)

    # Private Trainer methods overridden or called below, each because no public hook gives the same: the input
    # copy to the device (_prepare_input), the per-step pre-clip grad norm as a device tensor (_get_grad_norm: the
    # `on_pre_optimizer_step` callback sees no norm), the best model's reload at a finished run's last step
    # (_load_best_model, _load_from_checkpoint), the training sampler (_get_train_sampler: the one hook for it), the
    # step's item count (_get_num_items_in_batch: counted on the host, see there).
    # tests/test_hf_private_apis.py fails when transformers changes them.
    def _prepare_input(self, data: Any) -> Any:
        # the stream's batches (not moved by accelerate): pinned, so copied without waiting, as above
        if isinstance(data, torch.Tensor) and data.device.type == "cpu" and self.args.device.type == "cuda":
            return data.to(self.args.device, non_blocking=data.is_pinned())
        return super()._prepare_input(data)

    def _get_train_sampler(self, train_dataset: Any = None) -> Any:
        dataset = self.train_dataset if train_dataset is None else train_dataset
        if self.global_batch is None or isinstance(dataset, torch.utils.data.IterableDataset):
            return super()._get_train_sampler(train_dataset)
        phases = getattr(dataset, "phases", None)
        if phases is not None:  # each phase's steps from its blocks: (first block, end block, steps)
            steps = self.phase_steps or phase_ends([share for share, _, _ in phases], self.args.max_steps)
            phases = [(start, end, steps[k] - (steps[k - 1] if k else 0))
                      for k, (_, start, end) in enumerate(phases)]
        self.train_sampler = GlobalBatchSampler(len(dataset), self.global_batch, self.args.data_seed, phases)
        return self.train_sampler

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
        """The step's batches; after a Hub outage longer than HUB_RETRY_MINUTES, a checkpoint of the last whole step
        and the error saying so. Under data parallelism every process stops at that same step: the processes of a
        run reading the Hub agree, before each step's forward pass, on whether any of them lost the Hub (an
        all-reduce of one flag on the CPU group, so no device synchronisation), and then save together."""
        from sparknet.data.source.hub_retries import HubUnavailable

        # the batches are read here, before the Trainer's own count of the step's items (a collective, which a
        # process that lost the Hub would never reach)
        batches, outage = [], None
        try:
            for _ in range(num_batches):
                batches.append(next(epoch_iterator))
        except StopIteration:
            pass
        except HubUnavailable as exc:
            outage = exc
        group = self._outage_group()
        if not _any_process(outage is not None, group):
            return super().get_batch_samples(iter(batches), num_batches, device)
        if outage is None:
            outage = HubUnavailable("another process could not read from the Hub for longer than "
                                    "HUB_RETRY_MINUTES (its error names the source)", ConnectionError("Hub outage"))
        raise HubUnavailable(f"{outage}; {self._save_at_outage(group)}", outage.cause) from None

    def _get_num_items_in_batch(self, batch_samples: list, device: Any) -> Any:
        """The step's count of predicted tokens (the loss's divisor under gradient accumulation) as a Python int,
        counted on the host. The Trainer's own moves a host tensor to the device every step, a copy from pageable
        memory that waits for the GPU's queue to drain, and under data parallelism gathers it on the device; here
        the processes sum it on the CPU group instead. Batches already on the device go the Trainer's way."""
        labels = [batch.get("labels") for batch in batch_samples]
        group = self._cpu_group()
        summed = self.args.average_tokens_across_devices and self.args.world_size > 1
        if (not labels or not (self.model_accepts_loss_kwargs or self.compute_loss_func is not None)
                or "shift_labels" in batch_samples[0] or not self._loss_shifts_labels or (summed and group is None)
                or any(not isinstance(t, torch.Tensor) or t.device.type != "cpu" for t in labels)
                or self.args.n_gpu > 1):
            return super()._get_num_items_in_batch(batch_samples, device)
        count = sum(int(t[..., 1:].ne(-100).sum()) for t in labels)
        if summed:
            import torch.distributed as dist

            total = torch.tensor([count], dtype=torch.int64)
            dist.all_reduce(total, group=group)
            count = int(total[0])
        return count

    def _cpu_group(self) -> Any:
        """The CPU (gloo) process group the safety net created at the start of training; None on one process."""
        return next((c.group for c in self.callback_handler.callbacks if isinstance(c, SafetyCallback)), None)

    def _outage_group(self) -> Any:
        """The CPU process group the safety net created, when several processes read the Hub; else None."""
        from sparknet.common.runtime import world_size

        if world_size() == 1 or not getattr(self.train_dataset, "reads_hub", False):
            return None
        return self._cpu_group()

    def _save_at_outage(self, group: Any) -> str:
        """A checkpoint of the last whole step, with the stream's position taken back to that step's end (the blocks
        read for the next step are given again on resume); what to say about it. With `group`, every process of
        the run is here and saves its part."""
        from sparknet.common.runtime import world_size
        from sparknet.train.folders import COMPLETE_MARKER

        step = self.state.global_step
        folder = Path(self.args.output_dir) / f"checkpoint-{step}"
        rewind = getattr(self.train_dataset, "rewind_to_step", None)
        if (world_size() > 1 and group is None) or rewind is None or step == 0:
            return "run the same command to resume (from the newest checkpoint, if any)"
        rewind()
        if not _all_processes((folder / COMPLETE_MARKER).is_file(), group):
            self._save_checkpoint(self.model_wrapped, trial=None)
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)
        return f"checkpoint saved in {folder}: run the same command to resume"

    def restore_finished(self, checkpoint: Path) -> None:
        """Loads a checkpoint taken at the run's last step as train() would have left it: its state, and the best
        model (for the final eval and export) without training a step."""
        from transformers import TrainerState

        self.state = TrainerState.load_from_json(str(checkpoint / "trainer_state.json"))
        best = self.state.best_model_checkpoint
        if best and Path(best).is_dir():
            self._load_best_model()
        else:
            self._load_from_checkpoint(str(checkpoint))

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        """The Trainer's loss; for evaluation items that carry their tokens' sources (SourcedBlocks), the same mean
        over the predicted tokens computed here from the logits, token by token, so that each block's loss sums per
        source come from the very values the eval loss averages, at no extra pass over the logits."""
        sources, blocks = inputs.pop("source_ids", None), inputs.pop("block_index", None)
        if sources is None or model.training or not self.source_labels:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        import torch.nn.functional as F  # the usual name

        outputs = model(**{key: value for key, value in inputs.items() if key != "labels"})
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        # as the model's causal-LM loss: position t predicts token t+1, in fp32, -100 ignored; the targets (and
        # their sources) are shifted, not the logits, whose slice would copy them whole
        targets = F.pad(inputs["labels"][:, 1:], (0, 1), value=-100)
        losses = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100,
                                 reduction="none").view_as(targets)
        counted = targets.ne(-100)
        # a token's source is the predicted token's; the last position predicts nothing (its loss is 0)
        self._add_source_sums(blocks, F.pad(sources[:, 1:], (0, 1)).long(), losses, counted)
        loss = losses.sum() / counted.sum().clamp(min=1)
        return (loss, outputs) if return_outputs else loss

    def _add_source_sums(self, blocks: torch.Tensor, sources: torch.Tensor, losses: torch.Tensor,
                         counted: torch.Tensor) -> None:
        """Keeps, per validation block, the loss sum and the predicted-token count of each source, on the device (no
        host sync). Per block rather than running sums: under data parallelism the last batches are padded with
        blocks evaluated again on another process, and a block's row written twice is still written once."""
        if self._source_sums is None:
            self._source_sums = torch.zeros(2, self._eval_blocks, len(self.source_labels), device=losses.device)
        shape = (len(blocks), len(self.source_labels))
        sums = torch.zeros(shape, device=losses.device).scatter_add_(1, sources, losses)
        counts = torch.zeros(shape, device=losses.device).scatter_add_(1, sources, counted.float())
        self._source_sums[0, blocks] = sums
        self._source_sums[1, blocks] = counts

    def evaluation_loop(self, dataloader: Any, description: str, prediction_loss_only: bool | None = None,
                        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval") -> Any:
        """The Trainer's evaluation, plus `<prefix>_loss/<label>` in its metrics: the mean loss over the predicted
        tokens of each source (sources without any left out), over every process's blocks; `<prefix>_loss` is then
        their token-weighted mean, exact on any number of processes."""
        self._source_sums, self._eval_blocks = None, len(dataloader.dataset)
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys,
                                         metric_key_prefix)
        sums, self._source_sums = self._source_sums, None
        if sums is None:
            return output
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(sums, op=dist.ReduceOp.MAX)  # each block's row from a process that evaluated it
        totals = sums.double().sum(dim=1).cpu()
        if totals[1].sum() > 0:
            # the eval loss itself from the same sums, each block once: the Trainer's averages per-batch means, and
            # under data parallelism the padded last batch's mean also holds a block evaluated twice
            output.metrics[f"{metric_key_prefix}_loss"] = float(totals[0].sum() / totals[1].sum())
        for index, label in enumerate(self.source_labels):
            if totals[1, index] > 0:
                output.metrics[f"{metric_key_prefix}_loss/{label}"] = float(totals[0, index] / totals[1, index])
        return output

    def floating_point_ops(self, inputs: dict[str, Any]) -> int:
        return self._counted.flos(self.model, inputs)

    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
        if self.batch_log is not None:
            # a digest of each whole block: blocks sharing their first tokens (boilerplate) stay distinct
            self._step_blocks += [hashlib.blake2b(row.cpu().numpy().tobytes(), digest_size=8).hexdigest()
                                  for row in inputs["input_ids"]]
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
                record = {"step": step, "lr": self.optimizer.param_groups[0]["lr"], "blocks": self._step_blocks,
                          "weights": weights_digest(self.model),
                          "data_parallel": type(self.model_wrapped).__name__ == "DistributedDataParallel"}
                f.write(json.dumps(record) + "\n")
            self._step_blocks = []
        return norm


class _SamplerEpoch(TrainerCallback):
    """Tells the packed sampler its epoch at each epoch's start, from the step count. The Trainer's own set_epoch
    does not reach a sampler under the batch-skipping wrapper of a resumed multi-process run, which would then
    replay epoch 0's order in a later epoch."""

    def __init__(self, trainer: SparkTrainer) -> None:
        self.trainer = trainer

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        sampler = self.trainer.train_sampler
        if sampler is not None:
            sampler.set_epoch(state.global_step // (len(sampler) // sampler.global_batch))


def _any_process(flag: bool, group: Any) -> bool:
    """Whether `flag` holds on any process of `group` (this process's flag alone without a group)."""
    if group is None:
        return flag
    import torch.distributed as dist

    value = torch.tensor([int(flag)], dtype=torch.int64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return bool(value[0])


def _all_processes(flag: bool, group: Any) -> bool:
    return not _any_process(not flag, group)
