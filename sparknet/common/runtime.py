"""Process set-up shared by every script: project paths, HF caches inside the project, one logging format, seeds.

`setup()` must run before `datasets`, `transformers` or `huggingface_hub` is imported: they read their cache
locations from the environment at import time.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import sys
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # sparknet/common/runtime.py
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def project_path(path: str | os.PathLike[str]) -> Path:
    """Resolves a path from a script constant: relative paths are relative to the project root, not the cwd,
    so scripts behave the same whichever folder they are started from."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else PROJECT_ROOT / p


def configure_environment() -> None:
    """Points every HF cache into `cache/` of the project (unless the user chose one) and sets tokenizer threading."""
    cache = project_path("cache")
    os.environ.setdefault("HF_HOME", str(cache / "huggingface"))
    os.environ.setdefault("HF_DATASETS_CACHE", str(cache / "datasets"))
    # Explicit, so the tokenizers library neither warns on fork nor silently drops to one thread.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")


def configure_logging(level: int = logging.INFO) -> None:
    """One log format for SparkNet and the HF libraries."""
    root = logging.getLogger()
    if not any(getattr(h, "_sparknet", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT, datefmt="%H:%M:%S"))
        handler._sparknet = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    # under torchrun the other processes say only what goes wrong: one voice for progress
    root.setLevel(level if process_rank() == 0 else max(level, logging.WARNING))
    # lm_eval: its INFO lines (seeds, task building, model arguments) interleave with SparkNet's own; the HTTP
    # clients (huggingface_hub 2 talks through httpx2) log one INFO line per request, thousands in a streamed run;
    # matplotlib: "generated new fontManager" on its first use on a machine (plots, the demo)
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2", "urllib3", "filelock", "fsspec", "lm_eval",
                  "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # huggingface_hub prints through a bare handler of its own (added when it is imported) and passes each line on
    # to ours as well: every retry warning came twice
    import huggingface_hub.utils.logging  # noqa: F401 - its handler exists from here on

    hub = logging.getLogger("huggingface_hub")
    for h in [h for h in hub.handlers if not getattr(h, "_sparknet", False)]:
        hub.removeHandler(h)


def hide_library_progress_bars() -> None:
    """Hides transformers' bars ("Writing model shards", "Loading weights"): they appear at every checkpoint save
    and model load and say nothing a run's own lines do not. Hub download bars stay unless the user turned them off.
    Imports transformers: call it where transformers is needed anyway."""
    import huggingface_hub.utils as hub_utils
    from transformers.utils import logging as transformers_logging

    hub_bars = not hub_utils.are_progress_bars_disabled()
    transformers_logging.disable_progress_bar()  # also switches off huggingface_hub's bars ...
    if hub_bars:
        hub_utils.enable_progress_bars()  # ... which stay as they were


def seed_everything(seed: int) -> None:
    """Seeds Python, NumPy and torch from one value."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def setup(seed: int | None = None, level: int = logging.INFO) -> None:
    """Everything a script does first, after its flags are parsed."""
    configure_environment()
    configure_logging(level)
    if seed is not None:
        seed_everything(seed)


def device_info() -> dict[str, object]:
    """The accelerator this process trains on: kind, name, count, and whether bf16 and TF32 are usable."""
    import torch

    if torch.cuda.is_available():
        major, _ = torch.cuda.get_device_capability()
        return {"kind": "cuda", "name": torch.cuda.get_device_name(), "count": torch.cuda.device_count(),
                "bf16": torch.cuda.is_bf16_supported(including_emulation=False), "tf32": major >= 8}
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return {"kind": "mps", "name": "Apple MPS", "count": 1, "bf16": False, "tf32": False}
    return {"kind": "cpu", "name": "cpu", "count": 1, "bf16": False, "tf32": False}


def temporary_path(path: Path) -> Path:
    """The temporary file `write_json_atomic` writes before renaming it over `path`: beside it, hidden."""
    return path.with_name(f".{path.name}.tmp")


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's bytes, read in 4 MB chunks (a data file, a checkpoint's weights: any size)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def umask() -> int:
    """This process's umask (read from /proc where the kernel says it; else set and put back at once)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(folder: Path, pattern: str = "*.safetensors") -> None:
    """Gives the files of `folder` matching `pattern` the mode every other file gets (0666 less the umask):
    safetensors writes its files 0600, readable by their owner only, where a model folder's other files are not."""
    mode = 0o666 & ~umask()
    for path in folder.glob(pattern):
        if path.is_file() and path.stat().st_mode & 0o777 != mode:
            path.chmod(mode)


