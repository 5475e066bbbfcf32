"""``spo serve --nginx HOST:PORT``: nginx in front of gunicorn on a private unix socket, both supervised.

The production layout in one command. nginx listens on HOST:PORT, or with a bare PORT on every address,
IPv6 too where the machine has it (``app.serving.nginx.listen_directives``). A private run directory (``mkdtemp``, mode 0711: nginx's
workers may reach the socket but nobody may list the directory) holds gunicorn's socket and nginx's
prefix (the rendered ``deploy/nginx.conf``, its pid file and temp files). Both processes start in
their own process group, so a Ctrl-C in the terminal reaches only this supervisor, which then stops them
in order, and with ``PR_SET_PDEATHSIG`` so that they are told to stop even if it is killed.

- SIGTERM / SIGINT / SIGQUIT: nginx stops accepting and finishes its requests (SIGQUIT), then gunicorn stops
  gracefully (SIGTERM: its workers finish theirs); ``SPO_GRACEFUL_TIMEOUT`` + 5 s after the signal, for
  both together, whatever is left is killed. The run directory is removed: no socket, pid file or temp file stays behind. A supervisor
  killed outright (SIGKILL) cannot remove it; the next ``spo serve --nginx`` on the machine does (its
  ``owner.pid`` names a process that is gone: ``app.core.rundirs``), so a container restarted after kills
  does not fill its ``/tmp``.
- SIGHUP: passed to gunicorn's master, which reloads the model (``app.serving.master``); ``spo reload`` does
  the same through the pid file. The master reads ``SPO_AUTH_TOKENS_FILE`` again for the new workers.
  One that comes while the master is still starting (before its socket exists, and so before its
  handlers: SIGHUP's default would end it) is held until it can take it.
- A renewed TLS certificate: the supervisor looks at ``SPO_TLS_CERT`` and ``SPO_TLS_KEY`` every
  ``CERT_CHECK_S`` (the file each path leads to: a Kubernetes Secret's symlink switch counts), and once
  a change has held for one look (so a pair written one file at a time, or a file half-written, is not
  taken) sends nginx SIGHUP: nginx reads them again and starts new workers, the old ones finishing their
  requests. A pair nginx cannot use is refused by nginx itself (its error on stderr), which goes on
  with the old one.
- A worker killed under a request: nginx sends that request once more, to another worker
  (``deploy/nginx.conf``, ``proxy_next_upstream``); gunicorn's master starts a new worker.
- If either process exits on its own, the other is stopped and the supervisor exits non-zero.

nginx's errors go to this process's stderr, and the access lines of the requests gunicorn never
answered (nginx's own answers: its limits, malformed requests; and the 503s of an upstream that gave
none) to its stdout, through a pipe; no log is written in the run directory. gunicorn's logs and
access log stay on stdout/stderr as without ``--nginx``. Every line keeps to ``SPO_LOG_FORMAT``: the
supervisor's own lines go through the one logging setup (``app.core.logs``, made by ``spo serve``
before it gets here; logger ``spo.serve``), nginx's access lines are rendered in that format
by nginx itself, and under ``json`` each nginx error line becomes one JSON object (logger ``nginx``,
its level from nginx's ``[warn]``/``[error]``...), so a log shipper never meets a line it cannot parse.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, TextIO

import click

from app.core.rundirs import make_run_dir, remove_stale_run_dirs
from app.core.settings import Settings
from app.serving.launch import gunicorn_command
from app.serving.nginx import NGINX_PATH, nginx_http2, render_nginx_conf

NGINX_CANDIDATES = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")
NGINX_MISSING = (
    "nginx is not installed, and --nginx runs it. On Debian or Ubuntu: "
    "sudo apt-get install nginx-light (or nginx). Or serve with gunicorn alone: drop --nginx."
)
_PR_SET_PDEATHSIG = 1
_POLL_S = 0.2
CERT_CHECK_S = 2.0  # how often the TLS files are looked at (a renewal is picked up in 2-4 s)
RUN_DIR_PREFIX = "spo-serve-"


_log = logging.getLogger("spo.serve")


def _say(message: str, level: int = logging.INFO) -> None:
    """The supervisor's own lines, on stderr beside gunicorn's and nginx's, in ``SPO_LOG_FORMAT``."""
    _log.log(level, "%s", message)


