"""requirements.lock: the exact versions `make install` takes, written from a fresh install and checked against one.

    python tools/lock.py write < freeze.txt > requirements.lock   # `make lock`: from `pip freeze` of a fresh venv
    python tools/lock.py check                                     # the running environment against the lock

Written by hand rather than with pip-tools or uv: the lock is `pip freeze` of an install pip made with this
machine's settings (the CPU build of torch lies on disk, see notes in requirements.txt), plus two rules no freeze
applies. torch is locked without its local label (`==2.13.0` matches `2.13.0+cpu` here and the CUDA build on a GPU
machine, by PEP 440), and a package that requirements*.txt installs only under an environment marker (triton) keeps
that marker. `check` compares with the same rules, so `pip freeze` after `make install` matches the lock exactly.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
RANGES = (ROOT / "requirements.txt", ROOT / "requirements-dev.txt")
# Never in the lock: the installers themselves, and the project (installed editable on top).
UNLOCKED = {"pip", "setuptools", "wheel", "sparknet"}
HEADER = """\
# Exact versions for `make install` (Linux, Python 3.11+): `make lock` rewrites this file from a fresh install of
# requirements-dev.txt (the ranges a user may choose from) and runs the tests. Edit the ranges, not this file.
# torch is locked without its local label: 2.13.0 is the CPU build here (+cpu) and the CUDA build on a GPU machine.
"""


def ranges() -> dict[str, Requirement]:
    """The requirements of requirements*.txt by canonical name (the ranges the lock must satisfy)."""
    found: dict[str, Requirement] = {}
    for path in RANGES:
        for line in path.read_text().splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith(("#", "-r", "-e")):
                requirement = Requirement(line)
                found[canonicalize_name(requirement.name)] = requirement
    return found


def public(version: str) -> str:
    """The version without its local label: 2.13.0+cpu -> 2.13.0."""
    return Version(version).public


def lock_lines(freeze: str) -> list[str]:
    """`pip freeze` output as lock lines: sorted, local labels dropped, the markers of requirements*.txt kept."""
    markers = {name: req.marker for name, req in ranges().items() if req.marker is not None}
    lines = []
    for line in freeze.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "-e")) or "==" not in line:
            continue  # comments and the editable project
        name, version = line.split("==", 1)
        key = canonicalize_name(name)
        if key in UNLOCKED:
            continue
        marker = f"; {markers[key]}" if key in markers else ""
        lines.append(f"{key}=={public(version)}{marker}")
    return sorted(lines)


def read_lock(path: Path = LOCK) -> dict[str, tuple[str, Marker | None]]:
    """The lock as {canonical name: (version, marker)}."""
    locked = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            (specifier,) = requirement.specifier
            locked[canonicalize_name(requirement.name)] = (specifier.version, requirement.marker)
    return locked


def installed() -> dict[str, str]:
    return {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}


def differences(locked: dict[str, tuple[str, Marker | None]], present: dict[str, str]) -> list[str]:
    """What keeps `present` from being exactly the lock: missing, other versions, and packages the lock lacks."""
    problems = []
    for name, (version, marker) in sorted(locked.items()):
        if marker is not None and not marker.evaluate():
            continue
        if name not in present:
            problems.append(f"{name}=={version} is locked but not installed")
        elif public(present[name]) != version:
            problems.append(f"{name}: {present[name]} installed, {version} locked")
    for name in sorted(set(present) - set(locked) - UNLOCKED):
        problems.append(f"{name}=={present[name]} is installed but not in the lock")
    return problems


def outside_ranges(locked: dict[str, tuple[str, Marker | None]]) -> list[str]:
    """Locked versions that requirements*.txt's ranges do not allow (a lock older than an edited range)."""
    problems = []
    for name, requirement in ranges().items():
        if name not in locked:
            problems.append(f"{name} ({requirement}) is not in the lock")
        elif not requirement.specifier.contains(locked[name][0], prereleases=True):
            problems.append(f"{name}=={locked[name][0]} is outside {requirement}")
    return problems


def main(argv: list[str]) -> int:
    if argv == ["write"]:
        sys.stdout.write(HEADER + "\n".join(lock_lines(sys.stdin.read())) + "\n")
        return 0
    if argv == ["check"]:
        locked = read_lock()
        problems = outside_ranges(locked) + differences(locked, installed())
        for problem in problems:
            print(f"requirements.lock: {problem}", file=sys.stderr)
        if problems:
            print("the environment is not the lock: `make install` installs it, `make lock` refreshes the lock",
                  file=sys.stderr)
        return 1 if problems else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
