"""docs/constants.md is what the scripts' constants say now: each constant's comment is its one doc (--help prints
it too), so an edit to a script's constant without `make docs` fails here."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from sparknet.runtime import PROJECT_ROOT


def _check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(root / "tools" / "constants_doc.py"), "check"], capture_output=True,
                          text=True, timeout=120)


def test_the_constants_reference_is_current_and_follows_an_edited_comment(tmp_path: Path) -> None:
    proc = _check(PROJECT_ROOT)
    assert proc.returncode == 0, proc.stderr
    text = (PROJECT_ROOT / "docs" / "constants.md").read_text()
    assert ("| `GLOBAL_BATCH_SIZE` | `128` | blocks per optimizer step over all devices: the same steps on any number "
            "of GPUs | a positive integer |") in text
    assert "## train_sparknet.py" in text and "`ON_EXHAUSTED` | `'renormalise'`" in text
    copy = tmp_path / "repo"  # the same check on a copy whose script comment was edited
    for part in ("sparknet", "scripts", "tools", "docs"):
        shutil.copytree(PROJECT_ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    script = copy / "scripts" / "plot_runs.py"
    script.write_text(script.read_text().replace("  # run names (folders", "  # the run names (folders", 1))
    proc = _check(copy)
    assert proc.returncode == 1 and "docs/constants.md is not what the scripts say: run `make docs`" in proc.stderr
