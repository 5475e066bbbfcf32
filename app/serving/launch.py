"""How gunicorn is started for a resolved ``Settings``: its argv, its environment and the pid file.

gunicorn needs a fresh process, because ``LD_PRELOAD`` only takes effect when a process starts: when
jemalloc is wanted and installed (``SPO_JEMALLOC``, Debian ``libjemalloc2``) ``spo serve`` sets it and
*execs* gunicorn, so the master and every worker it forks allocate through jemalloc. Across that exec
the resolved value travels as one serialized variable (``app.serving.master.SETTINGS_VAR``,
``Settings.to_json``), which the master reads once and removes; no ``SPO_*`` variable is written for it
to parse again, and the workers get the value by the fork. Bind and workers are passed to gunicorn as
flags too; arguments after ``--`` go to gunicorn untouched, once ``gunicorn_args_problems`` finds none
that sets what the settings decide. gunicorn runs as
``python -m app.serving.master``: its own master with the model-aware start and reload.

``deploy/gunicorn.conf.py`` is package data (the ``spo_deploy`` package: ``deploy/`` in a checkout,
``site-packages/spo_deploy`` when installed), found with importlib.resources so that ``spo serve``
works from any directory.
"""

from __future__ import annotations

import argparse
import importlib.resources
import logging
import os
import re
import stat
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from app.core.settings import JEMALLOC_PATH, Settings
from app.serving.master import SETTINGS_VAR

logger = logging.getLogger(__name__)

DEPLOY_DIR = Path(str(importlib.resources.files("spo_deploy")))
GUNICORN_CONF = DEPLOY_DIR / "gunicorn.conf.py"


# gunicorn settings that spo's own settings decide (``deploy/gunicorn.conf.py``): given after ``--``
# they would win over the config file, and what runs would no longer be what was sized and checked
# (threads per worker, memory, the pid file ``spo reload`` reads, the model loaded after the fork).
OWNED_GUNICORN_SETTINGS = {
    "workers": "use spo serve --workers or SPO_WORKERS (the sizing follows it)",
    "bind": "use spo serve --bind or SPO_BIND",
    "threads": "use SPO_THREADS",
    "timeout": "use SPO_TIMEOUT",
    "graceful_timeout": "use SPO_GRACEFUL_TIMEOUT",
    "max_requests": "use SPO_MAX_REQUESTS",
    "max_requests_jitter": "use SPO_MAX_REQUESTS_JITTER",
    "pidfile": "use SPO_PID_FILE",
    "accesslog": "use SPO_ACCESS_LOG",
    "worker_class": "not changeable: spo's workers are gthread",
    "config": "not changeable: deploy/gunicorn.conf.py is spo's",
    "args": "not changeable: the application (APP_MODULE) is spo's",
    "preload_app": "not changeable: each worker loads its model after the fork",
    "daemon": "not changeable: run spo serve under a supervisor (systemd, a container)",
}


def gunicorn_args_problems(args: Sequence[str]) -> list[str]:
    """The arguments after ``spo serve --`` that set a gunicorn setting spo decides, each with what
    to do instead (read as gunicorn reads them, abbreviations included); other arguments, and ones
    gunicorn will refuse itself, pass.

    >>> gunicorn_args_problems(["--log-level", "debug"])
    []
    >>> for problem in gunicorn_args_problems(["-w5", "--preload"]):
    ...     print(problem)
    gunicorn's workers setting: use spo serve --workers or SPO_WORKERS (the sizing follows it)
    gunicorn's preload_app setting: not changeable: each worker loads its model after the fork
    """
    from gunicorn.config import Config

    parser = Config(prog="spo serve").parser()
    parser.exit_on_error = False
    try:
        given, _ = parser.parse_known_args(list(args))
    except argparse.ArgumentError:
        return []  # gunicorn says what is wrong when it parses them
    return [
        f"gunicorn's {name} setting: {advice}"
        for name, advice in OWNED_GUNICORN_SETTINGS.items()
        if getattr(given, name, None) not in (None, [])
    ]


