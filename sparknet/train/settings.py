"""The training settings both trainer scripts share: one dataclass field per constant, declared once.

The scripts' constants stay the one source of the defaults and of the docs (the users edit them at the top of the
script, and read their comments: --help and docs/constants.md print those comments, and tests/test_layout.py checks
that both trainer scripts say the same of each setting); each field here carries what the rest of the code needs to
know about it:
- `identity`: whether it belongs to the run's identity. Settings that change the model, the order of the data or
  the optimisation are compared when a run resumes (a change is refused unless ALLOW_CONFIG_CHANGE); the others
  (where and how often to log, save, sample) may differ between attempts;
- its check: the rule for the constant of the same name in `sparknet.config.checks.RULES`, the table every script's
  constants are checked against before the script starts (`check_settings` applies it here too).
Adding a setting: a constant with its comment in both trainer scripts, a field here, a rule in sparknet.config.checks
when it has a range, and its use (e.g. `sparknet.train.hf_trainer.training_arguments`); `make docs` writes it into
docs/constants.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


def setting(*, identity: bool = True) -> Any:
    """A settings field: no default (the script's constant is the default, its comment the doc) and its identity
    flag."""
    return dataclasses.field(metadata={"identity": identity})


@dataclass
class TrainSettings:
    """A trainer script's training constants, lower-cased. No defaults here: the script's constants are the one
    source of them (`sparknet.config.cli.script_constants` reads them for code that has no script)."""

    run_name: str = setting(identity=False)
    model_preset: str | None = setting()  # None: INIT_FROM's shape, else DEFAULT_PRESET (run.preset_name)
    init_from: str | None = setting()  # a base model's weights to start from; a resume must name the same
    target_tokens: int | None = setting()
    # the budget in steps: in the run's identity as the tokens it gives (`run.run_identity`'s target_tokens), so that
    # TARGET_TOKENS and MAX_STEPS that give the same steps are the same run
    max_steps: int = setting(identity=False)
    global_batch_size: int = setting()
    # the micro-batch sizes memory only: the accumulation makes up the global batch, so it may change between attempts
    batch_size: int = setting(identity=False)
    learning_rate: float = setting()
    optimizer: str = setting()
    muon_learning_rate: float = setting()
    embedding_learning_rate: float | None = setting()
    lr_schedule: str = setting()
    decay_ratio: float = setting()
    min_lr_ratio: float = setting()
    warmup_ratio: float = setting()
    weight_decay: float = setting()
    adam_betas: tuple[float, float] = setting()
    max_grad_norm: float = setting()
    dropout: float = setting()
    eval_steps: int = setting(identity=False)
    save_steps: int = setting(identity=False)
    save_total_limit: int = setting(identity=False)
    sample_steps: int = setting(identity=False)
    sample_prompts: list[str] = setting(identity=False)
    sample_max_new_tokens: int = setting(identity=False)
    sample_temperature: float = setting(identity=False)
    sample_top_k: int = setting(identity=False)
    sample_seed: int = setting(identity=False)
    benchmark_every: int = setting(identity=False)
    benchmark_tasks: list[str] = setting(identity=False)
    benchmark_limit: int = setting(identity=False)
    logging_steps: int = setting(identity=False)
    compile: str = setting(identity=False)
    fused_cross_entropy: bool = setting(identity=False)
    seed: int = setting()
    peak_tflops: float = setting(identity=False)
    nonfinite: str = setting(identity=False)
    allow_config_change: bool = setting(identity=False)
    record_batches: bool = setting(identity=False)
    checkpoints_dir: str = setting(identity=False)
    logs_dir: str = setting(identity=False)

    @classmethod
    def from_constants(cls, constants: dict[str, Any], **overrides: Any) -> TrainSettings:
        """The settings among a script's constants (other constants, e.g. the data's, are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k.lower(): v for k, v in constants.items() if k.lower() in names}
        values.update(overrides)
        values["adam_betas"] = tuple(values["adam_betas"])
        return cls(**values)

    def tokens_asked(self, block_size: int) -> int | None:
        """The budget the settings give, in tokens: TARGET_TOKENS, or MAX_STEPS x GLOBAL_BATCH_SIZE blocks of
        `block_size` (exactly MAX_STEPS optimizer steps); None when neither is set (the data's default then)."""
        if self.max_steps:
            return self.max_steps * self.global_batch_size * block_size
        return self.target_tokens

    def identity(self) -> dict[str, Any]:
        """The settings that make a run this run (compared on resume)."""
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
                for f in dataclasses.fields(self) if f.metadata["identity"]}


def check_settings(settings: TrainSettings) -> None:
    """Every mistake in the settings at once, as one UserError naming the constants (sparknet.config.checks' rules, the
    ones a script's constants are checked against before it starts)."""
    from sparknet.config.checks import check_values

    check_values({f.name.upper(): getattr(settings, f.name) for f in dataclasses.fields(settings)})
