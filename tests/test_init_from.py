"""INIT_FROM: a run that starts from a trained model's weights (a run folder, a checkpoint-N, a folder laid out like
a Hub model) with a fresh optimizer, schedule and data position; the base recorded in the metadata and named in the
card; every refusal one line, before any work."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from sparknet.common.errors import UserError
from sparknet.export import card_data
from sparknet.run_files import METADATA
from tests.helpers import (
    read_steps,
    run_script,
    stream_args,
    train_args,
    train_packed,
    train_settings,
)
from tests.hub_server import HubServer

# one optimizer step at a learning rate far below fp32's resolution of the weights: the model stays the base's
# through a real training run, each weight within FROZEN_TOLERANCE (LEARNING_RATE must be positive, and the one step
# is at that peak: a weight at exactly 0 moves by about the LR)
FROZEN = dict(max_steps=1, target_tokens=None, learning_rate=1e-30, eval_steps=1, save_steps=1, sample_steps=0)
FROZEN_TOLERANCE = 1e-25


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def state_dict(folder: Path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(str(folder)).state_dict()


def assert_same_weights(folder: Path, base: Path) -> None:
    ours, theirs = state_dict(folder), state_dict(base)
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert torch.allclose(ours[name], tensor, rtol=0, atol=FROZEN_TOLERANCE), name


def plain_eval_loss(folder: Path, dataset: Path) -> float:
    """The validation loss of `folder`'s model by a plain transformers forward over the packed val blocks."""
    from sparknet.data.packed.dataset import PackedDataset

    model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    blocks = torch.from_numpy(np.asarray(PackedDataset(str(dataset), "val").tokens).astype(np.int64))
    with torch.no_grad():
        losses = [model(input_ids=block[None], labels=block[None]).loss.item() for block in blocks]
    return float(np.mean(losses))


def latest_checkpoint(run_dir: Path) -> Path:
    return max(run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))


@pytest.mark.slow
def test_packed_script_from_a_run_folder_starts_at_its_final_weights_and_records_it(finished, tiny_dataset: Path,
                                                                                    tmp_path: Path) -> None:
    _, base_tmp = finished
    base = base_tmp / "ckpt" / "run"
    proc = run_script("train_sparknet_v5.py", *train_args(tmp_path, tiny_dataset, init_from=base, record_batches=True,
                                                          **FROZEN))
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "ckpt" / "run"
    assert_same_weights(run_dir, base)
    # a fresh optimizer and schedule: the step count restarts (the base trained 40), no optimizer state carried over
    state = json.loads((run_dir / "checkpoint-1" / "trainer_state.json").read_text())
    metadata = json.loads((run_dir / METADATA).read_text())
    assert state["global_step"] == 1 and metadata["steps"] == 1
    assert read_steps(run_dir / "batches.jsonl")[1]["lr"] == 1e-30  # the one step at the peak, after no warmup
    assert metadata["base_model"] == {"init_from": str(base), "name": "run", "commit": None,
                                      "sha256": sha256(base / "model.safetensors"), "step": None}
    card = card_data("mine", metadata, {}, license="", language=["en"])
    assert card.base_model is None and "base_model" not in card.to_yaml()  # a local run's name is no Hub id
    # the base was exported with <|endoftext|> as its pad token; training never pads (packed blocks), so transformers
    # has no reason to ask for an attention mask (its warning came at blocks that begin or end with one)
    assert "attention_mask" not in proc.stderr, proc.stderr[-3000:]


def test_a_base_trains_without_transformers_asking_for_an_attention_mask(finished) -> None:
    """The base is exported with <|endoftext|> as its pad token (for batched generation); loaded to train, it has
    none, as a fresh model: training never pads (packed blocks), and transformers otherwise warns, once, to pass an
    attention mask at the first block that begins or ends with <|endoftext|> (the INIT_FROM run's log had it)."""
    from transformers.utils import logging as hf_logging

    from sparknet.train.init_from import load_base, resolve_base

    _, base_tmp = finished
    base = base_tmp / "ckpt" / "run"
    assert json.loads((base / "config.json").read_text())["pad_token_id"] is not None  # as exported
    model = load_base(resolve_base(str(base)), dropout=0.0)
    eos = model.config.eos_token_id
    ids = torch.tensor([[eos, 5, 6, 7], [8, 9, 10, eos]])  # blocks that begin and end with <|endoftext|>
    import logging

    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    library = hf_logging.get_logger("transformers")  # its own handler, not propagated: listened to directly
    library.warning_once.cache_clear()  # a warning said once per process
    library.addHandler(handler)
    try:
        model(input_ids=ids, labels=ids)
    finally:
        library.removeHandler(handler)
    assert not [line for line in said if "attention_mask" in line], said
    assert model.generation_config.pad_token_id == eos  # generation (the samples) still pads with it


