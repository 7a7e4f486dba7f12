"""LR_SCHEDULE=wsd: warmup, the peak held, then a linear decay over the last DECAY_RATIO of the steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import get_scheduler

from sparknet.train.hf_trainer import lr_schedule
from tests.helpers import train_settings


@pytest.mark.parametrize(("decay_ratio", "decay_from"), [(0.2, 80), (0.5, 50)])
def test_wsd_decays_over_the_last_decay_ratio_of_the_steps(decay_ratio: float, decay_from: int,
                                                           tmp_path: Path) -> None:
    settings = train_settings(tmp_path, lr_schedule="wsd", decay_ratio=decay_ratio, min_lr_ratio=0.1)
    arguments = lr_schedule(settings, 100)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = get_scheduler(arguments["lr_scheduler_type"], optimizer, num_warmup_steps=10,
                              num_training_steps=100, scheduler_specific_kwargs=arguments["lr_scheduler_kwargs"])
    lrs = []
    for _ in range(100):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[10:decay_from + 1] == [1.0] * (decay_from - 9)  # the peak from the warmup's end to the decay's start
    assert all(later < earlier for earlier, later in zip(lrs[decay_from:], lrs[decay_from + 1:], strict=False))
    assert lrs[-1] == pytest.approx(0.1, abs=1e-6 + 0.9 / (100 - decay_from))  # down to the floor at the last step