def find_nginx() -> str | None:
    """The nginx binary: on the PATH, else where Debian and source builds put it."""
    found = shutil.which("nginx")
    if found:
        return found
    return next((p for p in NGINX_CANDIDATES if os.access(p, os.X_OK)), None)


def _die_with_parent() -> None:
    """In the child before exec: its own process group, and SIGTERM when the supervisor dies."""
    os.setpgid(0, 0)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


class Supervisor:
    """Runs nginx and gunicorn, forwards signals, stops both cleanly; ``run()`` returns the exit code."""

    def __init__(
        self,
        nginx_argv: Sequence[str],
        gunicorn_argv: Sequence[str],
        gunicorn_env: Mapping[str, str],
        *,
        graceful_timeout: float,
        on_exit: Callable[[], None] = lambda: None,
        certificates: Sequence[Path] = (),
        errors_as_log: bool = False,
        gunicorn_socket: Path | None = None,
    ) -> None:
        # Where gunicorn listens once its master handles signals: a SIGHUP before waits for it (a
        # master still importing has SIGHUP's default, which ends it, and the whole service).
        self.gunicorn_socket = gunicorn_socket
        # nginx's error lines as log records (SPO_LOG_FORMAT=json), else relayed as written
        self.errors_as_log = errors_as_log
        self.nginx_argv = list(nginx_argv)
        self.gunicorn_argv = list(gunicorn_argv)
        self.gunicorn_env = dict(gunicorn_env)
        self.graceful_timeout = graceful_timeout
        self.on_exit = on_exit
        self.signals: list[int] = []
        self.certificates = list(certificates)
        # What nginx was started with (or last reloaded onto), and what the last look saw.
        self._loaded = self._seen = _signature(self.certificates)
        self._looked = time.monotonic()

    def _queue(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append(signum)

    def run(self) -> int:
        # SIGQUIT too: nginx's and gunicorn's own graceful stop; unhandled, it killed this process
        # outright, nginx then stopped fast by its PDEATHSIG and the requests in flight failed.
        handled = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)
        previous = {s: signal.signal(s, self._queue) for s in handled}
        gunicorn = nginx = None
        threads: list[threading.Thread] = []
        try:
            gunicorn = subprocess.Popen(
                self.gunicorn_argv, env=self.gunicorn_env, preexec_fn=_die_with_parent
            )
            # nginx's access lines come through a pipe: /dev/stdout cannot be opened when this
            # process's stdout is a socket (systemd's journal), and a pipe always can.
            # Its error lines too: they quote what clients sent (a Referer, a path) as it came,
            # control bytes included, and are escaped on their way (docs/rest.md, "Logs").
            nginx = subprocess.Popen(
                self.nginx_argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                preexec_fn=_die_with_parent,
            )
            assert nginx.stdout is not None and nginx.stderr is not None
            threads.append(threading.Thread(target=_relay, args=(nginx.stdout, sys.stdout)))
            if self.errors_as_log:
                log = logging.getLogger("nginx")
                threads.append(threading.Thread(target=_relay_to_log, args=(nginx.stderr, log)))
            else:
                threads.append(threading.Thread(target=_relay, args=(nginx.stderr, sys.stderr)))
            for thread in threads:
                thread.daemon = True
                thread.start()
            return self._watch(gunicorn, nginx)
        finally:
            self._stop(nginx, gunicorn)
            for thread in threads:  # nginx is gone: its last lines (an [emerg]) are still relayed
                thread.join(2.0)
            for s, handler in previous.items():
                signal.signal(s, handler)
            self.on_exit()

    def _watch(self, gunicorn: subprocess.Popen[bytes], nginx: subprocess.Popen[bytes]) -> int:
        held = False  # a SIGHUP that came before gunicorn could take it (several make one reload)
        while True:
            while self.signals:
                signum = self.signals.pop(0)
                if signum == signal.SIGHUP:
                    if not held and not self._gunicorn_listens():
                        _say("SIGHUP: held until gunicorn's master is up (it is still starting)")
                    held = True
                else:
                    _say(f"{signal.Signals(signum).name}: stopping nginx, then gunicorn")
                    return 0
            if held and self._gunicorn_listens():
                _say("SIGHUP: passing it to gunicorn (model reload)")
                gunicorn.send_signal(signal.SIGHUP)
                held = False
            for name, process in (("gunicorn", gunicorn), ("nginx", nginx)):
                code = process.poll()
                if code is not None:
                    _say(f"{name} exited (status {code}): stopping the other", logging.ERROR)
                    return code or 1
            if self.certificates and time.monotonic() - self._looked >= CERT_CHECK_S:
                self._look_at_certificates(nginx)
            time.sleep(_POLL_S)

    def _gunicorn_listens(self) -> bool:
        return self.gunicorn_socket is None or self.gunicorn_socket.exists()

    def _look_at_certificates(self, nginx: subprocess.Popen[bytes]) -> None:
        """SIGHUP to nginx once the certificate files changed and then held still for one look."""
        self._looked = time.monotonic()
        now = _signature(self.certificates)
        if now == self._seen and now != self._loaded:
            _say("the TLS certificate or key changed: reloading nginx (SIGHUP)")
            nginx.send_signal(signal.SIGHUP)
            self._loaded = now
        self._seen = now

    def _stop(
        self, nginx: subprocess.Popen[bytes] | None, gunicorn: subprocess.Popen[bytes] | None
    ) -> None:
        # nginx first, gracefully: it stops accepting and its requests in flight finish upstream;
        # then gunicorn, whose workers finish what they hold. One budget for both (a container's
        # grace period is sized on it: docs/deploy.md), not one each.
        deadline = time.monotonic() + self.graceful_timeout + 5
        for process, sig in ((nginx, signal.SIGQUIT), (gunicorn, signal.SIGTERM)):
            if process is None or process.poll() is not None:
                continue
            process.send_signal(sig)
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _say(f"pid {process.pid} did not stop in time: killing it", logging.WARNING)
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


