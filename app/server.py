"""``spo serve``: validate the settings, then exec gunicorn with ``deploy/gunicorn.conf.py``.

``LD_PRELOAD`` only takes effect when a process starts, so when jemalloc is wanted and installed
(``SPO_JEMALLOC``, Debian ``libjemalloc2``) the command sets it and *execs* gunicorn: the master and every
worker it forks then allocate through jemalloc. Flags become ``SPO_*`` values for the workers (flags win
over the environment) and are passed to gunicorn too; arguments after ``--`` go to gunicorn untouched.

``render_nginx_conf`` fills ``deploy/nginx.conf`` for a given listen address and upstream.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import click

from app.settings import JEMALLOC_PATH, Settings, SettingsError
from nlp.config import PROJECT_ROOT

DEPLOY_DIR = PROJECT_ROOT / "deploy"
GUNICORN_CONF = DEPLOY_DIR / "gunicorn.conf.py"
NGINX_TEMPLATE = DEPLOY_DIR / "nginx.conf"


def gunicorn_command(
    settings: Settings, extra: Sequence[str] = (), environ: Mapping[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that run gunicorn for ``settings``."""
    env = dict(os.environ if environ is None else environ)
    env["SPO_BIND"] = settings.bind
    env["SPO_WORKERS"] = str(settings.workers)
    preload = [p for p in env.get("LD_PRELOAD", "").split(":") if p]
    if settings.use_jemalloc and str(JEMALLOC_PATH) not in preload:
        env["LD_PRELOAD"] = ":".join([str(JEMALLOC_PATH), *preload])
    elif not settings.jemalloc and str(JEMALLOC_PATH) in preload:
        env["LD_PRELOAD"] = ":".join(p for p in preload if p != str(JEMALLOC_PATH))
    argv = [
        sys.executable,
        "-m",
        "gunicorn",
        "--config",
        str(GUNICORN_CONF),
        "--bind",
        settings.bind,
        "--workers",
        str(settings.workers),
        *extra,
    ]
    return argv, env


def render_nginx_conf(
    settings: Settings,
    *,
    listen: str,
    upstream: str,
    prefix: Path,
    template: Path = NGINX_TEMPLATE,
) -> str:
    """``deploy/nginx.conf`` for ``listen`` (HOST:PORT) in front of ``upstream`` (gunicorn's bind).

    ``prefix`` holds the pid file, logs and temp files, so nginx runs without root.
    """
    values = {
        "LISTEN": listen,
        "UPSTREAM": upstream,
        "PREFIX": str(prefix),
        "MAX_BODY_BYTES": str(settings.max_body_bytes),
        "READ_TIMEOUT": f"{settings.timeout + 10}s",
        "USER": "user root;" if os.geteuid() == 0 else "",
    }
    text = template.read_text(encoding="utf-8")
    for name, value in values.items():
        text = text.replace("{{" + name + "}}", value)
    left = re.findall(r"\{\{\w+\}\}", text)
    if left:
        raise ValueError(f"{template}: unknown placeholders {sorted(set(left))}")
    return text


@click.command("serve", context_settings={"ignore_unknown_options": True})
@click.option("--bind", "-b", help="HOST:PORT or unix:PATH (env SPO_BIND, default 127.0.0.1:8000).")
@click.option(
    "--workers", "-w", type=int, help="Worker processes (env SPO_WORKERS, default: cores)."
)
@click.option(
    "--check-config", is_flag=True, help="Validate settings and gunicorn config, then exit."
)
@click.argument("gunicorn_args", nargs=-1, type=click.UNPROCESSED)
def serve(
    bind: str | None, workers: int | None, check_config: bool, gunicorn_args: tuple[str, ...]
) -> None:
    """Serve the REST API with gunicorn (configured by SPO_* variables; see docs/rest.md)."""
    env = dict(os.environ)
    if bind is not None:
        env["SPO_BIND"] = bind
    if workers is not None:
        env["SPO_WORKERS"] = str(workers)
    try:
        settings = Settings.from_env(env)
    except SettingsError as exc:
        raise click.UsageError(str(exc)) from None
    extra = list(gunicorn_args)
    if check_config:
        extra.append("--check-config")
    argv, child_env = gunicorn_command(settings, extra, env)
    click.echo(
        f"spo serve: {settings.model_dir} on {settings.bind}, {settings.workers} worker(s)"
        f"{', jemalloc' if 'libjemalloc' in child_env.get('LD_PRELOAD', '') else ''}",
        err=True,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, child_env)
