"""gunicorn's master for spo-service: checks the model before forking, reloads without a failed request.

``spo serve`` runs ``python -m app.serving.master`` (gunicorn's own command line and ``deploy/gunicorn.conf.py``)
instead of ``gunicorn``: the same master, with ``SpoArbiter`` deciding what a model that fails to load
means. The master never imports TensorFlow; it validates ``model.json`` and the files it names
(``check_model_dir``) and learns each worker's model state from the worker itself, over a pipe:

- **First start**: a bad ``model.json`` or a missing file is refused before any worker forks (``spo
  serve`` exits non-zero with the reason). What only TensorFlow can find (a corrupt SavedModel, a tensor
  not in the graph) makes the first worker report ``failed``; while no worker has ever been ready, that
  halts the server with the reason and exit status 3, as gunicorn does for a worker that cannot boot.
- **Reload** (SIGHUP, ``spo reload``): the model directory is resolved again (a symlink switch) and
  checked in the master; a bad one is refused and logged, and the running workers go on serving. A good
  one gets a new generation of workers *beside* the old ones; the old generation is retired (gracefully,
  finishing its requests) only once every new worker reports its model ready, so no request ever waits
  for a cold worker. If a new worker reports ``failed`` instead, exits before its model is ready, or is
  not ready within ``SPO_TIMEOUT``, the new generation is retired and the old one keeps serving the old
  version. Either way it is logged. A new worker that exits once its model was ready (recycled, or a
  crash under a request) proved the model loads: one more new worker takes its place, and the reload
  goes on. An old worker that exits meanwhile is replaced by one of the old generation.
  A HUP during a reload is kept, not dropped: once the reload in progress ends (done or failed), one
  more follows with what the directory and the tokens file say then (the last HUP wins: a link moved
  twice, a token revoked twice in a row, never leaves the server on the state in between).
- **Pinned directory**: each generation loads the directory the master resolved and checked when it
  started it, so a worker recycled later (``max_requests``, the RSS watchdog) loads the same version as
  its siblings, even after the symlink has moved. A recycled worker that cannot load it (the directory
  became unreadable) stays up: ``/healthz`` 200, ``/readyz`` and ``/v1/*`` 503 with the error's code,
  and it retries with backoff (``app.web.model_slot``) until the directory is back.

Settings travel as one value, parsed once: ``spo serve`` resolves them and hands them to the master in
one serialized variable (``SETTINGS_VAR``, ``Settings.to_json``; an exec is needed for jemalloc's
``LD_PRELOAD``), which ``handed_settings`` reads once and removes from the environment; started
otherwise (``python -m app.serving.master`` by hand), the master parses ``SPO_*`` once instead. Each worker gets
its generation's value by the fork (``SETTINGS``, read by ``worker_app``), never through ``os.environ``.
A reload re-reads the model variables (``SPO_MODEL_DIR`` / ``SPO_MODELS``) of the environment once, in
the master, so a moved symlink is followed; everything else stays as resolved at the start.

Why a new generation beside the old rather than gunicorn's own HUP (which stops the old workers at
once): during the new workers' load every request would wait in the listen backlog, and on a broken
model every request would fail. Beside the old workers, requests are served throughout; the cost is
the memory of both generations for the few seconds a load and warm-up take. Where that would pass the
memory limit (``app.core.sizing.reload_memory_problem``) the reload is refused: the OOM killer would
otherwise end it, under cgroup v2's ``memory.oom.group`` with the whole container.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gunicorn.app.wsgiapp import WSGIApplication
from gunicorn.arbiter import Arbiter
from gunicorn.errors import HaltServer

from app.core.settings import JEMALLOC_PATH, MULTIPROC_ENV, Settings, SettingsError
from app.core.sizing import reload_memory_problem
from nlp.errors import SpoError
from nlp.manifest import Manifest, load_manifest

# The one variable ``spo serve`` hands the resolved settings over in (outside the SPO_ prefix: it is
# not a setting, and ``Settings.from_env`` would call it unknown).
SETTINGS_VAR = "_SPO_SERVE_SETTINGS"
_REPORT_LIMIT = 3000  # bytes of one report line; below PIPE_BUF (4096), so each write is atomic

# The write end of the master's report pipe; set in the master before the first fork and inherited by
# every worker. None when gunicorn runs without SpoArbiter (then nothing is reported).
REPORT_FD: int | None = None
# True in the master while it forks a reload's new generation, so inherited by exactly those workers.
RELOAD_GENERATION = False
_WAIT_S = 0.1
# The settings of the generation being forked (set in the master before each fork, inherited by the
# worker): what ``worker_app`` builds the app with.
SETTINGS: Settings | None = None


def preload_blocks_reload(manifests: list[Manifest], ld_preload: str) -> str | None:
    """Why a reload onto ``manifests`` cannot run in a master started with ``ld_preload``, or None:
    an openvino model under the jemalloc this master preloaded (its new workers would abort compiling
    the model; only a restart drops the preload).

    >>> preload_blocks_reload([], f"{JEMALLOC_PATH}") is None
    True
    """
    if str(JEMALLOC_PATH) not in ld_preload.split(":"):
        return None
    openvino = [m.name for m in manifests if m.engine == "openvino"]
    if not openvino:
        return None
    return (
        f"{', '.join(openvino)} runs on the openvino engine, which aborts under the jemalloc this "
        "server preloaded when it started (OpenVINO 2026.4.1: free(): invalid pointer); restart "
        "spo serve to serve it (spo serve leaves jemalloc out for openvino models)"
    )


def not_a_master(pid: int, proc: Path = Path("/proc")) -> str | None:
    r"""The command line of process ``pid`` when it is not a gunicorn master (None: it is one, or this
    system cannot tell). ``spo reload`` asks before its SIGHUP: a pid file outlives a master that was
    killed (the OOM killer leaves no time to remove it), and its pid may by then be another process's,
    which a SIGHUP would end. A master runs ``python -m app.serving.master``, or ``gunicorn`` by hand
    (with setproctitle: ``gunicorn: master [spo-service]``).

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> (root / "7").mkdir(); _ = (root / "7" / "cmdline").write_bytes(b"vim\0notes.txt\0")
    >>> not_a_master(7, root)
    'vim notes.txt'
    >>> _ = (root / "7" / "cmdline").write_bytes(b"/usr/bin/python3\0-P\0-m\0app.serving.master\0")
    >>> not_a_master(7, root) is None
    True
    >>> _ = (root / "7" / "cmdline").write_bytes(b"/usr/bin/python3\0-P\0x.py\0app.serving.master\0")
    >>> not_a_master(7, root)
    '/usr/bin/python3 -P x.py app.serving.master'
    >>> _ = (root / "7" / "cmdline").write_bytes(b"vim\0gunicorn.conf.py\0")
    >>> not_a_master(7, root)
    'vim gunicorn.conf.py'
    """
    try:
        argv = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:  # no /proc (not Linux), not allowed to read it, or no such process
        return None
    words = [a.decode(errors="replace") for a in argv if a]
    # The program (gunicorn's title, or python) and what python runs, never the arguments after.
    program = Path(words[0]).name if words else ""
    rest = words[1:]
    while rest[:1] and rest[0] in ("-P", "-u", "-B", "-E", "-s", "-I"):  # python's own flags
        rest = rest[1:]
    runs = rest[0:2] if rest[:1] == ["-m"] else rest[0:1]
    if program.startswith("gunicorn") or (
        program.startswith("python")
        and any(w == "app.serving.master" or Path(w).name == "gunicorn" for w in runs)
    ):
        return None
    return " ".join(words)


def check_model_dir(model_dir: Path) -> Manifest:
    """``model.json`` and the files it names, checked without TensorFlow; ``SpoError`` names the problem."""
    return load_manifest(model_dir, check_files=True)


def model_label(manifest: Manifest) -> str:
    return f"{manifest.name} v{manifest.version} ({manifest.directory})"


def handed_settings() -> Settings:
    """The master's settings, read once: those ``spo serve`` handed over in ``SETTINGS_VAR`` (removed
    from the environment, so no worker sees it), else ``SPO_*`` parsed once. ``SettingsError`` names
    the problem. Called by ``deploy/gunicorn.conf.py`` and ``SpoArbiter``; later calls return it."""
    global SETTINGS
    if SETTINGS is None:
        handed = os.environ.pop(SETTINGS_VAR, None)
        SETTINGS = Settings.from_json(handed) if handed is not None else Settings.from_env()
    return SETTINGS


def worker_app() -> Any:
    """The app of a gunicorn worker (``wsgi_app`` in ``deploy/gunicorn.conf.py``): ``create_app``
    with the settings of the worker's generation, handed down by the fork."""
    from app import create_app

    # `--check-config` builds the app only to validate it and exits at once: a model load started
    # then would be cut off inside TensorFlow at interpreter exit (seen as SIGABRT under load).
    if CHECK_ONLY:
        _throwaway_metrics_dir()
    return create_app(handed_settings(), load_models=not CHECK_ONLY)


