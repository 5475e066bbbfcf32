"""``spo serve`` and ``spo reload``: validate the settings and the model, then run gunicorn (alone, or
behind nginx with ``--nginx``); send the running master SIGHUP.

The settings are resolved once, here: ``SPO_*`` variables with the flags over them (flags win), the
worker count sized (``app.core.sizing``), then handed to gunicorn (``app.serving.launch``: one
serialized value across the exec that jemalloc's ``LD_PRELOAD`` needs). With ``--nginx HOST:PORT``,
``app.serving.supervisor`` runs nginx there (``app.serving.nginx``) in front of gunicorn on a private
unix socket and supervises both. Settings only nginx applies (``SPO_RATE_LIMIT``, TLS) are refused
without ``--nginx`` (``nginx_only_problems``), never silently ignored.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

import click

from app.core.logs import configure_logging
from app.core.options import LISTEN, address_problem, click_options
from app.core.settings import LogSettings, Settings, SettingsError
from app.serving.launch import (
    default_pid_file,
    gunicorn_args_problems,
    gunicorn_command,
    pid_file_problem,
)
from app.serving.master import check_model_dir, not_a_master
from app.serving.nginx import nginx_only_problems
from nlp.errors import SpoError

_log = logging.getLogger("spo.serve")  # its lines once the settings are read (SPO_LOG_FORMAT)


def secret_warnings(settings: Settings) -> list[str]:
    """Secret files (the tokens file, the TLS key) that every user of the machine may read."""
    out = []
    for var, path in (
        ("SPO_AUTH_TOKENS_FILE", settings.auth_tokens_file),
        ("SPO_TLS_KEY", settings.tls_key),
    ):
        if path is None:
            continue
        mode = path.stat().st_mode & 0o777
        if mode & 0o004:
            out.append(
                f"{var} {path} is readable by every user (mode {mode:04o}): make it 0400 or 0440 "
                "(a Kubernetes Secret volume: defaultMode)"
            )
    return out


def _settings(env: Mapping[str, str]) -> Settings:
    # The parse may log (an unknown SPO_ variable): in SPO_LOG_FORMAT already, where those two are
    # valid (else the parse names them, and its warning goes out plain).
    if not logging.getLogger().handlers:
        with contextlib.suppress(SettingsError):
            configure_logging(LogSettings.from_env(env))
    try:
        return Settings.from_env(env)
    except SettingsError as exc:
        raise click.UsageError(str(exc)) from None


@click.command("serve", context_settings={"ignore_unknown_options": True})
@click_options("serve")
@click.option(
    "--nginx",
    "nginx_listen",
    metavar="HOST:PORT",
    help="Run nginx (Debian's) listening here in front of gunicorn on a private unix socket, and "
    "supervise both (--bind is then not used). HTTPS with SPO_TLS_CERT and SPO_TLS_KEY; "
    "SPO_RATE_LIMIT and TLS need it.",
)
@click.option(
    "--check-config",
    is_flag=True,
    help="Validate settings and gunicorn config, print the resolved sizing and why, then exit.",
)
@click.argument("gunicorn_args", nargs=-1, type=click.UNPROCESSED)
def serve(
    bind: str | None,
    workers: int | None,
    nginx_listen: str | None,
    check_config: bool,
    gunicorn_args: tuple[str, ...],
) -> None:
    """Serve the REST API with gunicorn, or nginx + gunicorn with --nginx (configured by SPO_*
    variables; see docs/rest.md). SIGHUP (or `spo reload`) reloads the model without dropping a
    request; SIGTERM/SIGINT stop everything gracefully."""
    # The one parse: the environment with the flags over it (a local mapping, not os.environ).
    flags = {"SPO_BIND": bind, "SPO_WORKERS": None if workers is None else str(workers)}
    for variable, value in flags.items():
        if value is not None and not value.strip():  # `--bind=`: blank in the environment is unset
            flag = "--" + variable.removeprefix("SPO_").lower()
            raise click.BadParameter("expected a value, got nothing", param_hint=flag)
    settings = _settings({**os.environ, **{k: v for k, v in flags.items() if v is not None}})
    if nginx_listen is not None and (
        listen_problem := address_problem(nginx_listen, LISTEN, "HOST:PORT or PORT")
    ):
        raise click.BadParameter(listen_problem, param_hint="--nginx")
    unapplied = nginx_only_problems(settings) if nginx_listen is None else []
    if unapplied:
        raise click.UsageError(
            "settings that cannot take effect:\n" + "\n".join(f"  {p}" for p in unapplied)
        )
    # The model is checked here, without TensorFlow, so a bad one fails at once with its reason
    # (what only TensorFlow can find fails the first worker, which halts the server: app.serving.master).
    checked = []
    for name, directory in settings.model_table:
        try:
            checked.append(((name, directory), check_model_dir(directory)))
        except SpoError as exc:
            raise click.ClickException(f"cannot serve {directory}: {exc.message}") from None
    address = nginx_listen if nginx_listen is not None else settings.bind
    pid_file = settings.pid_file or default_pid_file(address)
    if problem := pid_file_problem(pid_file):
        raise click.UsageError(f"{problem} (SPO_PID_FILE)")
    owned = gunicorn_args_problems(gunicorn_args)
    if owned:
        raise click.UsageError(
            "arguments after -- that spo serve decides:\n" + "\n".join(f"  {p}" for p in owned)
        )
    extra = list(gunicorn_args)
    sizing = settings.sizing()
    # From here its lines are log lines, in SPO_LOG_FORMAT as gunicorn's and nginx's are (a program
    # embedding the command keeps its own logging set-up).
    if not logging.getLogger().handlers:
        configure_logging(settings)
    if check_config:
        extra.append("--check-config")
        click.echo("resolved sizing (app.core.sizing):")
        for line in sizing.lines():
            click.echo(f"  {line}")
        if nginx_listen is not None:  # what a start would give nginx, tested by nginx
            from app.serving.supervisor import check_nginx_config

            check_nginx_config(settings, nginx_listen)
            click.echo(f"nginx accepts its configuration for {nginx_listen}")
    else:
        for warning in [*sizing.warnings, *secret_warnings(settings)]:
            _log.warning("%s", warning)
    if not check_config and (removed := remove_stale_pid_file(pid_file)):
        _log.info("%s", removed)
    if nginx_listen is not None and not check_config:
        from app.serving.supervisor import serve_behind_nginx

        sys.exit(serve_behind_nginx(settings, nginx_listen, pid_file, extra, os.environ))
    argv, child_env = gunicorn_command(settings, extra, os.environ, pid_file=pid_file)
    _log.info(
        "%s on %s, %s worker(s)%s; pid file %s",
        ", ".join(f"{n}={m.name} v{m.version} from {d}" for (n, d), m in checked),
        settings.bind if nginx_listen is None else f"{nginx_listen} (nginx)",
        settings.workers,
        ", jemalloc" if "libjemalloc" in child_env.get("LD_PRELOAD", "") else "",
        pid_file,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, child_env)


def remove_stale_pid_file(pid_file: Path) -> str | None:
    """Remove ``pid_file`` when the process it names is alive and not a gunicorn master, and say so
    (None: nothing removed). A master killed outright (SIGKILL, the OOM killer, a container's whole
    cgroup) leaves its pid file behind, and by the next start that pid may be another program's:
    gunicorn then refuses to start ("Already running on PID ..."), so a restarted container, whose
    ``/tmp`` volume keeps the file, never came up again. A file naming a live master is left to
    gunicorn, which refuses to start a second one on it."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None  # none, or not a pid: gunicorn writes its own over it
    other = not_a_master(pid)
    if other is None:
        return None
    pid_file.unlink(missing_ok=True)
    return f"removed the stale pid file {pid_file}: process {pid} is not a gunicorn master ({other[:200]})"


