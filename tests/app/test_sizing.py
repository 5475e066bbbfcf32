"""``app.core.sizing``: CPU quota and memory limit from fake cgroup v1/v2 trees, and the plan made of them."""

from __future__ import annotations

import doctest
import json
import math
from pathlib import Path

import pytest

from app.core import sizing
from app.core.settings import Settings
from app.core.sizing import Limit, Machine, cpu_quota, memory_limit, memory_warning, plan

GIB = 1 << 30


def v2_tree(tmp_path: Path, files: dict[str, str], own: str = "/") -> tuple[Path, Path]:
    """A cgroup v2 mount at ``tmp_path/cg`` and a ``/proc/self/cgroup`` naming ``own``."""
    root = tmp_path / "cg"
    root.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(f"0::{own}\n")
    return root, proc


def v1_tree(tmp_path: Path, files: dict[str, str], own: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cg"
    root.mkdir(parents=True)
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    proc = tmp_path / "proc-self-cgroup"
    lines = [f"{i + 1}:{controllers}:{path}" for i, (controllers, path) in enumerate(own.items())]
    proc.write_text("\n".join(lines) + "\n")
    return root, proc


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [("200000 100000", 2.0), ("150000 100000", 1.5), ("50000 100000", 0.5), ("max 100000", None)],
)
def test_sizing_v2_cpu_max(tmp_path: Path, cpu_max: str, expected: float | None) -> None:
    root, proc = v2_tree(tmp_path, {"cpu.max": cpu_max})
    assert cpu_quota(root, proc).value == expected


def test_sizing_v2_smallest_quota_on_the_way_up_wins(tmp_path: Path) -> None:
    root, proc = v2_tree(
        tmp_path,
        {"kubepods/cpu.max": "300000 100000", "kubepods/pod1/cpu.max": "max 100000"},
        own="/kubepods/pod1",
    )
    quota = cpu_quota(root, proc)
    assert quota.value == 3.0
    assert "kubepods/cpu.max" in quota.source


@pytest.mark.parametrize(
    ("quota_us", "expected"), [("400000", 4.0), ("-1", None), ("garbage", None)]
)
def test_sizing_v1_cfs_quota(tmp_path: Path, quota_us: str, expected: float | None) -> None:
    root, proc = v1_tree(
        tmp_path,
        {"cpu,cpuacct/cpu.cfs_quota_us": quota_us, "cpu,cpuacct/cpu.cfs_period_us": "100000"},
        {"cpu,cpuacct": "/docker/abc"},  # the host path is not mounted in the container
    )
    assert cpu_quota(root, proc).value == expected


def test_sizing_v1_own_cgroup_below_the_mount(tmp_path: Path) -> None:
    root, proc = v1_tree(
        tmp_path,
        {
            "cpu/cpu.cfs_quota_us": "-1",
            "cpu/cpu.cfs_period_us": "100000",
            "cpu/job/cpu.cfs_quota_us": "250000",
            "cpu/job/cpu.cfs_period_us": "100000",
        },
        {"cpu": "/job", "memory": "/job"},
    )
    assert cpu_quota(root, proc).value == 2.5


def test_sizing_v2_memory_max(tmp_path: Path) -> None:
    root, proc = v2_tree(tmp_path, {"memory.max": str(3 * GIB)})
    assert memory_limit(root, proc).value == min(3 * GIB, sizing.physical_memory() or 3 * GIB)
    root2, proc2 = v2_tree(tmp_path / "b", {"memory.max": "max"})
    unlimited = memory_limit(root2, proc2)
    assert unlimited.value == sizing.physical_memory()
    assert "RAM" in unlimited.source


def test_sizing_v1_memory_unlimited_is_the_machine_ram(tmp_path: Path) -> None:
    root, proc = v1_tree(
        tmp_path,
        {"memory/memory.limit_in_bytes": "9223372036854771712"},
        {"memory": "/"},
    )
    assert memory_limit(root, proc).value == sizing.physical_memory()
    root2, proc2 = v1_tree(
        tmp_path / "b", {"memory/job/memory.limit_in_bytes": str(GIB)}, {"memory": "/job"}
    )
    assert memory_limit(root2, proc2).value == GIB