def _throwaway_metrics_dir() -> None:
    """A ``--check-config`` app's metrics go to a directory of its own, removed at its exit: under a
    given ``PROMETHEUS_MULTIPROC_DIR`` (a running server's, in a pod) its files would add series of a
    process that never serves (``spo_worker_rss_bytes`` of its pid, forever)."""
    import atexit
    import shutil

    from app.core.rundirs import METRICS_DIR_PREFIX, make_run_dir

    own = make_run_dir(f"{METRICS_DIR_PREFIX}check-")
    os.environ[MULTIPROC_ENV] = str(own)
    atexit.register(shutil.rmtree, own, ignore_errors=True)


def resolve_models(settings: Settings) -> tuple[Settings, list[Manifest]]:
    """``settings`` with the model variables (``SPO_MODEL_DIR`` / ``SPO_MODELS``) of the environment
    read again (every directory resolved: a switched symlink is followed), and every model's checked
    manifest: what a reload's generation is pinned to. ``SettingsError`` / ``SpoError`` name the
    problem."""
    given = Settings.from_env(only=("model_dir", "models"))
    pinned = settings.replace(model_dir=given.model_dir, models=given.models).pinned()
    return pinned, [check_model_dir(directory) for _, directory in pinned.model_table]


def models_label(settings: Settings) -> str:
    return ", ".join(str(directory) for _, directory in settings.model_table)


