"""Running the demo chain: each step is one of the real scripts, started as the user would start it."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time

from sparknet.errors import UserError
from sparknet.runtime import PROJECT_ROOT


class Chain:
    """Runs scripts/ one after another, printing each command and its time; stops at the first failure."""

    def __init__(self) -> None:
        self.started = time.time()
        self.timings: list[tuple[str, float]] = []

    def step(self, title: str, script: str, *args: object) -> None:
        """Runs `python scripts/<script> <args>` from the project root."""
        argv = [f"scripts/{script}", *(str(a) for a in args)]
        print(f"\n=== {title}\n$ python {shlex.join(argv)}", flush=True)
        t = time.time()
        code = subprocess.call([sys.executable, *argv], cwd=PROJECT_ROOT)
        if code != 0:
            raise UserError(f"demo step '{title}' failed (exit status {code}); its messages are above")
        self.timings.append((title, time.time() - t))

    def summary(self, outputs: dict[str, str]) -> None:
        """Prints where everything went and how long each step took."""
        print(f"\n=== demo finished in {time.time() - self.started:.0f} s")
        for title, seconds in self.timings:
            print(f"  {title:<20} {seconds:6.1f} s")
        print("outputs:")
        for what, where in outputs.items():
            print(f"  {what:<20} {where}")
