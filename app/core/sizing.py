"""Worker and thread counts that fit the machine or container: the one place that computes them.

A pod limited to 2 CPUs on a 64-core node still sees 64 CPUs in ``os.cpu_count()`` and usually in its
affinity mask too; starting a worker per visible CPU (each ~0.5-2 GiB) gets it OOM-killed at start and
its CPU quota throttled. So the usable CPUs are, in order:

1. the CPU quota of this process's cgroup: v2 ``cpu.max`` (``"200000 100000"`` = 2 CPUs, ``"max ..."`` =
   none), v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (quota ``-1`` = none); the smallest quota on
   the way from the process's cgroup up to the root wins; a fractional quota is rounded down (1.5 CPUs
   -> 1: a second busy worker would only be throttled), never below 1;
2. the affinity mask (``os.sched_getaffinity``; cpusets), when smaller or when there is no quota.

Defaults: workers = usable CPUs; TensorFlow intra-op threads per worker = usable CPUs // workers (at
least 1), so workers share the cores instead of oversubscribing them.

Memory: the limit is the cgroup's (v2 ``memory.max``, v1 ``memory.limit_in_bytes``) or, without one,
the machine's RAM. When workers x per-worker RSS would pass it, ``plan`` warns, and when the worker
count was not set explicitly it *caps* the default at ``floor(limit x 0.9 / per-worker RSS)`` (at least
1; 10% is left for the gunicorn master, page cache and growth). Before any worker runs, the per-worker
RSS is estimated from the size on disk of every model it serves, each in its own precision
(``estimate_worker_rss_mib``: all of ``SPO_MODELS``, not only ``SPO_MODEL_DIR``); each worker measures
its real RSS after warm-up and ``memory_warning`` repeats the check with that figure.

Every reader takes the cgroup root and the ``/proc/self/cgroup`` path as arguments, so tests run on
fake trees. The service (``app.core.settings``, ``deploy/gunicorn.conf.py``, ``spo serve --check-config``),
the batch command and the benchmarks all call ``plan``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nlp.config import SHORT_CALL_PLANS, plan_sessions

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
MIB = 1 << 20
# cgroup v1 reports "no limit" as a page-rounded 2**63 - 1; anything above this is no limit.
_V1_UNLIMITED = 1 << 60
MEMORY_HEADROOM = 0.9

# Per-worker RSS after load and warm-up, a line through two measured points (fp32, one worker, 2 cores):
# the 16 MiB demo model 888 MiB (TensorFlow, Flask and the warmed shapes' buffers: most of it), the
# 229 MiB RBT6 benchmark model 1,680-1,850 MiB (BENCHMARKS.md); bf16 keeps a bf16 copy of the weights
# next to the fp32 ones (RBT6: +1.0 GiB). An int8 directory is small on disk (int8 weights) but is
# frozen and rewritten at load: the RBT6 int8 copy, 106 MiB on disk, held 1,918-2,040 MiB, the demo's,
# 13 MiB, 957 MiB (2026-12-03). Only the start-up estimate: each worker measures its own.
BASE_RSS_MIB = 820.0
RSS_PER_MODEL_MIB = 4.0
EXTRA_PER_MODEL_MIB = {"bf16": 4.3, "int8": 7.5}
# The openvino engine (one compiled model with dynamic shapes, its kernels' per-shape caches and
# plans), per MiB on disk, in place of the TF factors: RBT6 served by ``python -m bench http-peers``,
# int8 (60 MiB on disk) 2,355 MiB per worker after warm-up; fp32 (229 MiB) about 2.9 GiB in
# ``python -m bench memory`` (AMD EPYC, 2 cores, 2026-12-03). bf16 is an fp32 directory run in bf16.
OPENVINO_PER_MODEL_MIB = {"fp32": 9.1, "bf16": 9.1, "int8": 25.6}
# Each extra session of a short-call thread plan (``SPO_SHORT_CALL_THREADS``; ``nlp.config.plan_sessions``
# counts them: none at 1 intra-op thread) holds the frozen graph's weights again, with its kernels'
# caches, per MiB of the model directory on disk. int8: RBT6's 106 MiB directory loaded as a worker
# does (``load_extractor``, 2 intra-op threads, every bucket shape warmed) held 2,058 / 2,063 MiB
# without the plan and 2,609 / 2,606 MiB with it (+543-551 MiB, 5.2 x; AMD EPYC, 2 cores, 2026-12-03;
# ``python -m bench threadplan``, which warms one-row shapes only, measured +478). bf16 and frozen fp32
# from ``bench threadplan`` alone (+926 MiB, +1,096 MiB for the 229 MiB fp32 directory); neither has a
# measured plan today.
PLAN_SESSION_PER_MODEL_MIB = {"fp32": 4.8, "bf16": 4.0, "int8": 5.2}


@dataclass(frozen=True)
class Limit:
    """A limit and where it was read (``value`` None: no limit there)."""

    value: float | None
    source: str


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (cpusets, ``taskset``), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _own_cgroups(proc_self_cgroup: Path) -> dict[str, str]:
    """``/proc/self/cgroup`` as {controller: path}; the v2 unified hierarchy under key ``""``."""
    text = _read(proc_self_cgroup) or ""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [""]:
            out[controller] = path
    return out


def _walk_up(base: Path, path: str) -> Iterator[Path]:
    """``base/path``, then each parent of it up to ``base`` itself (those that exist).

    Inside a container with its own cgroup namespace ``path`` is ``/``; without one the host path
    may not be mounted, and then ``base`` alone is what the container sees.
    """
    rel = Path(path.lstrip("/"))
    seen: set[Path] = set()
    for candidate in [base / rel, *(base / p for p in rel.parents)]:
        if candidate not in seen and candidate.is_dir():
            seen.add(candidate)
            yield candidate


def cpu_quota(root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP) -> Limit:
    """The CPU quota of this process's cgroup in CPUs (may be fractional), or no limit."""
    groups = _own_cgroups(proc_self_cgroup)
    best: Limit = Limit(None, "no CPU quota")
    if "" in groups and (root / "cgroup.controllers").is_file():
        for directory in _walk_up(root, groups[""]):
            raw = _read(directory / "cpu.max")
            if raw is None:
                continue
            quota, _, period = raw.partition(" ")
            if quota == "max":
                continue
            try:
                cpus = int(quota) / int(period or "100000")
            except (ValueError, ZeroDivisionError):
                continue
            if cpus > 0 and (best.value is None or cpus < best.value):
                best = Limit(cpus, f"cgroup v2 {directory / 'cpu.max'} = {raw!r}")
        return best
    for controller in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        base = root / controller
        if not base.is_dir():
            continue
        for directory in _walk_up(base, groups.get("cpu", "/")):
            quota_raw = _read(directory / "cpu.cfs_quota_us")
            period_raw = _read(directory / "cpu.cfs_period_us")
            if quota_raw is None or period_raw is None:
                continue
            try:
                quota_us, period_us = int(quota_raw), int(period_raw)
            except ValueError:
                continue
            if quota_us <= 0 or period_us <= 0:
                continue  # -1: no quota at this level
            cpus = quota_us / period_us
            if best.value is None or cpus < best.value:
                best = Limit(
                    cpus,
                    f"cgroup v1 {directory}/cpu.cfs_quota_us = {quota_us} per "
                    f"cpu.cfs_period_us = {period_us}",
                )
        break
    return best


