"""``spo serve`` and ``spo reload``: validate the settings and the model, then run gunicorn (alone, or
behind nginx with ``--nginx``); send the running master SIGHUP.

The settings are resolved once, here: ``SPO_*`` variables with the flags over them (flags win), the
worker count sized (``app.sizing``). gunicorn needs a fresh process, because ``LD_PRELOAD`` only takes
effect when a process starts: when jemalloc is wanted and installed (``SPO_JEMALLOC``, Debian
``libjemalloc2``) the command sets it and *execs* gunicorn, so the master and every worker it forks
allocate through jemalloc. Across that exec the resolved value travels as one serialized variable
(``app.master.SETTINGS_VAR``, ``Settings.to_json``), which the master reads once and removes; no
``SPO_*`` variable is written for it to parse again, and the workers get the value by the fork. Bind
and workers are passed to gunicorn as flags too; arguments after ``--`` go to gunicorn untouched.
gunicorn runs as ``python -m app.master``: its own master with the model-aware start and reload of
``app.master``. With ``--nginx HOST:PORT``, ``app.supervisor`` runs nginx there in front of gunicorn on
a private unix socket and supervises both.

The two templates, ``deploy/gunicorn.conf.py`` and ``deploy/nginx.conf``, are package data (the
``spo_deploy`` package: ``deploy/`` in a checkout, ``site-packages/spo_deploy`` when installed), found
with importlib.resources so that ``spo serve`` works from any directory.
``render_nginx_conf`` fills ``deploy/nginx.conf`` for a given listen address and upstream: with
``SPO_TLS_CERT`` / ``SPO_TLS_KEY`` it listens with TLS (and HTTP/2 as ``nginx_http2`` finds this nginx
able to). It never renders ``user root;``: started as root, nginx's workers run as
``nginx_worker_user()`` (``nobody``), so the prefix directory must be reachable by that user; as any
other user no ``user`` line is needed. Settings only nginx applies (``SPO_RATE_LIMIT``, TLS) are
refused without ``--nginx`` (``nginx_only_problems``), never silently ignored.
"""

from __future__ import annotations

import grp
import importlib.resources
import os
import pwd
import re
import signal
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import click

from app.master import SETTINGS_VAR, check_model_dir
from app.options import click_options
from app.settings import JEMALLOC_PATH, Settings, SettingsError
from nlp.errors import SpoError

DEPLOY_DIR = Path(str(importlib.resources.files("spo_deploy")))
GUNICORN_CONF = DEPLOY_DIR / "gunicorn.conf.py"
NGINX_TEMPLATE = DEPLOY_DIR / "nginx.conf"
# What --nginx accepts: HOST:PORT, [IPv6]:PORT or PORT (nginx's own listen syntax).
_LISTEN = re.compile(r"^(\[[0-9A-Fa-f:.]+\]:|[A-Za-z0-9.-]*:)?\d{1,5}$")


def default_pid_file(address: str) -> Path:
    """Where the master's pid file goes unless ``SPO_PID_FILE`` says: one per public address.

    >>> default_pid_file("127.0.0.1:8000").name
    'spo-service-127.0.0.1-8000.pid'
    """
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", address).strip("-")
    return Path(tempfile.gettempdir()) / f"spo-service-{slug}.pid"