def test_sizing_no_cgroup_at_all_falls_back_to_the_affinity_mask(tmp_path: Path) -> None:
    machine = Machine.probe(tmp_path / "none", tmp_path / "none-proc", affinity=6)
    assert machine.quota.value is None
    s = plan(machine)
    assert (s.cpus, s.workers, s.intra_op_threads) == (6, 6, 1)
    assert "affinity mask" in s.reasons[0]


def test_sizing_a_2_cpu_pod_on_a_64_core_node_starts_2_workers(tmp_path: Path) -> None:
    root, proc = v2_tree(tmp_path, {"cpu.max": "200000 100000", "memory.max": str(8 * GIB)})
    machine = Machine.probe(root, proc, affinity=64)
    s = plan(machine, worker_rss_mib=1800)
    assert (s.cpus, s.workers, s.intra_op_threads) == (2, 2, 1)
    assert s.warnings == ()
    assert "CPU quota 2" in "\n".join(s.lines())


def test_sizing_fractional_quota_rounds_down_but_never_below_one() -> None:
    for quota, cpus in ((1.5, 1), (0.25, 1), (3.99, 3)):
        machine = Machine(8, Limit(quota, "test"), Limit(None, "none"))
        assert machine.cpus == cpus


def test_sizing_memory_caps_the_default_and_warns_on_an_explicit_count() -> None:
    machine = Machine(16, Limit(None, "none"), Limit(4 * GIB, "cgroup v2 memory.max"))
    capped = plan(machine, worker_rss_mib=1800)
    assert capped.workers == 2  # floor(4096 * 0.9 / 1800)
    assert capped.intra_op_threads == 8
    assert len(capped.warnings) == 1 and "capped at 2" in capped.warnings[0]
    explicit = plan(machine, workers=6, worker_rss_mib=1800)
    assert explicit.workers == 6
    assert "OOM" in explicit.warnings[0] and "2 would fit" in explicit.warnings[0]
    tiny = Machine(16, Limit(None, "none"), Limit(GIB, "test"))
    assert plan(tiny, worker_rss_mib=1800).workers == 1  # never below one


def test_sizing_explicit_threads_and_oversubscription_warning() -> None:
    machine = Machine(4, Limit(None, "none"), Limit(None, "none"))
    s = plan(machine, workers=4, intra_op=2)
    assert (s.workers, s.intra_op_threads) == (4, 2)
    assert any("contend" in w for w in s.warnings)


def test_sizing_memory_warning_uses_the_measured_rss() -> None:
    machine = Machine(4, Limit(None, "none"), Limit(4 * GIB, "test limit"))
    assert memory_warning(2, 1500, machine) is None
    warning = memory_warning(4, 1500, machine)
    assert warning is not None and "SPO_WORKERS=2" in warning and "test limit" in warning


