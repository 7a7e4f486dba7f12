"""requirements.lock (tools/lock.py): the exact versions `make install` takes stay inside the ranges of
requirements*.txt, and the lock is written and checked by the rules its docstring gives."""

from __future__ import annotations

import importlib.util
from types import ModuleType

import pytest
from packaging.markers import Marker

from sparknet.common.runtime import PROJECT_ROOT


@pytest.fixture(scope="module")
def lock() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lock", PROJECT_ROOT / "tools" / "lock.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_the_lock_satisfies_the_ranges_users_may_choose_from(lock: ModuleType) -> None:
    locked = lock.read_lock()
    assert lock.outside_ranges(locked) == []
    for name in ("torch", "transformers", "datasets", "tokenizers", "accelerate", "huggingface-hub", "pytest-cov"):
        assert name in locked, name
    assert locked["torch"][0] == "2.13.0" and locked["triton"][1] is not None  # no local label; triton's marker


def test_a_range_the_lock_falls_outside_of_is_named(lock: ModuleType) -> None:
    locked = {**lock.read_lock(), "transformers": ("4.57.0", None)}
    assert lock.outside_ranges(locked) == ["transformers==4.57.0 is outside transformers<6,>=5.0"]


def test_a_freeze_becomes_sorted_lock_lines_without_local_labels_and_with_markers(lock: ModuleType) -> None:
    freeze = ("# Editable Git install with no remote (sparknet==0.1.0)\n-e /work/main\nTorch==2.13.0+cpu\n"
              "triton==3.8.0\nPyYAML==6.0.4\npip==23.2.1\n")
    assert lock.lock_lines(freeze) == [
        "pyyaml==6.0.4", "torch==2.13.0", 'triton==3.8.0; sys_platform == "linux" and platform_machine == "x86_64"']


def test_the_environment_is_compared_with_the_lock_exactly(lock: ModuleType) -> None:
    locked = {"torch": ("2.13.0", None), "numpy": ("2.4.6", None),
              "winonly": ("1.0", Marker('sys_platform == "win32"'))}
    assert lock.differences(locked, {"torch": "2.13.0+cpu", "numpy": "2.4.6", "sparknet": "0.1.0"}) == []
    assert lock.differences(locked, {"torch": "2.14.1", "extra": "1.0"}) == [
        "numpy==2.4.6 is locked but not installed", "torch: 2.14.1 installed, 2.13.0 locked",
        "extra==1.0 is installed but not in the lock"]