def default_pid_file(address: str) -> Path:
    """Where the master's pid file goes unless ``SPO_PID_FILE`` says: one per public address.

    >>> default_pid_file("127.0.0.1:8000").name
    'spo-service-127.0.0.1-8000.pid'
    """
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", address).strip("-")
    return Path(tempfile.gettempdir()) / f"spo-service-{slug}.pid"


def pid_file_problem(pid_file: Path) -> str | None:
    """Why the master could not write ``pid_file`` (None: it can). gunicorn writes it through a
    temporary file in the same directory and makes no directory, so that one must exist and be
    writable; asked before gunicorn starts (which would end in a traceback). An existing path must
    be a pid file (a regular file holding a pid, or empty): gunicorn replaces whatever is there and
    deletes it at exit, a device, a link or a file named by mistake included.

    >>> pid_file_problem(Path("/no/such/dir/spo.pid"))
    'the pid file /no/such/dir/spo.pid: /no/such/dir is not a directory'
    >>> pid_file_problem(Path("/dev/null"))
    'the pid file /dev/null exists and is not a regular file: gunicorn would replace it, then delete it'
    """
    folder = pid_file.parent
    try:
        if not folder.is_dir():
            return f"the pid file {pid_file}: {folder} is not a directory"
        if not os.access(folder, os.W_OK | os.X_OK):
            return f"the pid file {pid_file}: {folder} is not writable"
        try:
            mode = pid_file.lstat().st_mode
        except FileNotFoundError:
            return None
        if stat.S_ISDIR(mode):
            return f"the pid file {pid_file} is a directory"
        if not stat.S_ISREG(mode):
            return (
                f"the pid file {pid_file} exists and is not a regular file: gunicorn would replace "
                "it, then delete it"
            )
        with pid_file.open("rb") as f:
            head = f.read(_PID_FILE_MOST + 1)
    except OSError as exc:
        return f"the pid file {pid_file}: {exc.strerror or exc}"
    if len(head) > _PID_FILE_MOST or not re.fullmatch(rb"\s*\d*\s*", head):
        return (
            f"the pid file {pid_file} exists and holds something other than a pid: gunicorn would "
            "replace it, then delete it (name another file, or remove this one)"
        )
    return None


_PID_FILE_MOST = 64  # bytes: a pid file holds a number and a newline


def openvino_models(settings: Settings) -> list[str]:
    """The names of the served models that run on the openvino engine (their model.json says so)."""
    from nlp.errors import SpoError
    from nlp.manifest import load_manifest

    names = []
    for name, directory in settings.model_table:
        try:
            if load_manifest(directory, check_files=False).engine == "openvino":
                names.append(name)
        except SpoError:
            continue  # a bad directory is reported when it is loaded
    return names


def gunicorn_command(
    settings: Settings,
    extra: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    *,
    pid_file: Path | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that run gunicorn (``app.serving.master``) for ``settings``: the environment
    is ``environ`` with ``settings`` in ``SETTINGS_VAR``, model links resolved (``Settings.pinned``),
    and jemalloc's ``LD_PRELOAD``."""
    env = dict(os.environ if environ is None else environ)
    env[SETTINGS_VAR] = settings.pinned().to_json()
    preload = [p for p in env.get("LD_PRELOAD", "").split(":") if p]
    openvino = openvino_models(settings)
    if settings.jemalloc and openvino:
        logger.warning(
            "jemalloc is not preloaded: OpenVINO 2026.4.1 aborts compiling a model under it "
            "(free(): invalid pointer), and %s %s the openvino engine",
            ", ".join(openvino),
            "uses" if len(openvino) == 1 else "use",
        )
    if settings.use_jemalloc and not openvino and str(JEMALLOC_PATH) not in preload:
        env["LD_PRELOAD"] = ":".join([str(JEMALLOC_PATH), *preload])
    elif (not settings.jemalloc or openvino) and str(JEMALLOC_PATH) in preload:
        env["LD_PRELOAD"] = ":".join(p for p in preload if p != str(JEMALLOC_PATH))
    argv = [
        sys.executable,
        "-P",  # not the current directory first on sys.path: an app/ or nlp/ there is not ours
        "-m",
        "app.serving.master",
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