def test_from_a_checkpoint_with_a_fresh_warmup(finished, tiny_dataset: Path, tmp_path: Path) -> None:
    _, base_tmp = finished
    checkpoint = latest_checkpoint(base_tmp / "ckpt" / "run")
    result = train_packed(train_settings(tmp_path, init_from=str(checkpoint), max_steps=4, target_tokens=None,
                                         warmup_ratio=0.5, record_batches=True), tiny_dataset)
    assert result.status == "finished" and result.metadata["steps"] == 4
    # the step-0 eval is the checkpoint's model: as a plain forward of it computes
    assert result.metadata["metrics"]["eval_loss_start"] == pytest.approx(plain_eval_loss(checkpoint, tiny_dataset),
                                                                          rel=1e-4)
    peak = train_settings(tmp_path).learning_rate
    lrs = [step["lr"] for _, step in sorted(read_steps(result.run_dir / "batches.jsonl").items())]
    assert lrs[0] == 0.0 and lrs[1] == pytest.approx(peak / 2) and max(lrs) == pytest.approx(peak)  # warmup from 0
    record = result.metadata["base_model"]
    assert record["name"] == f"run/{checkpoint.name}" and record["step"] == int(checkpoint.name.split("-")[1])
    assert record["sha256"] == sha256(checkpoint / "model.safetensors")
    assert card_data("mine", result.metadata, {}, license="", language=["en"]).base_model is None  # local


def hub_layout(base: Path, out: Path, commit: str = "a" * 40) -> Path:
    """`base`'s model and tokenizer saved as a Hub model's cache snapshot (save_pretrained), at `commit`."""
    from transformers import AutoTokenizer

    snapshot = out / "models--sparknet--tiny-base" / "snapshots" / commit
    AutoModelForCausalLM.from_pretrained(str(base)).save_pretrained(snapshot)
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(snapshot)
    return snapshot


@pytest.mark.slow
def test_streamed_script_from_a_hub_layout_folder(finished, corpus_config: Path, tokenizer_dir: Path,
                                                  tmp_path: Path) -> None:
    _, base_tmp = finished
    snapshot = hub_layout(base_tmp / "ckpt" / "run", tmp_path / "hub")
    proc = run_script("train_sparknet.py", *stream_args(tmp_path, corpus_config, tokenizer_dir, init_from=snapshot,
                                                        **FROZEN))
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "ckpt" / "run"
    assert_same_weights(run_dir, snapshot)
    record = json.loads((run_dir / METADATA).read_text())["base_model"]
    assert record["name"] == "sparknet/tiny-base" and record["commit"] == "a" * 40
    assert record["sha256"] == sha256(snapshot / "model.safetensors")


