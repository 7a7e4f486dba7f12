"""INIT_FROM: a run that starts from a trained model's weights (continued pretraining, an annealing run) instead of
a fresh initialisation. Only the weights are taken: the optimizer, the LR schedule and the data position start
fresh, which is what sets it apart from a resume (the same run continued from its own checkpoint).

The base is a run folder (its final model, as the trainer exports it), a `checkpoint-N` inside one (complete, as
its marker vouches), or a Hub model id (a folder laid out like one works alike). Everything that could make the run
fail is checked before any work: the base is there and whole, its tokenizer is the run's (same vocabulary and EOS),
its shape is MODEL_PRESET's, and its context holds the data's blocks (a loaded model's position table is fixed).
A run that resumes loads its own checkpoint over these weights (the Trainer's resume), so it never re-initialises.

What a resume needs from the base: its shape and tokenizer (the model is built from it before the checkpoint's weights
are loaded over it), and that it is the base the run started from. The run records the base once, when it starts
(BASE_RECORD in the run folder: its weights' sha256, or a Hub model's commit), and that record is what the metadata
says; a resume with a base whose weights changed is refused in one line, a Hub base is read at the recorded commit,
and a base deleted since is answered with what works: restore it, or go on without it (INIT_FROM=None and
ALLOW_CONFIG_CHANGE=True: the checkpoint holds the weights; the record still names the base).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparknet.common.errors import UserError
from sparknet.model.architectures import ARCHITECTURES
from sparknet.model.presets import PRESETS, Preset
from sparknet.run_files import METADATA, WEIGHT_FILES, checkpoint_step, checkpoints_by_step, read_metadata
from sparknet.train.folders import incomplete

log = logging.getLogger("sparknet.train")
BASE_RECORD = "base_model.json"  # in the run folder: the base as the run started from it (BaseModel.record())


@dataclass(frozen=True)
class BaseModel:
    """The model a run starts from: what INIT_FROM said, what `from_pretrained` loads, and how it is recorded."""

    spec: str  # INIT_FROM as given
    source: str  # the folder (absolute) or the Hub id
    name: str  # the card's base_model: the run's name (RUN or RUN/checkpoint-N) or the Hub id
    folder: Path | None  # None for a Hub id
    config: Any  # its transformers config
    commit: str | None = None  # the Hub commit it resolved to, when known
    sha256: str | None = None  # of its weights file (a local folder)

    def record(self) -> dict[str, Any]:
        """What training_metadata.json says of it ("base_model")."""
        return {"init_from": self.spec, "name": self.name, "commit": self.commit, "sha256": self.sha256,
                "step": checkpoint_step(self.folder) if self.folder else None}


def resolve_run_base(spec: str, run_dir: Path) -> BaseModel:
    """The base INIT_FROM names for the run in `run_dir` (`resolve_base`), checked, when the run will resume (it
    recorded its base and holds a complete checkpoint), to be the base it started from: one line, before any work,
    for a base whose weights changed or that is gone, saying what works. A Hub base is read at the recorded commit."""
    from sparknet.common.runtime import project_path
    from sparknet.train.folders import latest_complete_checkpoint

    recorded = read_base_record(run_dir) if latest_complete_checkpoint(run_dir) is not None else None
    if recorded is None or (run_dir / METADATA).is_file():  # a fresh start, or a finished run (it trains no more)
        return resolve_base(spec)
    then = recorded.get("sha256")
    shown = f"sha256 {then[:12]}..." if then else f"commit {recorded.get('commit')}"
    without = ("or go on without it: INIT_FROM=None with ALLOW_CONFIG_CHANGE=True (the checkpoint holds the "
               "weights; MODEL_PRESET must name the base's shape; the metadata still records the base)")
    if then and not project_path(spec).exists():
        raise UserError(f"INIT_FROM={spec}: the base run {run_dir.name} started from ({shown}, recorded in "
                        f"{run_dir / BASE_RECORD}) is gone. A resume takes its weights from its own checkpoint and "
                        f"from the base only its shape and tokenizer: restore the base at {spec}, {without}")
    base = resolve_base(spec, commit=recorded.get("commit") if not then else None)
    if then and base.sha256 != then:
        raise UserError(f"INIT_FROM={spec} is not the base run {run_dir.name} started from: its weights' sha256 is "
                        f"{(base.sha256 or '')[:12]}..., the run started from {shown} (recorded in "
                        f"{run_dir / BASE_RECORD}): restore that base, start a new RUN_NAME from this one, {without}")
    return base


def read_base_record(run_dir: Path) -> dict[str, Any] | None:
    """The base the run in `run_dir` recorded when it started (BASE_RECORD), or None (no base, or a run begun before
    bases were recorded)."""
    from sparknet.common.runtime import read_json_object

    path = run_dir / BASE_RECORD
    if not path.is_file():
        return None
    return read_json_object(path, "it records the base model the run started from: restore it from a backup, or "
                                  "start again with another RUN_NAME")


def resolve_base(spec: str, commit: str | None = None) -> BaseModel:
    """The base model INIT_FROM names, checked to be there and whole (its config read, its safetensors weights'
    layout; the weights are loaded by `load_base`); one line for a missing folder, a run that has no final model, a
    model file cut short, or an incomplete checkpoint. A Hub id is read at `commit` when given (a resumed run's)."""
    from sparknet.common.folder_or_hub import local_path, not_found
    from sparknet.common.runtime import file_sha256, project_path

    folder = project_path(spec).resolve()
    if not folder.exists():
        if checkpoint_step(Path(spec)) is not None or local_path(spec) is not None:
            raise UserError(f"{not_found('INIT_FROM model folder', spec, folder)}: pass checkpoints/RUN_NAME of a "
                            "finished run, a checkpoint-N inside it, or a Hub model id")
        return _hub_base(spec, commit)
    if not folder.is_dir():
        raise UserError(f"INIT_FROM={spec}: {folder} is a file, not a model folder: pass checkpoints/RUN_NAME, a "
                        "checkpoint-N inside it, or a Hub model id")
    if checkpoint_step(folder) is not None and (why := incomplete(folder)) is not None:
        raise UserError(f"INIT_FROM={spec} has no complete weights: {why}; pass another checkpoint-N of that run, "
                        "or the run folder")
    weights = next((folder / name for name in WEIGHT_FILES if (folder / name).is_file()), None)
    if weights is None or not (folder / "config.json").is_file():
        held = [p.name for p in checkpoints_by_step(folder)]
        hint = (f"its run has not finished; pass one of its checkpoints ({', '.join(held[-3:])})" if held else
                "pass checkpoints/RUN_NAME of a finished run, a checkpoint-N inside it, or a Hub model id")
        raise UserError(f"INIT_FROM={spec}: {folder} holds no model (no config.json and weights): {hint}")
    _check_safetensors(spec, folder, weights)
    name, hub_commit = _local_name(folder)
    return BaseModel(spec=spec, source=str(folder), name=name, folder=folder, config=_config(spec, str(folder)),
                     commit=hub_commit, sha256=file_sha256(weights))


def _check_safetensors(spec: str, folder: Path, weights: Path) -> None:
    """Each safetensors file of the base (one, or the shards its index names) opens whole: its header is read and
    must cover the file (cheap; no tensor is loaded). A file cut short (a copy that stopped, a full disk) is one
    line here, before any work, instead of the library's many lines once the run folder exists."""
    import json

    from safetensors import safe_open

    files = [weights]
    if weights.name.endswith(".index.json"):
        if not weights.name.startswith("model.safetensors"):
            return  # pytorch_model.bin shards: torch reads them
        try:
            shards = sorted(set(json.loads(weights.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UserError(f"INIT_FROM={spec}: {weights} is damaged ({type(exc).__name__}): restore the model, or "
                            "pass another one") from None
        files = [folder / shard for shard in shards]
    elif weights.suffix != ".safetensors":
        return
    for path in files:
        try:
            with safe_open(str(path), "pt") as opened:
                opened.keys()
        except Exception as exc:
            held = [p.name for p in checkpoints_by_step(folder) if incomplete(p) is None]
            hint = (f"pass one of its run's complete checkpoints ({', '.join(held[-3:])}), or restore the model"
                    if held else "restore the model (copy it again), or pass another one")
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise UserError(f"INIT_FROM={spec}: {path} is damaged or cut short ({reason}, {path.stat().st_size:,} "
                            f"bytes): {hint}" if path.is_file() else
                            f"INIT_FROM={spec}: {path}, a shard its index names, is missing: {hint}") from None


def _local_name(folder: Path) -> tuple[str, str | None]:
    """A local base's name for the card, and the Hub commit when known: a Hub cache snapshot
    (models--OWNER--NAME/snapshots/SHA) is that Hub id at that commit; a run's checkpoint is RUN/checkpoint-N; a run
    folder its RUN_NAME; anything else its folder's name (never a path of this machine)."""
    repo = folder.parent.parent.name if folder.parent.name == "snapshots" else ""
    if repo.startswith("models--"):
        return repo.removeprefix("models--").replace("--", "/"), folder.name
    if checkpoint_step(folder) is not None:
        return f"{folder.parent.name}/{folder.name}", None
    run = (read_metadata(folder) or {}).get("run_name") if (folder / METADATA).is_file() else None
    return str(run or folder.name), None


def _hub_base(spec: str, commit: str | None = None) -> BaseModel:
    """A Hub model id, pinned to `commit`, else to the commit its config.json resolves to now (from the Hub, or the
    cache offline): the config and the weights are read at that commit, which the metadata records, even if its
    branch moves."""
    commit = commit or _hub_commit(spec)
    config = _config(spec, spec, commit)
    return BaseModel(spec=spec, source=spec, name=spec, folder=None, config=config, commit=commit)


def _hub_commit(spec: str) -> str | None:
    """The commit of the Hub model `spec`'s main branch, as its downloaded config.json's snapshot folder names it
    (huggingface_hub's cache layout: models--OWNER--NAME/snapshots/COMMIT/config.json); None when unknown."""
    from huggingface_hub import hf_hub_download

    try:
        path = Path(hf_hub_download(spec, "config.json"))
    except Exception:  # reported by _config, which reads the same file, with the library's reason
        return None
    return path.parent.name if path.parent.parent.name == "snapshots" else None


def _config(spec: str, source: str, revision: str | None = None) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source, revision=revision)
    except Exception as exc:  # reported against the user's value with the library's reason
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise UserError(f"INIT_FROM={spec}: cannot read its config ({type(exc).__name__}: {first}); a Hub id needs "
                        "network access or a cached copy") from None


def base_shape(base: BaseModel) -> Preset:
    """The base's shape as a Preset (its context included); one line for an architecture SparkNet does not train."""
    kind = base.config.model_type
    if kind not in ARCHITECTURES:
        raise UserError(f"INIT_FROM={base.spec} is a {kind} model: SparkNet trains {', '.join(ARCHITECTURES)} models")
    return Preset(**ARCHITECTURES[kind].shape(base.config), arch=kind)


def base_preset(base: BaseModel) -> str | None:
    """The preset whose shape the base has (its context aside), or None for a shape no preset has."""
    shape = base_shape(base)
    return next((name for name, other in PRESETS.items()
                 if dataclasses.replace(other, n_positions=shape.n_positions) == shape), None)


def check_base(base: BaseModel, preset_name: str | None, block_size: int, tokenizer: Any,
               tokenizer_source: str) -> Preset:
    """The model's shape for a run from `base`: the base's. MODEL_PRESET, when set, must name it (a preset of
    another shape contradicts the base and is refused); a base of a shape no preset has, e.g. a Hub model, is taken as
    it is, with a line saying so. Its context is fixed, so blocks longer than it are refused; and its vocabulary and
    EOS must be the tokenizer's."""
    shape = base_shape(base)
    matching = base_preset(base)
    if preset_name is not None and preset_name != matching:
        preset = PRESETS[preset_name]
        if matching:
            raise UserError(f"MODEL_PRESET={preset_name} is {_describe(preset)}, but INIT_FROM={base.spec} is "
                            f"{_describe(shape)}: set MODEL_PRESET={matching}, the base's shape, or leave it out")
        log.info("INIT_FROM=%s is %s, no preset's shape: MODEL_PRESET=%s is ignored, the base's shape is trained",
                 base.spec, _describe(shape), preset_name)
    elif preset_name is None and matching is None:
        log.info("INIT_FROM=%s is %s, no preset's shape: the base's shape is trained", base.spec, _describe(shape))
    if block_size > shape.n_positions:
        raise UserError(f"INIT_FROM={base.spec} has a context of {shape.n_positions} tokens, shorter than the data's "
                        f"blocks of {block_size} tokens: train it on blocks of at most {shape.n_positions} tokens "
                        "(BLOCK_SIZE, or a dataset built so)")
    check_tokenizer(base, tokenizer, tokenizer_source)
    return shape


def _describe(shape: Preset) -> str:
    return f"a {shape.n_layer}-layer, width-{shape.n_embd}, {shape.n_head}-head {shape.arch}"


def check_tokenizer(base: BaseModel, tokenizer: Any, tokenizer_source: str) -> None:
    """The base's vocabulary (its tokenizer's, when it has one; else its config's size) and EOS id must be the run's
    tokenizer's: the embedding rows are the tokens' meanings. One line naming both otherwise."""
    theirs = _base_tokenizer(base)
    ours = (len(tokenizer), tokenizer.eos_token_id)
    if theirs is not None:
        base_vocab, base_eos = len(theirs), theirs.eos_token_id
        same_tokens = theirs.get_vocab() == tokenizer.get_vocab()
    else:
        base_vocab, base_eos, same_tokens = base.config.vocab_size, base.config.eos_token_id, True
    if (base_vocab, base_eos) != ours or not same_tokens or base.config.vocab_size != len(tokenizer):
        other = "the same size, other tokens; " if (base_vocab, base_eos) == ours and not same_tokens else ""
        raise UserError(f"INIT_FROM={base.spec} has a vocabulary of {base_vocab} tokens with EOS id {base_eos}, the "
                        f"run's tokenizer {tokenizer_source} has {ours[0]} with EOS id {ours[1]} ({other}the weights "
                        "are of the base's tokens): train with the base model's tokenizer")


def _base_tokenizer(base: BaseModel) -> Any | None:
    """The base's own tokenizer (a checkpoint saved without one: its run's), or None when it has none."""
    from sparknet.tokenizer import load_tokenizer

    folder = base.folder
    if folder is not None:
        holder = next((f for f in (folder, folder.parent) if (f / "tokenizer.json").is_file()), None)
        return load_tokenizer(str(holder)) if holder is not None else None
    try:
        return load_tokenizer(base.source)
    except UserError:
        return None


def load_base(base: BaseModel, dropout: float) -> Any:
    """The base's weights as the model to train (fp32, SDPA attention, the run's dropout); the optimizer, schedule
    and data position are the Trainer's fresh ones."""
    import torch
    from transformers import AutoModelForCausalLM

    from sparknet.common.runtime import hide_library_progress_bars
    from sparknet.model.presets import with_special_ids

    hide_library_progress_bars()
    config = base.config
    for key in ARCHITECTURES[config.model_type].dropouts:
        setattr(config, key, dropout)
    # as a fresh model has it: no pad token while training (packed blocks never pad). A base exported with
    # <|endoftext|> as its pad token made transformers warn for an attention mask at the first block that begins or
    # ends with one; generation keeps its pad id (with_special_ids), and the export sets it again (set_for_use)
    config.pad_token_id = None
    # a Hub id's weights at the commit its config was read at (a local folder has no revisions)
    revision = base.commit if base.folder is None else None
    model = AutoModelForCausalLM.from_pretrained(base.source, config=config, dtype=torch.float32,
                                                 attn_implementation="sdpa", revision=revision)
    model.loss_type = "ForCausalLM"  # as sparknet.model.presets.build_model: transformers warns otherwise
    bos = config.bos_token_id if config.bos_token_id is not None else config.eos_token_id
    return with_special_ids(model, bos, config.eos_token_id)