def memory_limit(root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP) -> Limit:
    """The memory limit of this process's cgroup in bytes, else the machine's RAM."""
    groups = _own_cgroups(proc_self_cgroup)
    best: Limit = Limit(None, "no memory limit")
    if "" in groups and (root / "cgroup.controllers").is_file():
        for directory in _walk_up(root, groups[""]):
            raw = _read(directory / "memory.max")
            if raw is None or raw == "max":
                continue
            try:
                value = int(raw)
            except ValueError:
                continue
            if best.value is None or value < best.value:
                best = Limit(value, f"cgroup v2 {directory / 'memory.max'} = {raw}")
    elif (root / "memory").is_dir():
        for directory in _walk_up(root / "memory", groups.get("memory", "/")):
            raw = _read(directory / "memory.limit_in_bytes")
            try:
                limit = int(raw) if raw is not None else None
            except ValueError:
                limit = None
            if limit is None or limit >= _V1_UNLIMITED:
                continue
            value = limit
            if best.value is None or value < best.value:
                best = Limit(value, f"cgroup v1 {directory / 'memory.limit_in_bytes'} = {raw}")
    ram = physical_memory()
    if ram is not None and (best.value is None or ram < best.value):
        best = Limit(ram, "the machine's RAM (no smaller cgroup memory limit)")
    return best


def physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return None


@dataclass(frozen=True)
class Machine:
    """What sizing depends on: the affinity mask, the CPU quota and the memory limit."""

    affinity: int
    quota: Limit
    memory: Limit

    @classmethod
    def probe(
        cls,
        root: Path = CGROUP_ROOT,
        proc_self_cgroup: Path = PROC_SELF_CGROUP,
        affinity: int | None = None,
    ) -> Machine:
        return cls(
            affinity=affinity_cpus() if affinity is None else affinity,
            quota=cpu_quota(root, proc_self_cgroup),
            memory=memory_limit(root, proc_self_cgroup),
        )

    @property
    def cpus(self) -> int:
        """Whole CPUs this process may keep busy: min(quota rounded down, affinity), at least 1."""
        if self.quota.value is None:
            return self.affinity
        return max(1, min(self.affinity, math.floor(self.quota.value + 1e-9)))

    @property
    def cpus_reason(self) -> str:
        if self.quota.value is None:
            return f"{self.affinity} CPU(s) in the affinity mask ({self.quota.source})"
        if self.cpus < self.affinity:
            return (
                f"CPU quota {self.quota.value:g} -> {self.cpus} ({self.quota.source}); "
                f"the affinity mask has {self.affinity}"
            )
        return (
            f"{self.affinity} CPU(s) in the affinity mask, within the CPU quota "
            f"{self.quota.value:g} ({self.quota.source})"
        )


