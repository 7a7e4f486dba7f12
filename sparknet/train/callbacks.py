"""What the user sees during training: TensorBoard scalars and console lines (loss, perplexity, LR, grad norm,
throughput, MFU, memory, eval loss and bits per byte) and samples. The safety net is in sparknet.train.safety.

The TensorBoard stream is written here, not through `report_to`, so that every tag is written once, by one writer,
into `logs/<RUN_NAME>/`. Nothing here reads a device value between logging points: per-step grad norms are kept as
device tensors and read in one go when the Trainer itself synchronises to log the loss.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from sparknet.common.runtime import write_json_atomic
from sparknet.model.metrics import bits_per_byte, perplexity

if TYPE_CHECKING:
    from sparknet.train.settings import TrainSettings

log = logging.getLogger("sparknet.train")


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    return f"{h}h{rem // 60:02d}m" if h else f"{rem // 60}m{rem % 60:02d}s"


# Shown under each tag in TensorBoard, so a reader of a multi-GPU run knows what the numbers cover.
TAG_DESCRIPTIONS = {
    "perf/tokens_per_second": "Training tokens per second over all processes together (global), training time only: "
                              "eval, saving and sampling excluded.",
    "perf/examples_per_second": "Training blocks per second over all processes together (global).",
    "perf/mfu": "Model FLOPs utilisation of one device: FLOPs per token x global tokens/s / (peak FLOP/s x devices).",
    "perf/tokens_seen": "Training tokens consumed so far, all processes together.",
    "perf/device_memory_gb": "Peak memory PyTorch allocated on the main process's GPU, GiB (GPU runs only: on a CPU "
                             "there is no device memory apart from the machine's).",
    "data/capacity_tokens_per_second": "What the stream can supply (this process): tokens handed to the trainer per "
                                       "second spent producing them while it waited. A capacity, not the training "
                                       "rate: far above perf/tokens_per_second when data is not the bottleneck.",
}


# The Custom Scalars tab's charts (TensorBoard's Time Series tab sorts groups by name: data, eval, perf, train, so the
# loss came last): what a user looks at first, in that order. Regexes that TensorBoard matches from a tag's start,
# the same for every run, so that `tensorboard --logdir logs` merges the runs' layouts into one.
LAYOUT = {
    "Loss": {"train and eval loss": ["Multiline", ["^train/loss$", "^eval/loss$"]]},
    "Bits per byte": {"eval bits per byte, all and per source": ["Multiline", ["^eval/bits_per_byte(/.*)?$"]]},
    "Speed": {"training tokens per second (all processes)": ["Multiline", ["^perf/tokens_per_second$"]]},
    "Learning rate": {"learning rate": ["Multiline", ["^train/learning_rate$"]]},
}
LAYOUT_TAG = "custom_scalars__config__"  # the tag TensorBoard's custom scalars plugin reads the layout from


def has_layout(log_dir: Path) -> bool:
    """Whether the run's first event file begins with the layout (sparknet.train.run writes it right after the file
    is made, at a run's start, or at a resume of a run whose logs hold none): read from its first few records only,
    so that a resume of a long run reads nothing else."""
    import itertools

    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    # the name holds the creation time in seconds: events.out.tfevents.<time>.<host>...
    files = sorted(log_dir.glob("events.out.tfevents.*"), key=lambda path: (path.name.split(".")[3], path.name))
    if not files:
        return False
    return any(value.tag == LAYOUT_TAG for event in itertools.islice(EventFileLoader(str(files[0])).Load(), 5)
               for value in event.summary.value)


def add_described_scalar(writer: Any, tag: str, value: float, step: int) -> bool:
    """Writes a tag's value with its TAG_DESCRIPTIONS entry (TensorBoard keeps the first description it sees), or
    returns False where the writer cannot (then the caller writes it plainly)."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.scalar import metadata

    # SummaryWriter's add_scalar takes no description; its file writer (private, no public accessor) takes a
    # summary with one. tests/test_hf_private_apis.py pins it; without it the tag is written plainly.
    file_writer = writer._get_file_writer() if hasattr(writer, "_get_file_writer") else None
    if file_writer is None:
        return False
    md = metadata.create_summary_metadata(display_name=tag, description=TAG_DESCRIPTIONS[tag])
    file_writer.add_summary(Summary(value=[Summary.Value(tag=tag, simple_value=value, metadata=md)]), step)
    return True


