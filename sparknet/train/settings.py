"""The training settings both trainer scripts share: one dataclass field per constant, declared once.

The scripts' constants stay the one source of the defaults (the users edit them at the top of the script); each
field here carries what the rest of the code needs to know about it:
- `doc`: what it means, shown in errors and the docs;
- `identity`: whether it belongs to the run's identity. Settings that change the model, the order of the data or
  the optimisation are compared when a run resumes (a change is refused unless ALLOW_CONFIG_CHANGE); the others
  (where and how often to log, save, sample) may differ between attempts;
- its check: the rule for the constant of the same name in `sparknet.checks.RULES`, the table every script's
  constants are checked against before the script starts (`check_settings` applies it here too).
Adding a setting: a constant in both trainer scripts, a field here, a rule in sparknet.checks when it has a range,
and its use (e.g. `sparknet.train.hf_trainer.training_arguments`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


def setting(doc: str, *, identity: bool = True) -> Any:
    """A settings field: no default (the script's constant is the default), its doc and its identity flag."""
    return dataclasses.field(metadata={"doc": doc, "identity": identity})


@dataclass
class TrainSettings:
    """A trainer script's training constants, lower-cased. No defaults here: the script's constants are the one
    source of them (`sparknet.cli.script_constants` reads them for code that has no script)."""

    run_name: str = setting("run folder name under checkpoints/ and logs/", identity=False)
    model_preset: str = setting("model preset (sparknet.model.PRESETS)")
    target_tokens: int | None = setting("training tokens (None: the data's own budget, the config's target_tokens)")
    global_batch_size: int = setting("blocks per optimizer step over all devices (the recipe: the same on any count)")
    # the micro-batch sizes memory only: the accumulation makes up the global batch, so it may change between attempts
    batch_size: int = setting("blocks per device per micro-step, at most (sizes memory)", identity=False)
    learning_rate: float = setting("peak learning rate (AdamW's; with Muon, that of embeddings, norms and biases)")
    optimizer: str = setting("adamw, or muon (Muon for the hidden matrices, AdamW for the rest)")
    muon_learning_rate: float = setting("Muon's peak learning rate (its update scaled to AdamW's size)")
    lr_schedule: str = setting("cosine, or wsd (warmup, stable, linear decay over the last fifth)")
    min_lr_ratio: float = setting("the schedule decays to this fraction of the peak")
    warmup_ratio: float = setting("fraction of the steps spent warming up linearly")
    weight_decay: float = setting("AdamW weight decay")
    adam_betas: tuple[float, float] = setting("AdamW betas")
    max_grad_norm: float = setting("clip the global grad norm to this (0: no clipping)")
    dropout: float = setting("dropout everywhere")
    eval_steps: int = setting("evaluate every this many steps", identity=False)
    save_steps: int = setting("save a checkpoint every this many steps (a multiple of EVAL_STEPS)", identity=False)
    save_total_limit: int = setting("checkpoints kept (the best one is always kept)", identity=False)
    sample_steps: int = setting("write a sample every this many steps (0: only at the end)", identity=False)
    sample_prompts: list[str] = setting("prompts sampled from", identity=False)
    sample_max_new_tokens: int = setting("tokens generated per prompt", identity=False)
    sample_temperature: float = setting("sampling temperature", identity=False)
    sample_top_k: int = setting("sample among the k most likely tokens", identity=False)
    sample_seed: int = setting("seed of the sampling", identity=False)
    logging_steps: int = setting("console line and TensorBoard scalars every this many steps", identity=False)
    compile: str = setting("torch.compile: auto (on for CUDA), on, off", identity=False)
    fused_cross_entropy: bool = setting("the loss from the hidden states without the whole logits tensor "
                                        "(cut-cross-entropy; exact)", identity=False)
    seed: int = setting("seed of initialisation, data order and dropout")
    peak_tflops: float = setting("the device's peak for MFU (0: from the table of GPUs)", identity=False)
    nonfinite: str = setting("on a non-finite loss or grad norm: stop, or skip the update", identity=False)
    allow_config_change: bool = setting("continue an existing RUN_NAME although settings changed", identity=False)
    record_batches: bool = setting("write each step's LR and blocks to batches.jsonl", identity=False)
    checkpoints_dir: str = setting("runs are saved in CHECKPOINTS_DIR/RUN_NAME", identity=False)
    logs_dir: str = setting("TensorBoard logs go to LOGS_DIR/RUN_NAME", identity=False)

    @classmethod
    def from_constants(cls, constants: dict[str, Any], **overrides: Any) -> TrainSettings:
        """The settings among a script's constants (other constants, e.g. the data's, are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k.lower(): v for k, v in constants.items() if k.lower() in names}
        values.update(overrides)
        values["adam_betas"] = tuple(values["adam_betas"])
        return cls(**values)

    def identity(self) -> dict[str, Any]:
        """The settings that make a run this run (compared on resume)."""
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
                for f in dataclasses.fields(self) if f.metadata["identity"]}


def check_settings(settings: TrainSettings) -> None:
    """Every mistake in the settings at once, as one UserError naming the constants (sparknet.checks' rules, the
    ones a script's constants are checked against before it starts)."""
    from sparknet.checks import check_values

    check_values({f.name.upper(): getattr(settings, f.name) for f in dataclasses.fields(settings)})