@pytest.mark.slow  # end to end through the loopback Hub (two trainer scripts): the full tier
def test_packed_script_from_a_hub_model_id(finished, tiny_dataset: Path, hub: HubServer, tmp_path: Path) -> None:
    """A Hub model id, downloaded through the loopback Hub (the real huggingface_hub and transformers over HTTP):
    the run starts at its weights, and the metadata records the id and the commit it resolved to."""
    _, base_tmp = finished
    folder = hub_layout(base_tmp / "ckpt" / "run", tmp_path / "saved")
    commit = hub.add_model("tinyco/tiny-base", {p.name: p for p in folder.iterdir() if p.is_file()})
    hub.add_model("tinyco/tiny-base", {"README.md": "moved on\n"})  # main moves on: the run's commit is main's
    commit = hub.add_model("tinyco/tiny-base", {p.name: p for p in folder.iterdir() if p.is_file()})
    proc = run_script("train_sparknet_v5.py", *train_args(tmp_path, tiny_dataset, init_from="tinyco/tiny-base",
                                                          **FROZEN), env=hub.env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "ckpt" / "run"
    assert_same_weights(run_dir, folder)
    record = json.loads((run_dir / METADATA).read_text())["base_model"]
    assert record["name"] == "tinyco/tiny-base" and record["commit"] == commit, record
    metadata = json.loads((run_dir / METADATA).read_text())
    assert card_data("mine", metadata, {}, license="", language=["en"]).base_model == "tinyco/tiny-base"  # a Hub id
    assert any(r.kind == "resolve-get" and r.path.endswith("/model.safetensors") for r in hub.requests), hub.requests
    # an id the Hub does not have is one line
    proc = run_script("train_sparknet_v5.py", *train_args(tmp_path / "other", tiny_dataset,
                                                          init_from="tinyco/no-such-model", **FROZEN),
                      env=hub.env(tmp_path))
    assert "INIT_FROM=tinyco/no-such-model: cannot read its config" in refusal(proc)


def refusal(proc) -> str:
    """The one line a refused script prints: exit 1, no traceback."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[-1]


def test_a_missing_folder_is_refused_in_one_line(tiny_dataset: Path, tmp_path: Path) -> None:
    """The trainer as the script runs it (a UserError is the script's one line: the script's own refusals are
    tested in tests/test_training.py)."""
    with pytest.raises(UserError) as exc:
        train_packed(train_settings(tmp_path, init_from=str(tmp_path / "checkpoints" / "nope")), tiny_dataset)
    line = one_line(exc)
    assert "INIT_FROM model folder" in line and "not found" in line and "nope" in line
    assert not (tmp_path / "ckpt").exists()  # before any work


def one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_an_incomplete_checkpoint_is_refused(finished, tiny_dataset: Path, tmp_path: Path) -> None:
    _, base_tmp = finished
    checkpoint = shutil.copytree(latest_checkpoint(base_tmp / "ckpt" / "run"), tmp_path / "base" / "checkpoint-40")
    (checkpoint / "model.safetensors").unlink()
    with pytest.raises(UserError) as exc:
        train_packed(train_settings(tmp_path, init_from=str(checkpoint)), tiny_dataset)
    assert "no complete weights" in one_line(exc) and "model.safetensors is missing" in str(exc.value)
    assert not (tmp_path / "ckpt").exists()


def test_an_unfinished_run_folder_is_refused_naming_its_checkpoints(finished, tiny_dataset: Path,
                                                                    tmp_path: Path) -> None:
    _, base_tmp = finished
    run = tmp_path / "base" / "half"
    shutil.copytree(latest_checkpoint(base_tmp / "ckpt" / "run"), run / "checkpoint-40")
    with pytest.raises(UserError) as exc:
        train_packed(train_settings(tmp_path, init_from=str(run)), tiny_dataset)
    assert "holds no model" in one_line(exc) and "checkpoint-40" in str(exc.value)


def test_another_vocabulary_is_refused_naming_both(corpus_dir: Path, tiny_dataset: Path, tmp_path: Path) -> None:
    from sparknet.bpe import train_bpe
    from sparknet.model.presets import build_model, get_preset
    from sparknet.tokenizer import save, wrap

    texts = [json.loads(line)["text"] for line in (corpus_dir / "prose.train.jsonl").read_text().splitlines()[:200]]
    other = wrap(train_bpe(texts, vocab_size=300), 128)
    base = tmp_path / "other-vocab"
    save(other, base)
    build_model(get_preset("sparknet-tiny"), len(other), other.eos_token_id).save_pretrained(base)
    with pytest.raises(UserError) as exc:
        train_packed(train_settings(tmp_path, init_from=str(base)), tiny_dataset)
    message = one_line(exc)
    assert f"vocabulary of {len(other)} tokens" in message and "has 1024" in message


def test_another_presets_shape_is_refused(finished, tiny_dataset: Path, tmp_path: Path) -> None:
    _, base_tmp = finished
    with pytest.raises(UserError) as exc:
        train_packed(train_settings(tmp_path, init_from=str(base_tmp / "ckpt" / "run"), model_preset="sparknet-demo"),
                     tiny_dataset)
    assert "MODEL_PRESET=sparknet-demo" in one_line(exc) and "set MODEL_PRESET=sparknet-tiny" in str(exc.value)


def test_without_model_preset_the_run_takes_the_bases(finished, tiny_dataset: Path, tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """MODEL_PRESET left out: a run from a base takes the preset of its shape, says so, and records it (so a resume
    that names it is the same run); only a preset that contradicts the base is refused (the test above)."""
    _, base_tmp = finished
    settings = train_settings(tmp_path, init_from=str(base_tmp / "ckpt" / "run"), model_preset=None, **FROZEN)
    with caplog.at_level("INFO", logger="sparknet"):
        result = train_packed(settings, tiny_dataset)
    assert result.status == "finished" and result.metadata["model"]["name"] == "sparknet-tiny"
    assert f"MODEL_PRESET not set: sparknet-tiny, the shape of INIT_FROM={base_tmp / 'ckpt' / 'run'}" in caplog.text
    again = train_packed(train_settings(tmp_path, init_from=str(base_tmp / "ckpt" / "run"),
                                        model_preset="sparknet-tiny", **FROZEN), tiny_dataset)
    assert again.status == "already_finished"  # the same run: its identity names the preset either way


def test_blocks_longer_than_the_bases_context_are_refused(random_model: Path, tiny_dataset: Path,
                                                          tmp_path: Path) -> None:
    """A base of a shape no preset has (here 2 layers of width 32) is taken as it is; its context (32) is fixed."""
    with pytest.raises(UserError) as exc:
        train_packed(train_settings(tmp_path, init_from=str(random_model)), tiny_dataset)
    assert "context of 32 tokens" in one_line(exc) and "blocks of 128 tokens" in str(exc.value)


def test_init_from_is_part_of_the_runs_identity(finished, tiny_dataset: Path, tmp_path: Path) -> None:
    _, base_tmp = finished
    base = base_tmp / "ckpt" / "run"
    settings = dict(max_steps=2, target_tokens=None, eval_steps=1, save_steps=1, sample_steps=0)
    assert train_packed(train_settings(tmp_path, **settings), tiny_dataset).status == "finished"
    (tmp_path / "ckpt" / "run" / METADATA).unlink()  # as if it were interrupted: it would resume
    with pytest.raises(UserError) as exc:
        train_packed(train_settings(tmp_path, init_from=str(base), **settings), tiny_dataset)
    assert "INIT_FROM" in one_line(exc) and "other settings" in str(exc.value)


def test_a_run_from_a_base_resumes_its_own_checkpoint(finished, tiny_dataset: Path, tmp_path: Path) -> None:
    """Stopped after its step-2 checkpoint, the run goes on from that checkpoint, not from the base again: it ends
    with the weights of the uninterrupted run, bit for bit."""
    _, base_tmp = finished
    settings = train_settings(tmp_path, init_from=str(base_tmp / "ckpt" / "run"), max_steps=4, target_tokens=None,
                              eval_steps=2, save_steps=2, sample_steps=0)
    run_dir = train_packed(settings, tiny_dataset).run_dir
    uninterrupted = state_dict(run_dir / "checkpoint-4")  # step 4's weights (the export is the best checkpoint's)
    for name in (METADATA, "model.safetensors", "config.json"):  # as if killed before its last save
        (run_dir / name).unlink()
    shutil.rmtree(run_dir / "checkpoint-4")
    result = train_packed(settings, tiny_dataset)
    assert result.status == "finished" and result.metadata["steps"] == 4
    assert json.loads((run_dir / "checkpoint-4" / "trainer_state.json").read_text())["global_step"] == 4
    resumed = state_dict(run_dir / "checkpoint-4")
    assert all(torch.equal(resumed[name], tensor) for name, tensor in uninterrupted.items())


def test_a_base_of_no_presets_shape_is_trained_as_it_is(tokenizer_dir: Path, tiny_dataset: Path, tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A Hub-like model of a shape no preset has (2 layers of width 32, context 128): MODEL_PRESET is ignored with
    a line, the metadata names no preset, the weights are the base's."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    base = tmp_path / "narrow"
    config = GPT2Config(vocab_size=len(tok), n_positions=128, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
    GPT2LMHeadModel(config).save_pretrained(base)
    tok.save_pretrained(base)
    with caplog.at_level("INFO", logger="sparknet.train"):
        result = train_packed(train_settings(tmp_path, init_from=str(base), **FROZEN), tiny_dataset)
    assert "MODEL_PRESET=sparknet-tiny is ignored" in caplog.text
    assert result.metadata["model"]["name"] is None and result.metadata["model"]["n_embd"] == 32
    assert result.metadata["base_model"]["name"] == "narrow"
    assert_same_weights(result.run_dir, base)


def test_the_base_is_recorded_when_the_run_starts_and_a_resume_checks_it(finished, tiny_dataset: Path,
                                                                         tmp_path: Path) -> None:
    """The base's weights replaced between the start and a resume: the resume exited 0 and the metadata recorded
    the replacement. The run records its base once, as it starts; a resume with changed weights is refused in one
    line naming both hashes; a deleted base is answered with what works (restore it, or go on without it), and
    going on without it finishes the run with the base it started from in the metadata."""
    from sparknet.train.init_from import BASE_RECORD

    _, base_tmp = finished
    base = shutil.copytree(base_tmp / "ckpt" / "run", tmp_path / "base" / "run")
    original = sha256(base / "model.safetensors")
    settings = dict(max_steps=4, target_tokens=None, eval_steps=2, save_steps=2, sample_steps=0)
    run_dir = train_packed(train_settings(tmp_path, init_from=str(base), **settings), tiny_dataset).run_dir
    assert json.loads((run_dir / BASE_RECORD).read_text())["sha256"] == original
    for name in (METADATA, "model.safetensors", "config.json"):  # as if killed before its last save
        (run_dir / name).unlink()
    shutil.rmtree(run_dir / "checkpoint-4")
    # other weights of the same shape at the base's place
    shutil.copy(base_tmp / "ckpt" / "run" / "checkpoint-24" / "model.safetensors",
                base / "model.safetensors")
    replaced = sha256(base / "model.safetensors")
    with pytest.raises(UserError) as exc:
        train_packed(train_settings(tmp_path, init_from=str(base), **settings), tiny_dataset)
    message = one_line(exc)
    assert message.startswith(f"INIT_FROM={base} is not the base run run started from: its weights' sha256 is "
                              f"{replaced[:12]}..., the run started from sha256 {original[:12]}... ")
    assert "restore that base, start a new RUN_NAME from this one, or go on without it" in message
    assert not (run_dir / "checkpoint-4").exists()  # nothing trained
    shutil.rmtree(base)
    with pytest.raises(UserError) as exc:
        train_packed(train_settings(tmp_path, init_from=str(base), **settings), tiny_dataset)
    message = one_line(exc)
    assert message.startswith(f"INIT_FROM={base}: the base run run started from (sha256 {original[:12]}..., "
                              f"recorded in {run_dir / BASE_RECORD}) is gone. A resume takes its weights from its own "
                              "checkpoint and from the base only its shape and tokenizer: restore the base at ")
    assert "go on without it: INIT_FROM=None with ALLOW_CONFIG_CHANGE=True" in message
    # the advice works: no second refusal, the run finishes from its checkpoint, the record is the original base's
    result = train_packed(train_settings(tmp_path, init_from=None, allow_config_change=True, **settings),
                          tiny_dataset)
    assert result.status == "finished" and result.metadata["steps"] == 4
    assert result.metadata["base_model"]["sha256"] == original and result.metadata["base_model"]["name"] == "run"


@pytest.mark.slow
def test_a_run_folder_whose_model_is_cut_short_is_one_line_before_anything_is_created(
        finished, tiny_dataset: Path, tmp_path: Path) -> None:
    """A 27-line SafetensorError once the new run's folder existed; now one line naming the file and the run's
    complete checkpoints, as a checkpoint-N cut short already had, and nothing is created."""
    _, base_tmp = finished
    base = shutil.copytree(base_tmp / "ckpt" / "run", tmp_path / "base" / "run")
    weights = base / "model.safetensors"
    with weights.open("r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    proc = run_script("train_sparknet_v5.py", *train_args(tmp_path, tiny_dataset, init_from=base))
    line = refusal(proc)
    assert line.startswith(f"error: INIT_FROM={base}: {weights} is damaged or cut short (Error while deserializing "
                           "header: incomplete metadata, file not fully covered, "), line
    assert "pass one of its run's complete checkpoints (checkpoint-" in line
    assert len([x for x in proc.stderr.splitlines() if x.strip()]) <= 2, proc.stderr  # the log's first line at most
    assert not (tmp_path / "ckpt").exists()


def test_a_bases_eos_embedding_keeps_learning(tokenizer_dir: Path, tmp_path: Path) -> None:
    """An export sets EOS as its pad id (for batched generation); NanoChat's embedding would then give EOS's row no
    gradient (nn.Embedding's padding_idx) in a run from it, which never pads."""
    from sparknet.model.presets import build_model, get_preset, set_for_use
    from sparknet.tokenizer import load_tokenizer
    from sparknet.train.init_from import load_base, resolve_base

    tokenizer = load_tokenizer(str(tokenizer_dir))
    exported = build_model(get_preset("sparknet-nanochat-tiny"), len(tokenizer), tokenizer.eos_token_id)
    set_for_use(exported, tokenizer)
    exported.save_pretrained(tmp_path)
    assert AutoModelForCausalLM.from_pretrained(str(tmp_path)).get_input_embeddings().padding_idx is not None
    model = load_base(resolve_base(str(tmp_path)), dropout=0.0)
    eos = torch.tensor([[tokenizer.eos_token_id, 5, tokenizer.eos_token_id]])
    model(input_ids=eos, labels=eos).loss.backward()
    assert model.get_input_embeddings().weight.grad[tokenizer.eos_token_id].abs().sum() > 0