def intra_op_threads(cpus: int, workers: int) -> int:
    """TensorFlow intra-op threads per worker so that ``workers`` share ``cpus``: at least 1.

    >>> intra_op_threads(8, 2), intra_op_threads(2, 4)
    (4, 1)
    """
    return max(1, cpus // max(1, workers))


def model_precision(model_dir: Path, precision: str | None = None) -> str:
    """The precision ``model_dir`` runs in when ``precision`` is asked for: an int8 directory (``spo
    quantize``: ``"precision": "int8"`` in its model.json) runs in int8 whatever is asked; any other
    in ``precision``, or fp32 when none is asked (loading refuses the pairs that cannot run; this is
    only the estimate).
    """
    asked = precision or "fp32"
    path = Path(model_dir) / "model.json"
    try:
        if not path.is_file():  # a FIFO would block here, before loading could refuse it
            return asked
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # unreadable, not JSON, absurdly nested
        return asked
    return "int8" if isinstance(doc, dict) and doc.get("precision") == "int8" else asked


def _disk_bytes(model_dir: Path) -> int:
    size = 0
    for path in Path(model_dir).rglob("*"):
        try:
            if path.is_file():
                size += path.stat().st_size
        except OSError:
            continue
    return size


def model_rss_mib(
    model_dir: Path,
    precision: str | None = None,
    *,
    short_call_threads: bool = False,
    intra_op_threads: int | None = None,
) -> float:
    """What one model adds to a worker's RSS: its size on disk times its precision's factor, plus,
    with ``short_call_threads``, the sessions of its precision's thread plan under ``intra_op_threads``
    (``short_call_rss_mib``)."""
    size = _disk_bytes(model_dir)
    effective = model_precision(model_dir, precision)
    if _engine(model_dir) == "openvino":
        return OPENVINO_PER_MODEL_MIB.get(effective, OPENVINO_PER_MODEL_MIB["fp32"]) * size / MIB
    share = (RSS_PER_MODEL_MIB + EXTRA_PER_MODEL_MIB.get(effective, 0.0)) * size / MIB
    if short_call_threads:
        share += short_call_rss_mib(model_dir, precision, intra_op_threads)
    return share


def short_call_rss_mib(
    model_dir: Path, precision: str | None, intra_op_threads: int | None
) -> float:
    """What ``SPO_SHORT_CALL_THREADS`` adds to a worker's RSS for one model: one copy of the frozen
    weights per extra session its precision's measured plan makes under ``intra_op_threads`` (none
    for a precision without a plan, at 1 thread, or on the onnx or openvino engine, which ignore it)."""
    if _engine(model_dir) != "tf":
        return 0.0
    effective = model_precision(model_dir, precision)
    sessions = plan_sessions(SHORT_CALL_PLANS.get(effective, ()), intra_op_threads)
    factor = PLAN_SESSION_PER_MODEL_MIB.get(effective, PLAN_SESSION_PER_MODEL_MIB["fp32"])
    return len(sessions) * factor * _disk_bytes(model_dir) / MIB


def _engine(model_dir: Path) -> str:
    """The engine ``model_dir``'s model.json names (``tf`` when it names none or cannot be read;
    loading reports a bad manifest, this is only the estimate)."""
    try:
        doc = json.loads((Path(model_dir) / "model.json").read_text(encoding="utf-8"))
        name = doc["engine"]["name"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError):
        return "tf"  # RecursionError: a model.json nested past the parser's depth
    return name if isinstance(name, str) else "tf"


def estimate_worker_rss_mib(
    model_dirs: Path | Sequence[Path],
    precision: str | None = None,
    *,
    short_call_threads: bool = False,
    intra_op_threads: int | None = None,
) -> float:
    """A worker's RSS after load and warm-up with every model of ``model_dirs`` loaded (one directory,
    or all that ``SPO_MODELS`` serves): the runtime once, plus each model's share (see the constants;
    ``short_call_threads`` and ``intra_op_threads`` as ``model_rss_mib`` takes them).

    The runtime is shared: ``bench.models_rss`` measured demo alone 884 MiB, both demo models 921 MiB
    (docs/rest.md, "Several models"). Used before any worker ran; each worker's measured RSS is
    checked again by ``memory_warning``.
    """
    dirs = [model_dirs] if isinstance(model_dirs, (str, Path)) else list(model_dirs)
    return BASE_RSS_MIB + sum(
        model_rss_mib(
            d, precision, short_call_threads=short_call_threads, intra_op_threads=intra_op_threads
        )
        for d in dirs
    )


@dataclass(frozen=True)
class Sizing:
    """Resolved counts and why; ``lines()`` is what ``spo serve --check-config`` prints."""

    cpus: int
    workers: int
    intra_op_threads: int
    memory_limit: float | None
    worker_rss_mib: float | None
    reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default=())

    def lines(self) -> list[str]:
        out = [
            f"usable CPUs: {self.cpus}",
            f"workers: {self.workers}",
            f"TensorFlow intra-op threads per worker: {self.intra_op_threads}",
        ]
        if self.memory_limit is not None:
            out.append(f"memory limit: {self.memory_limit / MIB:,.0f} MiB")
        if self.worker_rss_mib is not None:
            out.append(f"estimated RSS per worker: {self.worker_rss_mib:,.0f} MiB")
        if self.memory_limit is not None and self.worker_rss_mib:
            both = 2 * self.workers * self.worker_rss_mib
            fits = both * MIB <= self.memory_limit
            out.append(
                f"a reload (new workers beside the old): ~{both:,.0f} MiB, "
                + ("within the limit" if fits else "over the limit: refused (restart instead)")
            )
        out += [f"  because {r}" for r in self.reasons]
        out += [f"WARNING: {w}" for w in self.warnings]
        return out