@dataclass(frozen=True)
class MetricsSpec:
    """What a run's figures are computed from, fixed when it starts (sparknet.train.run builds it)."""

    tokens_per_step: int  # training tokens per optimizer step, all processes together
    block_size: int
    flops_per_token: float  # training FLOPs per token (sparknet.model.presets.flops_per_token)
    peak_flops: float | None  # one device's peak FLOP/s; None: no MFU
    world_size: int
    eval_tokens: int  # the validation tokens the eval loss averages over
    eval_bytes: int  # ... and the UTF-8 bytes they stand for (0: no bits per byte)
    device_kind: str  # "cuda", "cpu", ...: where the memory figure comes from
    compile_warmup: bool = False  # torch.compile: the first window after (re)starting holds the compilation
    # label: (its validation tokens, their bytes), for the figures per source; empty: none
    eval_sources: dict[str, tuple[int, int]] = field(default_factory=dict)


class MetricsCallback(TrainerCallback):
    """TensorBoard scalars and a console line at every logging step and evaluation.

    Throughput counts training time only: everything from the end of a step's training work to the start of the
    next step is excluded when evaluation, saving or sampling ran in it (so nothing is subtracted twice, and a
    window's training time never goes below zero), and so is the time before the first step (a resume's restore of
    its checkpoint and the batches it skips). With torch.compile the first window after (re)starting holds the
    compilation: it is printed as warm-up and left out of the perf/ figures and of the run's mean.
    """

    def __init__(self, *, spec: MetricsSpec, writer: Any, grad_norms: list, start_file: Path | None = None,
                 logged_eval_steps: set[int] | None = None) -> None:
        """`grad_norms` is filled by the trainer ((step, norm) per optimizer step, read at each log); the step-0 eval
        loss is written to `start_file` (None: not here); `logged_eval_steps` were written before a resume."""
        self.spec = spec
        self.writer = writer
        self.grad_norms = grad_norms
        self.start_file = start_file
        self._window_start = time.perf_counter()
        self._window_step = 0
        self._excluded = 0.0
        self._paused = False  # evaluation, saving or sampling ran since the last step's end
        self._step_end = 0.0
        self._started = False  # a step began since train_begin: the first window opens at the first step
        self._windows = 0
        self.train_seconds = 0.0  # summed over the measured windows of this process (warm-up left out)
        self.train_tokens = 0
        self.last_train: dict[str, float] = {}
        self.last_eval: dict[str, float] = {}
        self.last_eval_per_source: dict[str, dict[str, float]] = {}  # label: {"loss", "bits_per_byte", "tokens"}
        self._eval_steps: set[int] = set(logged_eval_steps or ())
        self._described: set[str] = set()

    def pause(self) -> None:
        """Marks the time from the last step's end to the next step's start as not training."""
        self._paused = True

    @property
    def mean_tokens_per_second(self) -> float | None:
        """Tokens per second over all measured training time of this process (None before the first window)."""
        return self.train_tokens / self.train_seconds if self.train_seconds > 0 else None

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self._window_start = time.perf_counter()
        self._window_step = state.global_step
        self._excluded = 0.0
        self._windows = 0
        self._started = False

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if not self._started:  # the time since train_begin (a resume's restore, skipped batches) is not training
            self._window_start = time.perf_counter()
            self._started, self._paused = True, False
            return
        if self._paused:
            # from the later of the step's end and the window's start: work before a log belongs to the old window
            self._excluded += time.perf_counter() - max(self._step_end, self._window_start)
        self._paused = False

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self._step_end = time.perf_counter()
        self._paused = False

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    metrics: dict[str, float] | None = None, **kw: Any) -> None:
        self.pause()
        if not metrics or "eval_loss" not in metrics or not state.is_world_process_zero:
            return
        loss = float(metrics["eval_loss"])
        values = {"eval/loss": loss, "eval/perplexity": perplexity(loss)}
        if self.spec.eval_bytes:
            values["eval/bits_per_byte"] = bits_per_byte(loss, self.spec.eval_tokens, self.spec.eval_bytes)
        per_source = self._per_source(metrics)
        closing = state.global_step in self._eval_steps  # the closing eval of the best model repeats a step
        if not closing:
            self._eval_steps.add(state.global_step)
            self._write(values, state.global_step)
            self._write({f"eval/{name}/{label}": figures[name] for label, figures in per_source.items()
                         for name in ("loss", "bits_per_byte") if name in figures}, state.global_step)
        if state.global_step == 0 and self.start_file is not None:
            write_json_atomic(self.start_file, {"eval_loss": loss})
        self.last_eval = {k.split("/")[1]: v for k, v in values.items()}
        self.last_eval_per_source = per_source
        bpb = f"  bits/byte {values['eval/bits_per_byte']:.3f}" if "eval/bits_per_byte" in values else ""
        if per_source:
            bpb += "  (" + ", ".join(f"{label} {figures['loss']:.4f}" for label, figures in per_source.items()) + ")"
        if closing:
            best = state.best_model_checkpoint
            which = f"best checkpoint ({Path(best).name})" if best else f"step {state.global_step}"
            log.info("eval   final, %s  loss %.4f  ppl %.2f%s", which, loss, values["eval/perplexity"], bpb)
            return
        log.info("eval   step %6d  loss %.4f  ppl %.2f%s", state.global_step, loss, values["eval/perplexity"], bpb)

    def _per_source(self, metrics: dict[str, float]) -> dict[str, dict[str, float]]:
        """The eval figures of each source the evaluation measured (SparkTrainer's `eval_loss/<label>`)."""
        figures = {}
        for label, (tokens, n_bytes) in self.spec.eval_sources.items():
            loss = metrics.get(f"eval_loss/{label}")
            if loss is None:
                continue
            figures[label] = {"loss": float(loss), "tokens": tokens}
            if n_bytes:
                figures[label]["bits_per_byte"] = bits_per_byte(float(loss), tokens, n_bytes)
        return figures

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self.pause()

    def _close_window(self, global_step: int) -> tuple[int, float, bool]:
        """Ends the current throughput window: (steps, training seconds, whether it was the compile warm-up)."""
        now = time.perf_counter()
        if self._paused:  # sampling ran after this step's training work: not training time
            self._excluded += now - max(self._step_end, self._window_start)
        steps = global_step - self._window_step
        seconds = max(now - self._window_start - self._excluded, 1e-9)
        warmup = self.spec.compile_warmup and self._windows == 0
        self._windows += 1
        if not warmup:
            self.train_seconds += seconds
            self.train_tokens += steps * self.spec.tokens_per_step
        self._window_start, self._window_step, self._excluded = now, global_step, 0.0
        return steps, seconds, warmup

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, float] | None = None, **kw: Any) -> None:
        if not logs or "loss" not in logs:
            return
        import torch

        steps, seconds, warmup = self._close_window(state.global_step)
        norms = self.grad_norms[:]
        self.grad_norms.clear()
        if not state.is_world_process_zero:
            return
        if norms:  # one transfer for the whole window
            values = torch.stack([torch.as_tensor(n).float().reshape(()) for _, n in norms]).cpu()
            for (step, _), value in zip(norms, values.tolist(), strict=True):
                self.writer.add_scalar("train/grad_norm", value, step)
        loss = float(logs["loss"])
        tokens_per_s = steps * self.spec.tokens_per_step / seconds
        scalars = {
            "train/loss": loss,
            "train/perplexity": perplexity(loss),
            "train/learning_rate": float(logs.get("learning_rate", 0.0)),
            "perf/tokens_seen": float(state.global_step * self.spec.tokens_per_step),
        }
        if self.spec.device_kind == "cuda":  # a CPU has no device memory of its own: the figure would be another
            scalars["perf/device_memory_gb"] = self._memory_gb()
        if not warmup:
            scalars["perf/tokens_per_second"] = tokens_per_s
            scalars["perf/examples_per_second"] = tokens_per_s / self.spec.block_size
            if self.spec.peak_flops:
                scalars["perf/mfu"] = (self.spec.flops_per_token * tokens_per_s
                                       / (self.spec.peak_flops * self.spec.world_size))
            self.last_train = {"tokens_per_second": tokens_per_s}
        self._write(scalars, state.global_step)
        self.last_train["loss"] = loss
        eta = (state.max_steps - state.global_step) * seconds / max(steps, 1)
        grad = f"{values[-1].item():.3f}" if norms else "n/a"
        mfu = f"  mfu {scalars['perf/mfu']:.1%}" if "perf/mfu" in scalars else ""
        speed = "warm-up (torch.compile)" if warmup else f"{tokens_per_s:,.0f} tok/s{mfu}"
        log.info("train  step %6d/%d  loss %.4f  lr %.3e  grad %s  %s  eta %s", state.global_step, state.max_steps,
                 loss, scalars["train/learning_rate"], grad, speed, _duration(eta))

    def _memory_gb(self) -> float:
        import torch

        return torch.cuda.max_memory_allocated() / 2**30

    def _write(self, scalars: dict[str, float], step: int) -> None:
        for tag, value in scalars.items():
            if tag in TAG_DESCRIPTIONS and tag not in self._described and self._write_described(tag, value, step):
                continue
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def _write_described(self, tag: str, value: float, step: int) -> bool:
        """Writes a tag's first value with its description (TensorBoard keeps the first one it sees)."""
        if not add_described_scalar(self.writer, tag, value, step):
            return False
        self._described.add(tag)
        return True

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self.writer.flush()