def test_sizing_estimate_grows_with_the_model(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    (small / "w").write_bytes(b"\0" * 2**20)
    big = tmp_path / "big"
    (big / "variables").mkdir(parents=True)
    (big / "variables" / "w").write_bytes(b"\0" * 50 * 2**20)
    assert sizing.estimate_worker_rss_mib(big) > sizing.estimate_worker_rss_mib(small)
    assert sizing.estimate_worker_rss_mib(big, "bf16") > sizing.estimate_worker_rss_mib(big)


def test_sizing_estimate_of_an_int8_directory_counts_what_loading_it_costs(tmp_path: Path) -> None:
    """An int8 copy is under half its parent's size on disk, yet served frozen it holds about what
    the parent does (RBT6: 106 MiB on disk, ~2,000 MiB; its fp32 parent 229 MiB, 1,680-1,935 MiB)."""
    int8 = tmp_path / "int8"
    (int8 / "variables").mkdir(parents=True)
    (int8 / "variables" / "w").write_bytes(b"\0" * 106 * 2**20)
    estimate = sizing.estimate_worker_rss_mib(int8, "int8")
    assert 1_850 <= estimate <= 2_150
    assert estimate > sizing.estimate_worker_rss_mib(int8, "fp32") + 600


def test_sizing_doctests() -> None:
    assert doctest.testmod(sizing).failed == 0


def _fake_model(directory: Path, mib: int, precision: str = "fp32") -> Path:
    """A directory that sizes like a model of ``mib`` MiB on disk (a sparse file: no disk used)."""
    (directory / "variables").mkdir(parents=True)
    (directory / "model.json").write_text(
        json.dumps({"name": directory.name, "precision": precision})
    )
    with open(directory / "variables" / "w", "wb") as f:
        f.truncate(mib * 2**20)
    return directory


def test_sizing_spo_models_under_a_memory_limit_counts_every_served_model(tmp_path: Path) -> None:
    """Issue 20: with SPO_MODELS the estimate was made from SPO_MODEL_DIR's default (the demo model),
    not from what each worker loads. Now it is the runtime once plus every served model's share."""
    a = _fake_model(tmp_path / "a", 200)
    b = _fake_model(tmp_path / "b", 200)
    machine = Machine(16, Limit(None, "none"), Limit(4 * GIB, "cgroup v2 memory.max"))
    one = Settings.from_env({"SPO_MODELS": f"a={a}", "SPO_WORKERS": "auto"}).sizing(machine)
    two = Settings.from_env({"SPO_MODELS": f"a={a},b={b}", "SPO_WORKERS": "auto"}).sizing(machine)
    share = sizing.model_rss_mib(a)
    assert one.worker_rss_mib == pytest.approx(sizing.BASE_RSS_MIB + share)
    assert two.worker_rss_mib == pytest.approx(sizing.BASE_RSS_MIB + 2 * share)
    # 4 GiB x 0.9 = 3,686 MiB: two workers of ~1,620 MiB fit, not two of ~2,420 MiB.
    assert one.worker_rss_mib is not None
    assert one.workers == math.floor(4096 * 0.9 / one.worker_rss_mib) == 2
    assert two.workers == 1
    assert "capped at 1" in two.warnings[0]
    assert "runtime 820 MiB + a 800 MiB (fp32) + b 800 MiB (fp32)" in "\n".join(two.lines())
    # The same models through SPO_MODEL_DIR (one of them) size as SPO_MODELS with that one.
    alone = Settings.from_env({"SPO_MODEL_DIR": str(a), "SPO_WORKERS": "auto"}).sizing(machine)
    assert alone.worker_rss_mib == one.worker_rss_mib


def test_sizing_spo_models_counts_each_model_in_its_own_precision(tmp_path: Path) -> None:
    fp32 = _fake_model(tmp_path / "fp32", 100)
    int8 = _fake_model(tmp_path / "int8", 100, precision="int8")
    machine = Machine(4, Limit(None, "none"), Limit(64 * GIB, "test"))
    both = Settings.from_env({"SPO_MODELS": f"f={fp32},q={int8}"}).sizing(machine)
    expected = sizing.BASE_RSS_MIB + (2 * sizing.RSS_PER_MODEL_MIB + 7.5) * 100
    assert both.worker_rss_mib == pytest.approx(expected)
    assert sizing.model_precision(int8, "fp32") == "int8"
    assert sizing.model_precision(fp32, "bf16") == "bf16"


def test_sizing_an_openvino_directory_by_the_openvino_engines_measured_rss(tmp_path: Path) -> None:
    """The openvino engine holds far more per MiB on disk than the TF session (its dynamic-shape
    plans): the RBT6 int8 conversion, 60 MiB on disk, measured 2,355 MiB per worker served, which
    the TF factors put at about 1,500 MiB."""
    ov = _fake_model(tmp_path / "ov", 60, precision="int8")
    doc = json.loads((ov / "model.json").read_text())
    doc["engine"] = {"name": "openvino", "file": "model.xml"}
    (ov / "model.json").write_text(json.dumps(doc))
    tf = _fake_model(tmp_path / "tf", 60, precision="int8")
    estimate = sizing.estimate_worker_rss_mib(ov)
    assert 2_150 <= estimate <= 2_550
    assert estimate > sizing.estimate_worker_rss_mib(tf) + 600
    broken = _fake_model(tmp_path / "broken", 60)
    (broken / "model.json").write_text('{"engine": "openvino"}')  # not a section: sized as tf
    assert sizing.model_rss_mib(broken) == pytest.approx(sizing.RSS_PER_MODEL_MIB * 60)


def test_sizing_short_call_threads_count_a_second_copy_of_the_weights(tmp_path: Path) -> None:
    """Issue 24 part 3: the int8 thread plan's one-thread session holds the frozen weights again
    (RBT6: +543-551 MiB for its 106 MiB directory, every shape warmed), but only where it makes a
    session: above one thread, in a precision with a measured plan, on the TF engine."""
    int8 = _fake_model(tmp_path / "int8", 106, precision="int8")
    fp32 = _fake_model(tmp_path / "fp32", 106)
    extra = sizing.short_call_rss_mib(int8, None, 2)
    assert 520 <= extra <= 580  # the measured +543-551 MiB, from the size on disk
    assert sizing.short_call_rss_mib(int8, None, 1) == 0  # every call already on one thread
    assert sizing.short_call_rss_mib(int8, None, None) == 0
    assert sizing.short_call_rss_mib(fp32, None, 2) == 0  # fp32: no measured plan
    assert sizing.short_call_rss_mib(fp32, "bf16", 2) == 0  # bf16: none either
    big = _fake_model(tmp_path / "big", 212, precision="int8")
    assert sizing.short_call_rss_mib(big, None, 4) == pytest.approx(
        2 * extra
    )  # by size, no constant
    ov = _fake_model(tmp_path / "ov", 106, precision="int8")
    doc = json.loads((ov / "model.json").read_text())
    doc["engine"] = {"name": "openvino", "file": "model.xml"}
    (ov / "model.json").write_text(json.dumps(doc))
    assert sizing.short_call_rss_mib(ov, None, 2) == 0  # the engine ignores the option
    on = sizing.estimate_worker_rss_mib(int8, short_call_threads=True, intra_op_threads=2)
    assert on == pytest.approx(sizing.estimate_worker_rss_mib(int8) + extra)


def test_sizing_settings_count_the_short_call_session_at_the_threads_each_worker_runs(
    tmp_path: Path,
) -> None:
    int8 = _fake_model(tmp_path / "int8", 106, precision="int8")
    base = {"SPO_MODEL_DIR": str(int8), "SPO_WORKERS": "auto"}
    roomy = Machine(2, Limit(None, "none"), Limit(64 * GIB, "test"))
    off = Settings.from_env(base).sizing(roomy)
    on = Settings.from_env({**base, "SPO_SHORT_CALL_THREADS": "on"}).sizing(roomy)
    # 2 workers x 1 thread (the default on 2 cores): the plan makes no session, costs nothing
    assert (on.workers, on.intra_op_threads) == (2, 1) and on.worker_rss_mib == off.worker_rss_mib
    one = {**base, "SPO_SHORT_CALL_THREADS": "on", "SPO_WORKERS": "1"}
    planned = Settings.from_env(one).sizing(roomy)
    assert planned.intra_op_threads == 2
    assert planned.worker_rss_mib is not None and off.worker_rss_mib is not None
    assert planned.worker_rss_mib == pytest.approx(
        off.worker_rss_mib + sizing.short_call_rss_mib(int8, None, 2)
    )
    assert "MiB of it the short-call session" in "\n".join(planned.lines())
    # Memory caps the default 2 workers at 1, which then runs 2 threads: the session is counted.
    tight = Machine(2, Limit(None, "none"), Limit(4 * GIB, "test"))
    capped = Settings.from_env({**base, "SPO_SHORT_CALL_THREADS": "on"}).sizing(tight)
    assert (capped.workers, capped.intra_op_threads) == (1, 2)
    assert capped.worker_rss_mib == pytest.approx(planned.worker_rss_mib)


def test_sizing_a_model_json_nested_past_the_parser_is_an_estimate_not_a_traceback(
    tmp_path: Path,
) -> None:
    """``spo extract -m DIR`` and ``spo serve --check-config`` ended in a RecursionError traceback
    from the engine lookup; the load names the bad model.json instead."""
    from app.core.sizing import _engine

    (tmp_path / "model.json").write_text("[" * 100_000, encoding="utf-8")
    assert _engine(tmp_path) == "tf"