# A control byte (but a tab) as \xNN: a client's bytes quoted in an nginx line cannot move the
# cursor, clear a terminal or end the line early.
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


def _relay(lines: IO[bytes], out: TextIO | None) -> None:
    """nginx's lines (its access lines, its error lines) onto ``out``, this process's stdout or
    stderr, a line at a time with control bytes escaped, until nginx is gone."""
    for line in lines:  # read to the end whatever happens: a pipe left full would block nginx
        if out is None:
            continue
        body = line.removesuffix(b"\n")
        try:
            out.buffer.write(_CONTROL.sub(lambda m: b"\\x%02x" % m.group()[0], body) + b"\n")
            out.buffer.flush()
        except (OSError, ValueError):  # ``out`` closed: the lines have nowhere to go
            out = None


# nginx's error line: "2026/12/06 17:50:01 [warn] 12#12: *3 ..."; its level, as logging's.
_NGINX_LEVEL = re.compile(rb"^\S+ \S+ \[(\w+)\] ")
_NGINX_LEVELS = {
    b"emerg": logging.CRITICAL,
    b"alert": logging.CRITICAL,
    b"crit": logging.CRITICAL,
    b"error": logging.ERROR,
    b"warn": logging.WARNING,
    b"notice": logging.INFO,
    b"info": logging.INFO,
    b"debug": logging.DEBUG,
}


def _relay_to_log(lines: IO[bytes], log: logging.Logger) -> None:
    """nginx's error lines as records of ``log`` (``SPO_LOG_FORMAT=json``: one JSON object each, its
    message the line as nginx wrote it, bytes that are not UTF-8 as ``\\xNN``), until nginx is gone."""
    for line in lines:  # read to the end: a pipe left full would block nginx
        body = line.removesuffix(b"\n")
        found = _NGINX_LEVEL.match(body)
        level = _NGINX_LEVELS.get(found.group(1), logging.ERROR) if found else logging.ERROR
        log.log(level, "%s", body.decode("utf-8", "backslashreplace"))


def _signature(paths: Sequence[Path]) -> tuple[tuple[int, ...] | None, ...]:
    """What identifies each file's content cheaply: the file a path leads to, its size and mtime."""
    found: list[tuple[int, ...] | None] = []
    for path in paths:
        try:
            st = path.stat()
        except OSError:
            found.append(None)
        else:
            found.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(found)


