"""What the user sees during training: TensorBoard scalars and console lines (loss, perplexity, LR, grad norm,
throughput, MFU, memory, eval loss and bits per byte), samples, and the safety net (signals, non-finite values,
checkpoint completion markers).

The TensorBoard stream is written here, not through `report_to`, so that every tag is written once, by one writer,
into `logs/<RUN_NAME>/`. Nothing here reads a device value between logging points: per-step grad norms are kept as
device tensors and read in one go when the Trainer itself synchronises to log the loss.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from sparknet.evaluation import bits_per_byte, perplexity

log = logging.getLogger("sparknet.train")
COMPLETE_MARKER = ".complete"


def _finite(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    return f"{h}h{rem // 60:02d}m" if h else f"{rem // 60}m{rem % 60:02d}s"


class MetricsCallback(TrainerCallback):
    """TensorBoard scalars and a console line at every logging step and evaluation.

    Throughput counts training time only: the gaps after a step in which evaluation, saving or sampling ran are
    excluded from the window they fall in.
    """

    def __init__(self, writer: Any, tokens_per_step: int, block_size: int, flops_per_token: float,
                 peak_flops: float | None, world_size: int, grad_norms: list, eval_tokens: int,
                 eval_bytes: int, device_kind: str) -> None:
        self.writer = writer
        self.tokens_per_step = tokens_per_step
        self.block_size = block_size
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        self.world_size = world_size
        self.grad_norms = grad_norms
        self.eval_tokens, self.eval_bytes = eval_tokens, eval_bytes
        self.device_kind = device_kind
        self._window_start = time.perf_counter()
        self._window_step = 0
        self._excluded = 0.0
        self._exclude_gap = False
        self._step_end = 0.0
        self._train_seconds = 0.0
        self.last_train: dict[str, float] = {}
        self.last_eval: dict[str, float] = {}
        self._eval_steps: set[int] = set()

    def exclude_next_gap(self) -> None:
        """Marks the time until the next step begins as not training (eval, save)."""
        self._exclude_gap = True

    def exclude(self, seconds: float) -> None:
        """Takes `seconds` of non-training work (sampling) out of the current throughput window."""
        self._excluded += seconds

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self._window_start = time.perf_counter()
        self._window_step = state.global_step
        self._excluded = 0.0

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if self._exclude_gap and self._step_end:
            # from the later of the step's end and the window's start: work before a log belongs to the old window
            self._excluded += time.perf_counter() - max(self._step_end, self._window_start)
        self._exclude_gap = False

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self._step_end = time.perf_counter()

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    metrics: dict[str, float] | None = None, **kw: Any) -> None:
        self.exclude_next_gap()
        if not metrics or "eval_loss" not in metrics or not state.is_world_process_zero:
            return
        loss = float(metrics["eval_loss"])
        values = {"eval/loss": loss, "eval/perplexity": perplexity(loss)}
        if self.eval_bytes:
            values["eval/bits_per_byte"] = bits_per_byte(loss, self.eval_tokens, self.eval_bytes)
        if state.global_step not in self._eval_steps:  # the closing eval of the best model repeats a step
            self._eval_steps.add(state.global_step)
            self._write(values, state.global_step)
        self.last_eval = {k.split("/")[1]: v for k, v in values.items()}
        bpb = f"  bits/byte {values['eval/bits_per_byte']:.3f}" if "eval/bits_per_byte" in values else ""
        log.info("eval   step %6d  loss %.4f  ppl %.2f%s", state.global_step, loss, values["eval/perplexity"], bpb)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self.exclude_next_gap()

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, float] | None = None, **kw: Any) -> None:
        if not logs or "loss" not in logs:
            return
        import torch

        now = time.perf_counter()
        steps = state.global_step - self._window_step
        seconds = max(now - self._window_start - self._excluded, 1e-9)
        self._train_seconds += seconds
        self._window_start, self._window_step, self._excluded = now, state.global_step, 0.0
        norms = self.grad_norms[:]
        self.grad_norms.clear()
        if not state.is_world_process_zero:
            return
        if norms:  # one transfer for the whole window
            values = torch.stack([torch.as_tensor(n).float().reshape(()) for _, n in norms]).cpu()
            for (step, _), value in zip(norms, values.tolist(), strict=True):
                self.writer.add_scalar("train/grad_norm", value, step)
        loss = float(logs["loss"])
        tokens_per_s = steps * self.tokens_per_step / seconds
        scalars = {
            "train/loss": loss,
            "train/perplexity": perplexity(loss),
            "train/learning_rate": float(logs.get("learning_rate", 0.0)),
            "perf/tokens_per_second": tokens_per_s,
            "perf/examples_per_second": tokens_per_s / self.block_size,
            "perf/tokens_seen": float(state.global_step * self.tokens_per_step),
            "perf/device_memory_gb": self._memory_gb(),
        }
        if self.peak_flops:
            scalars["perf/mfu"] = self.flops_per_token * tokens_per_s / (self.peak_flops * self.world_size)
        self._write(scalars, state.global_step)
        self.last_train = {"loss": loss, "tokens_per_second": tokens_per_s}
        eta = (state.max_steps - state.global_step) * seconds / max(steps, 1)
        grad = f"{values[-1].item():.3f}" if norms else "n/a"
        mfu = f"  mfu {scalars['perf/mfu']:.1%}" if "perf/mfu" in scalars else ""
        log.info("train  step %6d/%d  loss %.4f  lr %.3e  grad %s  %s tok/s%s  eta %s", state.global_step,
                 state.max_steps, loss, scalars["train/learning_rate"], grad, f"{tokens_per_s:,.0f}", mfu,
                 _duration(eta))

    def _memory_gb(self) -> float:
        import torch

        if self.device_kind == "cuda":
            return torch.cuda.max_memory_allocated() / 2**30
        import psutil

        return psutil.Process().memory_info().rss / 2**30

    def _write(self, scalars: dict[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self.writer.flush()


class SamplingCallback(TrainerCallback):
    """Generates from fixed prompts every `every` steps and at the end, into sample_stepXXXXXX.txt and TensorBoard.

    The sampling seed is fixed, and the RNG streams and the model's train mode are restored afterwards, so sampling
    changes nothing about training.
    """

    def __init__(self, tokenizer: Any, prompts: list[str], every: int, out_dir: Path, writer: Any,
                 metrics: MetricsCallback, max_new_tokens: int, temperature: float, top_k: int, seed: int) -> None:
        self.tokenizer, self.prompts, self.every = tokenizer, prompts, every
        self.out_dir, self.writer, self.metrics = out_dir, writer, metrics
        self.max_new_tokens, self.temperature, self.top_k, self.seed = max_new_tokens, temperature, top_k, seed
        self.last_sampled = -1
        self.last_text = ""

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if self.every > 0 and state.global_step % self.every == 0:
            self.sample(kw["model"], state)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if state.global_step != self.last_sampled:
            self.sample(kw["model"], state)

    def _generate(self, model: Any, prompt: str, device: Any) -> str:
        import torch

        ids = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"].to(device)
        if ids.shape[1] == 0:
            ids = torch.tensor([[self.tokenizer.eos_token_id]], device=device)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                 temperature=self.temperature, top_k=self.top_k, max_new_tokens=self.max_new_tokens,
                                 use_cache=True, pad_token_id=self.tokenizer.eos_token_id)
        return prompt + self.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=False)

    def sample(self, model: Any, state: TrainerState) -> str:
        """Writes one sample file for the current step and returns its text."""
        if not state.is_world_process_zero or not self.prompts:
            return ""
        import torch

        started = time.perf_counter()
        model = getattr(model, "module", model)  # DDP
        model = getattr(model, "_orig_mod", model)  # torch.compile
        device = next(model.parameters()).device
        cpu_rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        was_training = model.training
        model.eval()
        texts = []
        try:
            torch.manual_seed(self.seed)
            for prompt in self.prompts:
                texts.append(self._generate(model, prompt, device))
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
        self.metrics.exclude(time.perf_counter() - started)
        log.info("sample step %6d  -> %s", state.global_step, path.name)
        return text


class SafetyCallback(TrainerCallback):
    """Stops cleanly on SIGINT/SIGTERM (saving a checkpoint first) and on a non-finite loss or grad norm (saving
    nothing, so the last good checkpoint stays the latest); marks each fully written checkpoint as complete."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.stop_signal: int | None = None
        self.diverged_at: int | None = None

    def request_stop(self, signum: int) -> None:
        self.stop_signal = signum

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        import torch.distributed as dist

        at_sync_point = control.should_log or control.should_save or control.should_evaluate
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        last = state.global_step >= state.max_steps
        if distributed and not (at_sync_point or last):
            return  # processes decide together, at steps where all of them synchronise anyway
        check_nan = self.trainer.nonfinite == "stop" and (at_sync_point or last or self.stop_signal is not None)
        bad = self.trainer.first_nonfinite_step() if check_nan else None
        stop = self.stop_signal
        if distributed:  # one decision for all processes, or they would wait for each other forever
            import torch

            flags = torch.tensor([stop or 0, -1 if bad is None else bad], device=args.device)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            stop, bad = (int(flags[0]) or None), (None if int(flags[1]) < 0 else int(flags[1]))
            self.stop_signal = stop
        if bad is not None:
            self.diverged_at = bad
            control.should_training_stop = True
            control.should_save = False
            control.should_evaluate = False
        elif stop is not None:
            control.should_save = True
            control.should_training_stop = True

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if folder.is_dir():
                marker = folder / COMPLETE_MARKER
                marker.write_text(f"{state.global_step}\n")