# -- worker side ---------------------------------------------------------------------------------
def report(state: str, **details: Any) -> None:
    """Tell the master this worker's model state (``ready`` or ``failed``); a no-op without a master."""
    if REPORT_FD is None:
        return
    doc = {"pid": os.getpid(), "state": state, **details}
    line = _report_line(doc)
    # A full or closed pipe (the master busy or stopping) loses the report; the worker serves regardless.
    with contextlib.suppress(OSError):
        os.write(REPORT_FD, line + b"\n")


def _report_line(doc: dict[str, Any]) -> bytes:
    """``doc`` as one JSON line of at most ``_REPORT_LIMIT`` bytes (one atomic pipe write): a
    ``detail`` too long is shortened, never the line (cut bytes could end in a ``}`` of the detail
    and pass for whole, then fail to parse); past that, only the pid and the state go. ASCII
    escapes: any string is sent, a lone surrogate included.

    >>> line = _report_line({"pid": 1, "state": "failed", "detail": "{{node x}}" * 1000})
    >>> len(line) <= _REPORT_LIMIT, json.loads(line)["detail"][-1]
    (True, '~')
    """
    line = json.dumps(doc).encode()
    while len(line) > _REPORT_LIMIT and len(str(doc.get("detail", ""))) > 1:
        detail = str(doc["detail"])
        per_char = max(1.0, (len(json.dumps(detail)) - 2) / len(detail))  # escapes: up to 6 bytes
        cut = int((len(line) - _REPORT_LIMIT) / per_char) + 2
        doc["detail"] = detail[: max(0, len(detail) - cut)] + "~"
        line = json.dumps(doc).encode()
    if len(line) > _REPORT_LIMIT:
        line = json.dumps({"pid": doc["pid"], "state": doc["state"]}).encode()
    return line