def has_ipv6() -> bool:
    """Whether nginx can listen on IPv6 here: a socket bound to ``[::]`` (a kernel without IPv6,
    ``ipv6.disable=1``, refuses it, and nginx would fail to start on ``listen [::]:PORT``)."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::", 0))
    except OSError:
        return False
    return True


def _configure(
    nginx: str, settings: Settings, listen: str, prefix: Path, socket_path: Path
) -> tuple[list[str], str | None]:
    """Write ``prefix/nginx.conf`` for ``listen`` in front of gunicorn at ``socket_path`` and have
    nginx test it (``nginx -t``); the command line that runs nginx on it, and how it turns HTTP/2
    on (``nginx_http2``). A setting nginx cannot be
    given is a ``UsageError``; a configuration nginx refuses, a ``ClickException`` with its words."""
    if not NGINX_PATH.match(str(prefix)):  # its pid, temp and socket paths, all under TMPDIR
        raise click.UsageError(
            f"nginx cannot be given paths under {prefix.parent.parent} (TMPDIR): use a TMPDIR of "
            "letters, digits and ._/+@=,:- only"
        )
    conf = prefix / "nginx.conf"
    # HTTP/2 with TLS where this nginx has it (Debian's 1.22: `listen ... ssl http2`).
    version = subprocess.run([nginx, "-V"], capture_output=True, text=True, check=False)
    http2 = nginx_http2(version.stderr) if settings.tls else None
    try:
        text = render_nginx_conf(
            settings,
            listen=listen,
            upstream=f"unix:{socket_path}",
            prefix=prefix,
            http2=http2,
            ipv6=has_ipv6(),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    conf.write_text(text, encoding="utf-8")
    nginx_argv = [nginx, "-p", str(prefix), "-c", str(conf)]
    check = subprocess.run([*nginx_argv, "-t", "-q"], capture_output=True, text=True, check=False)
    if check.returncode != 0:
        raise click.ClickException(f"nginx refuses the configuration:\n{check.stderr.strip()}")
    return nginx_argv, http2


def check_nginx_config(settings: Settings, listen: str) -> None:
    """``spo serve --nginx ... --check-config``: the configuration rendered and tested by nginx in a
    throw-away prefix, as a start would (nothing listens)."""
    nginx = find_nginx()
    if nginx is None:
        raise click.ClickException(NGINX_MISSING)
    with tempfile.TemporaryDirectory(prefix="spo-check-") as tmp:
        prefix = Path(tmp) / "nginx"
        prefix.mkdir()
        Path(tmp).chmod(0o711)  # nginx's workers (not root) reach the prefix, as in a run
        _configure(nginx, settings, listen, prefix, Path(tmp) / "gunicorn.sock")


def serve_behind_nginx(
    settings: Settings,
    listen: str,
    pid_file: Path,
    gunicorn_args: Sequence[str],
    environ: Mapping[str, str],
) -> int:
    """``spo serve --nginx``: render the config, start and supervise both; the exit code."""
    nginx = find_nginx()
    if nginx is None:
        raise click.ClickException(NGINX_MISSING)
    for stale in remove_stale_run_dirs(RUN_DIR_PREFIX):
        _say(f"removed {stale}: the run directory of a spo serve --nginx that was killed")
    run_dir = make_run_dir(RUN_DIR_PREFIX, mode=0o711)  # nginx's workers reach the socket
    try:
        socket_path = run_dir / "gunicorn.sock"
        prefix = run_dir / "nginx"
        prefix.mkdir()
        nginx_argv, http2 = _configure(nginx, settings, listen, prefix, socket_path)
        argv, env = gunicorn_command(
            settings.replace(bind=f"unix:{socket_path}"),
            gunicorn_args,
            environ,
            pid_file=pid_file,
        )
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    scheme = f"https{' (HTTP/2)' if http2 else ''}" if settings.tls else "http"
    _say(
        f"nginx ({scheme}) on {listen} -> gunicorn on unix:{socket_path}, "
        f"{settings.workers} worker(s), "
        f"models {', '.join(f'{n}={d}' for n, d in settings.model_table)}; pid file {pid_file}"
    )
    sys.stderr.flush()
    supervisor = Supervisor(
        nginx_argv,
        argv,
        env,
        graceful_timeout=settings.graceful_timeout,
        on_exit=lambda: shutil.rmtree(run_dir, ignore_errors=True),
        certificates=[p for p in (settings.tls_cert, settings.tls_key) if p is not None],
        errors_as_log=settings.log_format == "json",
        gunicorn_socket=socket_path,
    )
    return supervisor.run()