def plan(
    machine: Machine,
    *,
    workers: int | None = None,
    intra_op: int | None = None,
    worker_rss_mib: float | None = None,
) -> Sizing:
    """Workers and threads for ``machine``; ``workers`` / ``intra_op`` when set explicitly win.

    >>> m = Machine(affinity=64, quota=Limit(2.0, "test"), memory=Limit(None, "none"))
    >>> s = plan(m)
    >>> s.cpus, s.workers, s.intra_op_threads
    (2, 2, 1)
    >>> m = Machine(affinity=8, quota=Limit(None, "none"), memory=Limit(4 * 2**30, "test"))
    >>> s = plan(m, worker_rss_mib=1800)
    >>> s.workers, s.intra_op_threads, len(s.warnings)
    (2, 4, 1)
    """
    cpus = machine.cpus
    reasons = [f"usable CPUs: {machine.cpus_reason}"]
    warnings: list[str] = []
    limit = machine.memory.value
    if workers is not None:
        n = workers
        reasons.append(f"workers: {workers}, set explicitly (SPO_WORKERS / --workers)")
    else:
        n = cpus
        reasons.append(f"workers: one per usable CPU ({cpus})")
    if limit is not None and worker_rss_mib:
        fits = max(1, math.floor(limit * MEMORY_HEADROOM / (worker_rss_mib * MIB)))
        need = n * worker_rss_mib
        if n > fits:
            if workers is None:
                warnings.append(
                    f"{n} workers x ~{worker_rss_mib:,.0f} MiB = {need:,.0f} MiB would not fit the "
                    f"memory limit {limit / MIB:,.0f} MiB ({machine.memory.source}); "
                    f"capped at {fits} worker(s) (90% of the limit)"
                )
                reasons.append(f"workers: capped at {fits} by memory")
                n = fits
            else:
                warnings.append(
                    f"{n} workers x ~{worker_rss_mib:,.0f} MiB = {need:,.0f} MiB exceed 90% of "
                    f"the memory limit {limit / MIB:,.0f} MiB ({machine.memory.source}); "
                    f"expect the OOM killer; {fits} would fit"
                )
    if intra_op is not None:
        threads = intra_op
        reasons.append(f"intra-op threads: {intra_op}, set explicitly")
    else:
        threads = intra_op_threads(cpus, n)
        reasons.append(f"intra-op threads: usable CPUs // workers = {cpus} // {n}")
    if n * threads > cpus:
        warnings.append(
            f"{n} workers x {threads} intra-op threads = {n * threads} threads on {cpus} usable "
            "CPU(s): they will contend"
        )
    return Sizing(cpus, n, threads, limit, worker_rss_mib, tuple(reasons), tuple(warnings))


def reload_memory_problem(running: int, sizing: Sizing) -> str | None:
    """Why a reload (``sizing.workers`` new workers started beside ``running`` old ones, which
    stop only once every new one is ready: ``app.serving.master``) would pass the memory limit, by
    the estimated RSS per worker; None when it fits or nothing bounds it. Over the limit itself
    the kernel's OOM killer would stop a worker, or under cgroup v2's ``memory.oom.group`` the
    whole container, in the middle of the reload: the master refuses it.

    >>> s = Sizing(2, 2, 1, 3 * 2**30, 970.0)
    >>> print(reload_memory_problem(2, s))
    2 old and 2 new workers together need ~3,880 MiB (estimated), over the memory limit 3,072 MiB: change models by a restart (a rolling update), or raise the limit to 4,312 MiB
    >>> reload_memory_problem(2, Sizing(2, 2, 1, 5 * 2**30, 970.0)) is None
    True
    """
    if sizing.memory_limit is None or not sizing.worker_rss_mib:
        return None
    need = (running + sizing.workers) * sizing.worker_rss_mib
    if need * MIB <= sizing.memory_limit:
        return None
    return (
        f"{running} old and {sizing.workers} new workers together need ~{need:,.0f} MiB "
        f"(estimated), over the memory limit {sizing.memory_limit / MIB:,.0f} MiB: change models "
        f"by a restart (a rolling update), or raise the limit to {math.ceil(need / MEMORY_HEADROOM):,} MiB"
    )


def memory_warning(workers: int, rss_mib: float, machine: Machine) -> str | None:
    """A warning when ``workers`` workers of a measured ``rss_mib`` pass 90% of the memory limit."""
    limit = machine.memory.value
    if limit is None or workers * rss_mib * MIB <= limit * MEMORY_HEADROOM:
        return None
    fits = max(1, math.floor(limit * MEMORY_HEADROOM / (rss_mib * MIB)))
    return (
        f"{workers} workers x {rss_mib:,.0f} MiB (measured after warm-up) = "
        f"{workers * rss_mib:,.0f} MiB exceed 90% of the memory limit {limit / MIB:,.0f} MiB "
        f"({machine.memory.source}); set SPO_WORKERS={fits} or raise the limit"
    )