@click.command("reload")
@click.option(
    "--pid-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The master's pid file (default: SPO_PID_FILE, else the one `spo serve` derives from "
    "--nginx or --bind).",
)
@click.option(
    "--bind", "-b", help="The address `spo serve --bind` was given (to find its pid file)."
)
@click.option("--nginx", "nginx_listen", metavar="HOST:PORT", help="The address given to --nginx.")
def reload(pid_file: Path | None, bind: str | None, nginx_listen: str | None) -> None:
    """Reload the model of a running `spo serve` (SIGHUP to its gunicorn master).

    Switch the model directory first (for example the symlink SPO_MODEL_DIR points to). The new model
    is loaded in new workers while the old ones serve; the log says "reload done" (or why it was
    refused or failed, in which case the old model goes on serving). See docs/rest.md.
    """
    if pid_file is None:
        env = dict(os.environ)
        if bind is not None:
            env["SPO_BIND"] = bind
        # Only what finds the pid file: the server's other settings (its model, its workers) are
        # the running master's, and a shell's stray or stale SPO_* value must not block the reload.
        try:
            settings = Settings.from_env(env, require_model=False, only=("pid_file", "bind"))
        except SettingsError as exc:
            raise click.UsageError(str(exc)) from None
        pid_file = settings.pid_file or default_pid_file(nginx_listen or settings.bind)
    try:
        pid = int(pid_file.read_text().strip())
    except FileNotFoundError:
        raise click.ClickException(
            f"no pid file {pid_file}: is `spo serve` running? (give --pid-file, --bind or --nginx)"
        ) from None
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"cannot read the pid file {pid_file}: {exc}") from None
    other = not_a_master(pid)
    if other is not None:
        raise click.ClickException(
            f"stale pid file {pid_file}: process {pid} is not a gunicorn master ({other[:200]}); "
            "nothing was signalled"
        )
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        raise click.ClickException(f"stale pid file {pid_file}: no process {pid}") from None
    except PermissionError:
        raise click.ClickException(
            f"not allowed to signal process {pid} (another user's?)"
        ) from None
    click.echo(
        f"spo reload: sent SIGHUP to the gunicorn master {pid}; it logs 'reload done' once every "
        "worker serves the new model (GET /v1/model shows its version)",
        err=True,
    )