def watch_worker(worker: Any) -> None:
    """In a worker after its app is created (``post_worker_init``): report the model state now and on
    every change (a failed load that later succeeds).

    A worker of a reload's new generation returns (and so starts accepting connections) only once its
    model is ready: until then the old generation serves, and a new worker whose model failed waits
    here until the master retires it, answering no request at all."""
    models = getattr(getattr(worker, "wsgi", None), "extensions", {}).get("spo.models")
    if models is None:
        return
    slots = [m.slot for m in models]

    # Several models (app.web.registry): the worker is ready when every one is, failed when any is.
    def send(_changed: Any = None) -> None:
        failed = [s for s in slots if s.error is not None and not s.ready]
        if failed:
            error = failed[0].error
            detail = (
                error.message if isinstance(error, SpoError) else f"{type(error).__name__}: {error}"
            )
            report("failed", code=failed[0].error_code, detail=detail)
        elif all(s.ready for s in slots):
            summaries = [s.extractor.manifest.summary() for s in slots if s.extractor is not None]
            report(
                "ready",
                model=", ".join(str(x["name"]) for x in summaries),
                version=", ".join(str(x["version"]) for x in summaries),
            )

    for slot in slots:
        slot.on_change(send)
    if any(s.state != "loading" for s in slots):
        send()
    if RELOAD_GENERATION:
        while worker.alive and not all(s.ready for s in slots):
            time.sleep(_WAIT_S)


# -- master side ---------------------------------------------------------------------------------
@dataclass
class PendingReload:
    """A new generation of workers loading beside the old one."""

    old: set[int]
    new: set[int]
    previous: Settings
    label: str
    started: float = field(default_factory=time.monotonic)
    # New workers that reported their model ready (a report read after the worker was reaped too).
    ready: set[int] = field(default_factory=set)
    # Since when the newest of ``new`` loads: a worker replaced mid-reload gets SPO_TIMEOUT of its own.
    loading_since: float = field(default_factory=time.monotonic)