def gunicorn_command(
    settings: Settings,
    extra: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    *,
    pid_file: Path | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that run gunicorn (``app.master``) for ``settings``: the environment
    is ``environ`` with ``settings`` in ``SETTINGS_VAR`` (and jemalloc's ``LD_PRELOAD``)."""
    env = dict(os.environ if environ is None else environ)
    env[SETTINGS_VAR] = settings.to_json()
    preload = [p for p in env.get("LD_PRELOAD", "").split(":") if p]
    if settings.use_jemalloc and str(JEMALLOC_PATH) not in preload:
        env["LD_PRELOAD"] = ":".join([str(JEMALLOC_PATH), *preload])
    elif not settings.jemalloc and str(JEMALLOC_PATH) in preload:
        env["LD_PRELOAD"] = ":".join(p for p in preload if p != str(JEMALLOC_PATH))
    argv = [
        sys.executable,
        "-m",
        "app.master",
        "--config",
        str(GUNICORN_CONF),
        "--bind",
        settings.bind,
        "--workers",
        str(settings.workers),
        *(["--pid", str(pid_file)] if pid_file is not None else []),
        *extra,
    ]
    return argv, env


NGINX_WORKER_USER = "nobody"


def nginx_worker_user(name: str = NGINX_WORKER_USER) -> str:
    """nginx's ``user`` line for a master started as root: an unprivileged user and its group."""
    entry = pwd.getpwnam(name)
    if entry.pw_uid == 0:
        raise ValueError(f"nginx workers must not run as root (user {name!r} has uid 0)")
    return f"user {entry.pw_name} {grp.getgrgid(entry.pw_gid).gr_name};"


# How an nginx turns HTTP/2 on: ``http2 on;`` from 1.25.1, ``listen ... http2`` before; None: it cannot.
HTTP2_SYNTAXES = ("directive", "listen")
# Paths nginx reads from its configuration: no quote, backslash, ``$`` (a variable), ``;`` or space.
_NGINX_PATH = re.compile(r"^[A-Za-z0-9._/+@=,:-]+$")


def nginx_http2(version_output: str) -> str | None:
    """How the nginx whose ``nginx -V`` printed ``version_output`` turns HTTP/2 on (``HTTP2_SYNTAXES``).

    >>> nginx_http2("nginx version: nginx/1.22.1 ... --with-http_ssl_module --with-http_v2_module")
    'listen'
    >>> nginx_http2("nginx version: nginx/1.26.0 ... --with-http_v2_module")
    'directive'
    >>> nginx_http2("nginx version: nginx/1.26.0 ... --with-http_ssl_module") is None
    True
    """
    match = re.search(r"nginx/(\d+)\.(\d+)\.(\d+)", version_output)
    if match is None or "--with-http_v2_module" not in version_output:
        return None
    return "directive" if tuple(map(int, match.groups())) >= (1, 25, 1) else "listen"


def _tls_block(settings: Settings, http2: str | None) -> tuple[str, str]:
    """The ``listen`` parameters and the server block's TLS lines (both empty without TLS)."""
    if settings.tls_cert is None or settings.tls_key is None:
        return "", ""
    for name, path in (("SPO_TLS_CERT", settings.tls_cert), ("SPO_TLS_KEY", settings.tls_key)):
        if not _NGINX_PATH.match(str(path)):
            raise ValueError(
                f"{name}: nginx cannot be given {str(path)!r}: use a path of letters, digits and "
                "._/+@=,:- only"
            )
    lines = [
        f"        ssl_certificate {settings.tls_cert};",
        f"        ssl_certificate_key {settings.tls_key};",
        "        ssl_protocols TLSv1.2 TLSv1.3;",
        "        ssl_prefer_server_ciphers off;",
        "        ssl_session_timeout 1h;",
        "        ssl_session_tickets off;",
    ]
    if http2 == "directive":
        lines.append("        http2 on;")
    return (" ssl http2" if http2 == "listen" else " ssl"), "\n".join(lines)


def render_nginx_conf(
    settings: Settings,
    *,
    listen: str,
    upstream: str,
    prefix: Path,
    template: Path = NGINX_TEMPLATE,
    http2: str | None = None,
) -> str:
    """``deploy/nginx.conf`` for ``listen`` (HOST:PORT) in front of ``upstream`` (gunicorn's bind).

    ``prefix`` holds the pid file, logs and temp files, so nginx runs without root. With
    ``SPO_TLS_CERT`` and ``SPO_TLS_KEY`` it listens with TLS, and HTTP/2 as ``http2`` says
    (``nginx_http2``; None: HTTP/1.1 only). ``ValueError`` for a path nginx cannot be given.
    """
    listen_params, tls = _tls_block(settings, http2)
    retry_ms = (
        settings.request_timeout * 1000 if settings.request_timeout else settings.timeout * 500
    )
    values = {
        "LISTEN": listen,
        "LISTEN_PARAMS": listen_params,
        "TLS": tls,
        "RETRY_TIMEOUT": f"{max(1, round(retry_ms))}ms",
        "UPSTREAM": upstream,
        "PREFIX": str(prefix),
        "MAX_BODY_BYTES": str(settings.max_body_bytes),
        "READ_TIMEOUT": f"{settings.timeout + 10}s",
        "USER": nginx_worker_user() if os.geteuid() == 0 else "",
        "RATE_LIMIT_ZONE": (
            f"    limit_req_zone $spo_rate_key zone=spo_clients:10m rate={settings.rate_limit};"
            if settings.rate_limit
            else ""
        ),
        "RATE_LIMIT": (
            f"            limit_req zone=spo_clients burst={settings.rate_burst} nodelay;\n"
            "            limit_req_status 429;"
            if settings.rate_limit
            else ""
        ),
    }
    text = template.read_text(encoding="utf-8")
    for name, value in values.items():
        text = text.replace("{{" + name + "}}", value)
    left = re.findall(r"\{\{\w+\}\}", text)
    if left:
        raise ValueError(f"{template}: unknown placeholders {sorted(set(left))}")
    return text


def nginx_only_problems(settings: Settings) -> list[str]:
    """Settings only nginx applies, each named with ``--nginx``: refused when serving without it
    (ignoring them would leave a rate limit or TLS that an operator believes is there)."""
    out = []
    if settings.rate_limit:
        out.append(
            f"SPO_RATE_LIMIT={settings.rate_limit} is applied by nginx, which only "
            "`spo serve --nginx HOST:PORT` runs: add --nginx, or unset SPO_RATE_LIMIT"
        )
    if settings.tls:
        out.append(
            "SPO_TLS_CERT / SPO_TLS_KEY: TLS is terminated by nginx, which only "
            "`spo serve --nginx HOST:PORT` runs: add --nginx, or unset SPO_TLS_CERT and SPO_TLS_KEY"
        )
    return out


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
    settings = _settings({**os.environ, **{k: v for k, v in flags.items() if v is not None}})
    if nginx_listen is not None and not _LISTEN.match(nginx_listen):
        raise click.BadParameter(
            f"expected HOST:PORT or PORT, got {nginx_listen!r}", param_hint="--nginx"
        )
    unapplied = nginx_only_problems(settings) if nginx_listen is None else []
    if unapplied:
        raise click.UsageError(
            "settings that cannot take effect:\n" + "\n".join(f"  {p}" for p in unapplied)
        )
    # The model is checked here, without TensorFlow, so a bad one fails at once with its reason
    # (what only TensorFlow can find fails the first worker, which halts the server: app.master).
    checked = []
    for name, directory in settings.model_table:
        try:
            checked.append(((name, directory), check_model_dir(directory)))
        except SpoError as exc:
            raise click.ClickException(f"cannot serve {directory}: {exc.message}") from None
    address = nginx_listen if nginx_listen is not None else settings.bind
    pid_file = settings.pid_file or default_pid_file(address)
    extra = list(gunicorn_args)
    sizing = settings.sizing()
    if check_config:
        extra.append("--check-config")
        click.echo("resolved sizing (app.sizing):")
        for line in sizing.lines():
            click.echo(f"  {line}")
    else:
        for warning in [*sizing.warnings, *secret_warnings(settings)]:
            click.echo(f"spo serve: WARNING: {warning}", err=True)
    if nginx_listen is not None and not check_config:
        from app.supervisor import serve_behind_nginx

        sys.exit(serve_behind_nginx(settings, nginx_listen, pid_file, extra, os.environ))
    argv, child_env = gunicorn_command(settings, extra, os.environ, pid_file=pid_file)
    click.echo(
        f"spo serve: {', '.join(f'{n}={m.name} v{m.version} from {d}' for (n, d), m in checked)} "
        f"on {settings.bind}, {settings.workers} worker(s)"
        f"{', jemalloc' if 'libjemalloc' in child_env.get('LD_PRELOAD', '') else ''}; "
        f"pid file {pid_file}",
        err=True,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, child_env)


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
        settings = _settings(env)
        pid_file = settings.pid_file or default_pid_file(nginx_listen or settings.bind)
    try:
        pid = int(pid_file.read_text().strip())
    except FileNotFoundError:
        raise click.ClickException(
            f"no pid file {pid_file}: is `spo serve` running? (give --pid-file, --bind or --nginx)"
        ) from None
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"cannot read the pid file {pid_file}: {exc}") from None
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
