"""docs/constants.md is what the scripts' constants say now: each constant's comment is its one doc (--help prints
it too), so an edit to a script's constant without `make docs` fails here."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from sparknet.common.runtime import PROJECT_ROOT


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


def test_the_format_versions_the_docs_name_are_the_codes() -> None:
    """The docs said the dataset format was 3 while manifests said 4. Each place that names a format version is
    checked against the constant (the dataset's FORMAT_VERSION, the run folder's RUN_FORMAT), and no other place
    names one, so a bump of either fails here until the docs follow."""
    import re

    from sparknet.data.packed.dataset import FORMAT_VERSION
    from sparknet.train.folders import RUN_FORMAT

    expected = {  # (file, what precedes the number): the number
        ("training.md", "`run_config.json`'s `format_version`, now "): RUN_FORMAT,
        ("training.md", "`manifest.json`'s, now "): FORMAT_VERSION,
        ("data.md", "(format version "): FORMAT_VERSION,
        ("troubleshooting.md", "`has format\n  version "): FORMAT_VERSION - 1,
        ("troubleshooting.md", "and this SparkNet reads "): FORMAT_VERSION,
    }
    for (name, before), number in expected.items():
        text = (PROJECT_ROOT / "docs" / name).read_text()
        found = re.findall(re.escape(before) + r"(\d+)", text)
        assert found == [str(number)], (name, before, found, number)
    # any other mention of a format version with a number would escape the checks above
    for path in [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        mentions = [m.start() for m in re.finditer(r"format[\s_]version\W{0,4}(now\s)?\d|SparkNet reads \d|"
                                                   r"'s, now \d", text)]
        checked = [m.start() for (name, before) in expected if path.name == name
                   for m in re.finditer(re.escape(before) + r"\d", text)]
        unchecked = [text[m:m + 60] for m in mentions if not any(c <= m < c + 80 for c in checked)]
        assert not unchecked, (path.name, unchecked)
