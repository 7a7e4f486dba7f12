"""The OPTIMIZER registry (sparknet.model.optimizers): the names the rule, --help and the FSDP check read, and what each
builds, checked against the plain transformers Trainer's own optimizer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from sparknet.common.errors import UserError
from sparknet.config.checks import RULES, check_values
from sparknet.model.muon import MuonAdamW, hidden_matrices
from sparknet.model.optimizers import OPTIMIZERS
from sparknet.train.hf_trainer import SparkTrainer
from tests.helpers import train_settings


def _model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2))


def _args(tmp_path: Path) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path), learning_rate=2e-3, weight_decay=0.1, adam_beta1=0.8,
                             adam_beta2=0.9, optim="adamw_torch", report_to="none", use_cpu=True)


def _groups(optimizer: torch.optim.Optimizer) -> list[tuple[list[int], dict]]:
    return [([id(p) for p in g["params"]], {k: v for k, v in g.items() if k != "params"})
            for g in optimizer.param_groups]


def test_the_rule_and_help_take_their_names_from_the_registry() -> None:
    """Whatever the registry holds (adamw, the default, among them): the rule allows exactly its names, and its
    message and --help list them all."""
    names = list(OPTIMIZERS)
    assert "adamw" in names and RULES["OPTIMIZER"].choices == tuple(names)
    for name in names:
        check_values({"OPTIMIZER": name})
    with pytest.raises(UserError) as refused:
        check_values({"OPTIMIZER": "adam"})
    listed = str(refused.value).removeprefix("OPTIMIZER='adam': expected ").removesuffix(" (did you mean adamw?)")
    assert listed.replace(" or ", ", ").split(", ") == names, str(refused.value)
    out = subprocess.run([sys.executable, "scripts/train_sparknet_v5.py", "--help"], capture_output=True, text=True,
                         check=True).stdout
    assert f"(one of: {', '.join(names)})" in next(line for line in out.splitlines() if "--optimizer" in line)


def test_adamw_is_the_plain_trainers_own_optimizer(tmp_path: Path) -> None:
    model = _model()
    ours = SparkTrainer(model=model, args=_args(tmp_path), settings=train_settings(tmp_path, optimizer="adamw"))
    plain = Trainer(model=model, args=_args(tmp_path))
    built, reference = ours.create_optimizer(), plain.create_optimizer()
    assert type(built) is type(reference) is torch.optim.AdamW
    assert _groups(built) == _groups(reference)
    no_decay = {n for n, p in model.named_parameters() if id(p) in _groups(built)[1][0]}
    assert no_decay and all(n.endswith("bias") or ".ln_" in n for n in no_decay)  # biases and norms: no decay


def test_muon_takes_the_hidden_matrices_at_its_own_rate(tmp_path: Path) -> None:
    model = _model()
    trainer = SparkTrainer(model=model, args=_args(tmp_path),
                           settings=train_settings(tmp_path, optimizer="muon", muon_learning_rate=5e-3))
    built = trainer.create_optimizer()
    assert isinstance(built, MuonAdamW) and trainer.create_optimizer() is built
    hidden = {id(p) for n, p in model.named_parameters() if n in hidden_matrices(model)}
    assert hidden and {id(p) for g in built.muon.param_groups for p in g["params"]} == hidden
    assert [g["lr"] for g in built.muon.param_groups] == [5e-3]
    assert {g["lr"] for g in built.adamw.param_groups} == {2e-3}
    assert {id(p) for g in built.adamw.param_groups for p in g["params"]} == {
        id(p) for p in model.parameters()} - hidden


def test_an_optimizer_that_cannot_step_shards_says_why_under_fsdp() -> None:
    assert OPTIMIZERS["adamw"].not_under_fsdp is None
    assert "whole weight matrix" in OPTIMIZERS["muon"].not_under_fsdp


def test_muon_trains_the_input_embedding_at_its_own_rate_and_only_it(tmp_path: Path) -> None:
    """EMBEDDING_LEARNING_RATE: the input embedding's group at that LR; the untied output layer, the other tables and
    the norms at LEARNING_RATE; the hidden matrices at MUON_LEARNING_RATE. None: the embedding at LEARNING_RATE."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, tie_word_embeddings=False))
    embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    lr_of = {}
    for rate in (8e-3, None):
        trainer = SparkTrainer(model=model, args=_args(tmp_path), settings=train_settings(
            tmp_path, optimizer="muon", muon_learning_rate=5e-3, embedding_learning_rate=rate))
        built = trainer.create_optimizer()
        lr_of[rate] = {id(p): g["lr"] for g in built.param_groups for p in g["params"]}
    assert lr_of[8e-3][id(embedding)] == 8e-3 and lr_of[None][id(embedding)] == 2e-3
    assert lr_of[8e-3][id(head)] == lr_of[None][id(head)] == 2e-3
    others = set(lr_of[None]) - {id(embedding)}
    assert others and all(lr_of[8e-3][p] == lr_of[None][p] for p in others)  # nothing else moves
    assert sorted(set(lr_of[None].values())) == [2e-3, 5e-3]


def test_an_embedding_rate_that_the_optimizer_would_ignore_is_refused(tmp_path: Path) -> None:
    """AdamW trains every parameter at LEARNING_RATE: EMBEDDING_LEARNING_RATE with it would be ignored without a
    word, so the launch is refused in one line naming both constants (every Muon variant takes it)."""
    from sparknet.train.hf_trainer import check_launch

    cpu = {"kind": "cpu", "name": "cpu"}
    with pytest.raises(UserError, match=r"EMBEDDING_LEARNING_RATE=0.008 with OPTIMIZER=adamw.*set OPTIMIZER=muon"):
        check_launch(train_settings(tmp_path, optimizer="adamw", embedding_learning_rate=8e-3), cpu)
    check_launch(train_settings(tmp_path, optimizer="adamw"), cpu)
    for name, choice in OPTIMIZERS.items():
        if name != "adamw":
            assert "embedding_learning_rate" in choice.settings, name
            check_launch(train_settings(tmp_path, optimizer=name, embedding_learning_rate=8e-3), cpu)