class SpoArbiter(Arbiter):  # type: ignore[misc]
    """gunicorn's ``Arbiter`` with model-aware start and reload (see the module docstring)."""

    def __init__(self, app: Any) -> None:
        super().__init__(app)
        global REPORT_FD
        self._reports_r, REPORT_FD = os.pipe()
        os.set_blocking(self._reports_r, False)
        os.set_blocking(REPORT_FD, False)
        self._partial = b""
        # The settings of the generation that serves: as handed over (model directories resolved).
        # A -w flag after `--` wins over them, so TensorFlow threads are split by the real count.
        settings = handed_settings().pinned()  # pinned by spo serve already; by hand, here
        if settings.workers != self.num_workers:
            settings = settings.replace(workers=self.num_workers, require_model=False)
        self.settings = settings
        self.ever_ready = False
        self.states: dict[int, dict[str, Any]] = {}
        self.pending: PendingReload | None = None
        self.reload_again = False  # a HUP came during a reload: reload once more after it
        self.retiring: set[int] = set()  # sent SIGTERM by us, finishing their requests

    # Each worker gets the settings (so the directories) its generation was started with, by the fork.
    def spawn_worker(self) -> int:
        global SETTINGS
        SETTINGS = self.settings
        pid: int = super().spawn_worker()
        return pid

    def reload(self) -> None:
        """SIGHUP: check the (re-resolved) model directory, then load it in new workers beside the old."""
        if self.pending is not None:
            # Not dropped: it may carry what the one in progress does not (the link moved again, a
            # revoked token), so the last HUP always wins.
            self.reload_again = True
            self.log.warning(
                "reload already in progress (%s, %.0fs); another follows once it ends",
                self.pending.label,
                time.monotonic() - self.pending.started,
            )
            return
        try:
            settings, manifests = resolve_models(self.settings)
        except Exception as exc:  # whatever the check trips on, the master serves on
            if isinstance(exc, SpoError):
                reason = exc.message
            elif isinstance(exc, SettingsError):
                reason = str(exc)
            else:  # a check that missed a case: the server must not halt on it (logged in full)
                self.log.exception("checking the models to reload failed unexpectedly")
                reason = f"{type(exc).__name__}: {exc}"
            self.log.error(
                "reload refused: %s; the %d running workers keep serving %s",
                reason,
                len(self.WORKERS),
                models_label(self.settings),
            )
            return
        blocked = preload_blocks_reload(manifests, os.environ.get("LD_PRELOAD", ""))
        if blocked is None:  # both generations run at once until the new one is ready
            sizing = dataclasses.replace(settings.sizing(), workers=self.num_workers)
            blocked = reload_memory_problem(len(self.WORKERS), sizing)
        if blocked is not None:
            self.log.error(
                "reload refused: %s; the %d running workers keep serving %s",
                blocked,
                len(self.WORKERS),
                models_label(self.settings),
            )
            return
        self.log.reopen_files()
        old = set(self.WORKERS)
        previous, self.settings = self.settings, settings
        label = ", ".join(model_label(m) for m in manifests)
        self.log.info(
            "reload: starting %d workers on %s; the %d old workers serve until they are ready",
            self.num_workers,
            label,
            len(old),
        )
        self.pending = PendingReload(old, self._spawn_new(self.num_workers), previous, label)

    def _spawn_new(self, count: int) -> set[int]:
        """``count`` workers of the reload's new generation (``self.settings``, waiting until ready)."""
        global RELOAD_GENERATION
        RELOAD_GENERATION = True
        try:
            return {self.spawn_worker() for _ in range(count)}
        finally:
            RELOAD_GENERATION = False

    def manage_workers(self) -> None:
        """gunicorn's, except that during a reload both generations run (nothing is spawned or stopped
        until it is decided) and that workers being retired do not count."""
        self._read_reports()
        self.retiring &= set(self.WORKERS)
        if self.pending is not None:
            self._advance_reload(self.pending)
        if self.pending is None and self.reload_again:
            self.reload_again = False
            self.reload()
        if self.pending is not None:
            self._keep_old_serving(self.pending)
            return
        serving = sorted(
            (w.age, pid) for pid, w in self.WORKERS.items() if pid not in self.retiring
        )
        for _ in range(self.num_workers - len(serving)):
            self.spawn_worker()
        for _, pid in serving[: max(0, len(serving) - self.num_workers)]:
            self._retire({pid})

    def _keep_old_serving(self, pending: PendingReload) -> None:
        """An old worker that exits while the new ones load (recycled, a crash) is replaced by one
        of the old generation: until the new ones are ready the old serve alone, and with none left
        every request would wait for the reload."""
        serving = pending.old & set(self.WORKERS) - self.retiring
        missing = self.num_workers - len(serving)
        if missing <= 0:
            return
        current, self.settings = self.settings, pending.previous
        try:
            started = {self.spawn_worker() for _ in range(missing)}
        finally:
            self.settings = current
        pending.old |= started
        self.log.warning(
            "reload: %d old worker(s) exited while the new ones load; started as many of the old "
            "generation in their place",
            missing,
        )

    def _retire(self, pids: set[int]) -> None:
        """SIGTERM: finish the requests in hand, then exit."""
        for pid in pids & set(self.WORKERS) - self.retiring:
            self.kill_worker(pid, signal.SIGTERM)
            self.retiring.add(pid)

    def reap_workers(self) -> None:
        workers = dict(self.WORKERS)
        try:
            super().reap_workers()
        except HaltServer as exc:
            # A new worker that cannot even boot fails the reload; it does not halt a serving server.
            if self.pending is None or not self.ever_ready:
                raise
            # gunicorn raised before its own clean-up of the worker it had just reaped: do it (the
            # heartbeat file's descriptor, child_exit and its metrics files), else each such reload
            # leaks both.
            for pid, worker in workers.items():
                if pid not in self.WORKERS and not worker.tmp._tmp.closed:
                    worker.tmp.close()
                    self.cfg.child_exit(self, worker)
            self.log.error("a new worker failed to boot (%s)", exc.reason)
            self._fail_reload(self.pending, "a new worker failed to boot")
            self.reap_workers()
        for pid in list(self.states):
            if pid not in self.WORKERS:
                del self.states[pid]

    def _advance_reload(self, pending: PendingReload) -> None:
        alive = pending.new & set(self.WORKERS)
        gone = pending.new - alive
        failed = [self.states[p] for p in alive if self.states.get(p, {}).get("state") == "failed"]
        if failed:
            self._fail_reload(pending, f"{failed[0].get('code')}: {failed[0].get('detail')}")
        elif gone - pending.ready:
            self._fail_reload(pending, "a new worker exited before its model was ready")
        elif gone:
            # Ready, then gone (recycled after its max_requests, the RSS watchdog, a crash): the model
            # loads, so the reload goes on; a new worker of the same generation takes its place.
            pending.new = alive | self._spawn_new(len(gone))
            pending.loading_since = time.monotonic()
            self.log.warning(
                "reload: %d new worker(s) exited after their model was ready; started as many in "
                "their place",
                len(gone),
            )
        elif time.monotonic() - pending.loading_since > self.timeout:
            self._fail_reload(pending, f"the new workers were not ready within {self.timeout}s")
        elif all(self.states.get(p, {}).get("state") == "ready" for p in pending.new):
            self._retire(pending.old)
            self.log.info(
                "reload done in %.1fs: %d workers serve %s; the %d old workers finish their requests "
                "and exit",
                time.monotonic() - pending.started,
                len(pending.new),
                pending.label,
                len(pending.old & set(self.WORKERS)),
            )
            self.pending = None

    def _fail_reload(self, pending: PendingReload, reason: str) -> None:
        # A new worker that is not ready has accepted no connection (it waits in watch_worker): stop it
        # at once, even mid-load (SIGQUIT), so it gives the CPU back to the generation that serves.
        for pid in pending.new & set(self.WORKERS):
            if self.states.get(pid, {}).get("state") != "ready":
                self.kill_worker(pid, signal.SIGQUIT)
                self.retiring.add(pid)
        self._retire(pending.new)
        self.settings = pending.previous
        self.pending = None
        self.log.error(
            "reload failed after %.1fs: %s cannot be served (%s); the new workers are stopped and "
            "the old ones keep serving %s",
            time.monotonic() - pending.started,
            pending.label,
            reason,
            models_label(self.settings),
        )

    def _read_reports(self) -> None:
        while True:
            try:
                chunk = os.read(self._reports_r, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            self._partial += chunk
        *lines, self._partial = self._partial.split(b"\n")
        for line in lines:
            try:
                doc = json.loads(line)
                pid = int(doc["pid"])
            except (ValueError, KeyError, TypeError):
                self.log.warning("unreadable worker report: %r", line[:200])
                continue
            if doc.get("state") == "ready":
                # A worker loaded its model, even one reaped before this report was read (recycled
                # at once under load): the server has been ready, so a later failure never halts it.
                self.ever_ready = True
                if self.pending is not None and pid in self.pending.new:
                    self.pending.ready.add(pid)
            if pid in self.WORKERS and pid not in self.retiring:
                self._on_report(pid, doc)

    def _on_report(self, pid: int, doc: dict[str, Any]) -> None:
        self.states[pid] = doc
        if doc.get("state") == "ready":  # ever_ready is set by _read_reports, for reaped ones too
            return
        reason = f"{doc.get('code')}: {doc.get('detail')}"
        if not self.ever_ready and self.pending is None:
            raise HaltServer(f"the model failed to load: {reason}", self.WORKER_BOOT_ERROR)
        if self.pending is None or pid not in self.pending.new:
            ready = sum(1 for s in self.states.values() if s.get("state") == "ready")
            self.log.error(
                "worker %s cannot load the model (%s); it answers 503 and retries; "
                "%d of %d workers ready",
                pid,
                reason,
                ready,
                len(self.WORKERS),
            )


# True while gunicorn only prints or checks the configuration (``worker_app`` then loads no model).
CHECK_ONLY = False


class SpoApplication(WSGIApplication):  # type: ignore[misc]
    """gunicorn's command line, run by ``SpoArbiter``."""

    def run(self) -> None:
        if self.cfg.print_config or self.cfg.check_config:
            global CHECK_ONLY
            CHECK_ONLY = True
            super().run()  # gunicorn validates and exits
            return
        try:
            SpoArbiter(self).run()
        except RuntimeError as exc:
            print(f"\nError: {exc}\n", file=sys.stderr)
            sys.stderr.flush()
            sys.exit(1)


def main() -> None:
    SpoApplication("%(prog)s [OPTIONS] [APP_MODULE]", prog="spo serve").run()


if __name__ == "__main__":
    # Run the importable module, not this ``__main__`` copy: workers reach ``REPORT_FD`` as app.serving.master's.
    from app.serving.master import main as _main

    _main()