class ComputeThreads(TrainerCallback):
    """Sizes torch's compute threads on a CPU again every `every` seconds of training, to the cores that other work
    left free meanwhile (runtime.compute_threads): the load at the start (the stream's encoders filling their first
    window, a build beside it) comes and goes. A new count is taken when two readings in a row agree on it, so a
    load at the edge of a core does not flip it each time. Added only where SparkNet chose the threads from a
    reading (not OMP_NUM_THREADS, one process on the node) and nothing is compiled (inductor's CPU kernels keep the
    count they were compiled with)."""

    def __init__(self, every: float = 30.0) -> None:
        from sparknet.common.runtime import CoreLoad

        self.every, self.load, self.since, self.proposed = every, CoreLoad(), time.monotonic(), 0

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if time.monotonic() - self.since < self.every:
            return
        import torch

        from sparknet.common.runtime import compute_cores, compute_threads

        self.since = time.monotonic()
        before = torch.get_num_threads()
        threads, why = compute_threads(self.load.busy_elsewhere(compute_cores()))
        if threads == before or threads != self.proposed:
            self.proposed = threads if threads != before else 0
            return
        torch.set_num_threads(threads)
        self.proposed = 0
        log.info("compute threads %d -> %d (%s)", before, threads, why)


class SamplingCallback(TrainerCallback):
    """Generates from fixed prompts every `every` steps and at the end, into sample_stepXXXXXX.txt and TensorBoard.

    The sampling seed is fixed, and the RNG streams and the model's train mode are restored afterwards, so sampling
    changes nothing about training.
    """

    def __init__(self, tokenizer: Any, settings: TrainSettings, out_dir: Path, writer: Any,
                 metrics: MetricsCallback) -> None:
        self.tokenizer, self.settings = tokenizer, settings  # its SAMPLE_* settings, read whole
        self.prompts, self.every = list(settings.sample_prompts), settings.sample_steps
        self.out_dir, self.writer, self.metrics = out_dir, writer, metrics
        self.last_sampled = -1
        self.last_text = ""

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        # The final sample is taken at the last step, before the Trainer reloads the best checkpoint, so that it
        # shows the model of the step it is labelled with; a run stopped early (signal, divergence) gets none.
        last = state.global_step >= state.max_steps
        if (self.every > 0 and state.global_step % self.every == 0) or last:
            self.sample(kw["model"], state)

    def _generate(self, model: Any, prompt: str) -> str:
        from sparknet.model.continuations import continuations

        s = self.settings
        text = continuations(model, self.tokenizer, prompt, skip_special_tokens=False, do_sample=True,
                             temperature=s.sample_temperature, top_k=s.sample_top_k,
                             max_new_tokens=s.sample_max_new_tokens, use_cache=True,
                             pad_token_id=self.tokenizer.eos_token_id)[0]
        return prompt + text

    def sample(self, model: Any, state: TrainerState) -> str:
        """Writes one sample file for the current step and returns its text."""
        if not state.is_world_process_zero or not self.prompts:
            return ""
        import torch

        model = getattr(model, "module", model)  # DDP
        model = getattr(model, "_orig_mod", model)  # torch.compile
        cpu_rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        was_training = model.training
        model.eval()
        texts = []
        try:
            torch.manual_seed(self.settings.sample_seed)
            for prompt in self.prompts:
                texts.append(self._generate(model, prompt))
        except RuntimeError as exc:  # e.g. a diverged model's NaN probabilities: a sample is not worth a crash
            log.warning("sampling at step %d failed: %s", state.global_step, str(exc).splitlines()[0])
            return ""
        finally:
            model.train(was_training)
            torch.set_rng_state(cpu_rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)
        text = f"step {state.global_step}\n\n" + "\n\n----------\n\n".join(texts) + "\n"
        path = self.out_dir / f"sample_step{state.global_step:06d}.txt"
        path.write_text(text, encoding="utf-8")
        self.writer.add_text("samples", "\n\n".join(f"    {t}".replace("\n", "\n    ") for t in texts),
                             state.global_step)
        self.writer.flush()
        self.last_sampled = state.global_step
        self.last_text = text
        self.metrics.pause()
        log.info("sample step %6d  -> %s", state.global_step, path.name)
        return text