def write_json_atomic(path: Path, data: Any, compact: bool = False) -> None:
    """Writes JSON to a temporary file, fsyncs it and renames it over `path`: readers see all or nothing."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False) if compact else json.dumps(data, indent=2)
    write_text_atomic(path, text + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Writes `text` to a temporary file, fsyncs it and renames it over `path`: readers see all or nothing, and a
    write that fails (a file size limit, a full disk) leaves the old file as it was, and no temporary file behind."""
    tmp = temporary_path(path)
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:  # a write fault (a file size limit, no permission): said of the file, the temporary gone
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    except BaseException:  # a stop: no temporary file left behind either
        tmp.unlink(missing_ok=True)
        raise


def read_json_object(path: Path, fix: str) -> dict[str, Any]:
    """The JSON object in the state or results file `path`, or a UserError naming the file, why it is damaged and
    `fix` (what the user should do)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        data, reason = None, str(exc)
    else:
        reason = "not a JSON object"
    if not isinstance(data, dict):
        from sparknet.common.errors import UserError

        raise UserError(f"{path} is damaged ({reason}): {fix}")
    return data


def replace_folder(new: Path, out_dir: Path) -> None:
    """Puts the finished folder `new` at `out_dir`. Where the kernel can (Linux's renameat2 RENAME_EXCHANGE, on
    ext4, xfs, btrfs, tmpfs), the two folders swap names in one atomic step: a reader of `out_dir` sees the old
    folder or the new one, never none. Elsewhere by two renames: the old folder is moved aside whole and deleted only
    once the new one is in place, so a crash at any point leaves the old or the new folder, never a half-written or
    half-deleted one (moved aside as `.NAME.replaced` at worst). (The tokenizer, the packed dataset, its growth, the
    export.)"""
    import shutil

    if not out_dir.exists():
        os.replace(new, out_dir)
        return
    old = out_dir.with_name(f".{out_dir.name}.replaced")
    shutil.rmtree(old, ignore_errors=True)
    if _exchange(new, out_dir):
        os.replace(new, old)  # `new` now names the old folder
    else:
        os.replace(out_dir, old)
        os.replace(new, out_dir)
    shutil.rmtree(old)


def _exchange(a: Path, b: Path) -> bool:
    """Swaps the names of two paths atomically (renameat2 with RENAME_EXCHANGE); False where the platform, the C
    library or the file system cannot (then nothing was changed). By hand through ctypes: Python's os has no
    renameat2, and no well-kept library on PyPI wraps it."""
    import ctypes

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):  # a C library without renameat2 (glibc before 2.28, musl)
        return False
    at_fdcwd, rename_exchange = -100, 2
    done = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0
    if not done and ctypes.get_errno() not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), str(b))
    return done


LOW_SPACE = 64 * 2**20  # bytes: a disk with less free space than this is taken as full
_OUTPUTS: list[Path] = []  # where this process writes (writes_to), the first places a full disk is looked for


def writes_to(*folders: Path) -> None:
    """Records folders this process writes into, so that a full disk there is named by `disk_full`."""
    _OUTPUTS.extend(Path(f) for f in folders)


def disk_full(exc: BaseException) -> str | None:
    """Where a write failed for want of space, when `exc` (or what caused it) is that; else None. Besides ENOSPC
    itself, libraries that write through their own code report a full disk in their own words (safetensors'
    SafetensorError, torch.save's "unexpected pos"): those count when a disk involved is nearly full (the
    project's, the current folder's, the temp folder's, one `writes_to` recorded, or a path the message names)."""
    import errno

    from sparknet.common.errors import exception_chain

    chain = exception_chain(exc)
    for error in chain:
        if isinstance(error, OSError) and error.errno == errno.ENOSPC and error.filename:
            return str(error.filename)
    words = " ".join(str(e) for e in chain)
    enospc = any(isinstance(e, OSError) and e.errno == errno.ENOSPC for e in chain)
    library = any(type(e).__name__ == "SafetensorError" for e in chain) or "unexpected pos" in words
    if enospc or "No space left on device" in words or library:
        import re
        import shutil
        import tempfile

        named = [Path(p) for p in re.findall(r"(/[^\s'\"]+)", words)]
        for folder in (*_OUTPUTS, *named, Path.cwd(), PROJECT_ROOT, Path(tempfile.gettempdir())):
            while not folder.exists() and folder != folder.parent:
                folder = folder.parent
            try:
                if shutil.disk_usage(folder).free < LOW_SPACE:
                    return str(folder)
            except OSError:
                continue
        if not library:
            return "a file"
    return None


def world_size() -> int:
    """Processes training together (torchrun/accelerate set WORLD_SIZE); 1 for a plain `python` run."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_world_size() -> int:
    """Processes training together on this machine (torchrun/accelerate set LOCAL_WORLD_SIZE): what shares its
    cores. 1 for a plain `python` run."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def process_rank() -> int:
    """This process's global rank (0 for a plain run): rank 0 alone writes the run's shared files."""
    return int(os.environ.get("RANK", "0"))


def available_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def compute_cores() -> int:
    """The cores torch's threads may use: the CPUs of this process's affinity (a `taskset` or cpuset share, not the
    machine's) counted once per physical core, as torch's own default counts them (two hyperthreads of a core share
    its arithmetic units), at most a container's CPU quota (cgroup cpu.max, or v1's cfs_quota_us); at least one."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topology / "physical_package_id").read_text().strip(),
                       (topology / "core_id").read_text().strip()))
        except OSError:  # no topology known: the CPU counts as a core of its own
            cores.add(("cpu", str(cpu)))
    count = max(1, len(cores))
    quota = _cpu_quota()
    return max(1, min(count, quota)) if quota else count


def _cpu_quota() -> int | None:
    """A container's CPU limit in whole CPUs (rounded up), or None where there is none."""
    import math

    for quota_file, period_file in (("/sys/fs/cgroup/cpu.max", None),
                                    ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us")):
        try:
            fields = Path(quota_file).read_text().split()
            quota, period = fields[0], fields[1] if period_file is None else Path(period_file).read_text().strip()
        except (OSError, IndexError):
            continue
        if quota in ("max", "-1") or not quota.lstrip("-").isdigit() or not period.isdigit() or int(period) <= 0:
            return None
        return math.ceil(int(quota) / int(period)) if int(quota) > 0 else None
    return None


class CoreLoad:
    """How busy the CPUs this process may run on are with work other than its own, between two readings.

    Read by hand from /proc/stat (each allowed CPU's busy and all jiffies) and /proc/self/stat (this process's own
    CPU time, all its threads): psutil's per-CPU percentages cannot take this process's own share out, and the
    readings cost microseconds. Elsewhere than Linux, or where /proc/stat does not list the allowed CPUs by their
    numbers (lxcfs renumbers them): nothing known."""

    def __init__(self, cpus: set[int] | None = None, stat_file: Path = Path("/proc/stat"),
                 own_file: Path = Path("/proc/self/stat")) -> None:
        self.cpus = cpus if cpus is not None else (
            os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set())
        self.stat_file, self.own_file = stat_file, own_file
        self.last = self._read()

    def _read(self) -> tuple[int, int, int] | None:
        try:
            busy = total = found = 0
            for line in self.stat_file.read_text().splitlines():
                name, *fields = line.split()
                if name[:3] == "cpu" and name[3:].isdigit() and int(name[3:]) in self.cpus:
                    jiffies = [int(value) for value in fields[:8]]  # user nice system idle iowait irq softirq steal
                    total += sum(jiffies)
                    busy += sum(jiffies) - jiffies[3] - jiffies[4]
                    found += 1
            own = self.own_file.read_text().rsplit(")", 1)[1].split()  # fields from the 3rd (state) on
            if not self.cpus or found != len(self.cpus):
                return None
            return busy, total, int(own[11]) + int(own[12])  # utime, stime (fields 14, 15): all its threads
        except (OSError, ValueError, IndexError):
            return None

    def busy_elsewhere(self, cores: int) -> float | None:
        """Of `cores` (compute_cores), how many other processes (encoders of its own, other programs) kept busy
        since the last reading; None where not known or too little time has passed to tell."""
        now = self._read()
        last, self.last = self.last, now
        if now is None or last is None or now[1] - last[1] < 10 * len(self.cpus):  # under ~0.1 s of jiffies
            return None
        busy, total, own = (a - b for a, b in zip(now, last, strict=True))
        return max(0.0, (busy - own) / total * cores)


def omp_threads() -> int | None:
    """OMP_NUM_THREADS where set to a count (by the user, or by torchrun for each of its processes), else None."""
    given = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(given) if given.isdigit() and int(given) > 0 else None


def compute_threads(busy_elsewhere: float | None = None) -> tuple[int, str]:
    """torch's intra-op threads for work on a CPU, and why, in words for the start-up line.

    OMP_NUM_THREADS, where set, is used as it is. Otherwise the cores this process may use (compute_cores) that
    other work does not keep busy (`busy_elsewhere`: its encoder processes, other programs), shared among the training
    processes on this node; at least one. torch's own default takes every core, so on a machine busy with other work
    its threads wait on each other at every barrier (bench/cpu_threads.py)."""
    given = omp_threads()
    if given:
        return given, f"OMP_NUM_THREADS={given}"
    cores, processes = compute_cores(), local_world_size()
    free = cores if busy_elsewhere is None else max(0, int(cores - busy_elsewhere + 0.5))
    threads = max(1, min(cores, free) // processes)
    why = f"{cores} core{'s' if cores != 1 else ''} allowed"
    if busy_elsewhere is not None:
        why += f", {busy_elsewhere:.1f} busy with other work"
    if processes > 1:
        why += f", {processes} processes on this node"
    return threads, why


def use_compute_threads(device_kind: str) -> str:
    """Sets torch's intra-op threads by `compute_threads` for work on a CPU (the load over a quarter of a second from
    now, where one process of this node chooses alone) and returns the start-up line's words for it; on an
    accelerator the threads only feed it, and torch's default stays ('' then)."""
    if device_kind != "cpu":
        return ""
    import time

    import torch

    busy = None
    if omp_threads() is None and local_world_size() == 1:  # several: each counts the others' work as load
        load = CoreLoad()
        time.sleep(0.25)
        busy = load.busy_elsewhere(compute_cores())
    threads, why = compute_threads(busy)
    torch.set_num_threads(threads)
    return f"{threads} compute thread{'s' if threads != 1 else ''} ({why})"


def quiet_closed_terminal() -> None:
    """After SIGHUP the terminal may be gone, and a write to it fails (EIO), which would end the work before it has
    saved: output bound for a terminal goes to /dev/null from here on, as under nohup. Output bound for a file or a
    pipe is kept."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            if os.isatty(fd):
                os.dup2(devnull, fd)
    finally:
        os.close(devnull)
