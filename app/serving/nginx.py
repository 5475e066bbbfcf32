"""nginx in front of gunicorn: the configuration ``spo serve --nginx`` runs it with.

``render_nginx_conf`` fills the template ``deploy/nginx.conf`` (package data, like gunicorn's, see
``app.serving.launch``) for a given listen address and upstream: with ``SPO_TLS_CERT`` /
``SPO_TLS_KEY`` it listens with TLS (and HTTP/2 as ``nginx_http2`` finds this nginx able to). It never
renders ``user root;``: started as root, nginx's workers run as ``nginx_worker_user()`` (``nobody``), so
the prefix directory must be reachable by that user; as any other user no ``user`` line is needed.
``nginx_only_problems`` names the settings only nginx applies, for ``spo serve`` to refuse without it.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
from pathlib import Path

from app.core.settings import Settings
from app.serving.launch import DEPLOY_DIR

NGINX_TEMPLATE = DEPLOY_DIR / "nginx.conf"


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
NGINX_PATH = re.compile(r"^[A-Za-z0-9._/+@=,:-]+$")


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
        if not NGINX_PATH.match(str(path)):
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


def listen_directives(listen: str, params: str = "", *, ipv6: bool = False) -> str:
    """The server block's ``listen`` lines for ``--nginx listen``: a bare ``PORT`` is every address,
    IPv4 and, where the machine has IPv6 (``ipv6``), IPv6 too (nginx's ``listen PORT`` alone is IPv4's
    only, ``[::]:PORT`` IPv6's only); ``HOST:PORT`` is that address alone.

    >>> print(listen_directives("8080", " ssl", ipv6=True))
            listen 8080 ssl;
            listen [::]:8080 ssl;
    >>> print(listen_directives("127.0.0.1:8080", ipv6=True))
            listen 127.0.0.1:8080;
    """
    hosts = ["", "[::]:"] if ipv6 and listen.isdigit() else [""]
    return "\n".join(f"        listen {host}{listen}{params};" for host in hosts)


# The access line of a request nginx answered itself, in the service's log format (docs/rest.md,
# "Logs"): the path without its query string, no header; nginx escapes what a value may carry.
_ACCESS_LOG_FORMATS = {
    "text": "'$time_iso8601 INFO nginx.access [$spo_request_id] "
    "$remote_addr $spo_method $spo_path $status'",
    "json": 'escape=json \'{"time":"$time_iso8601","level":"INFO","logger":'
    '"nginx.access","message":"$remote_addr $spo_method $spo_path $status",'
    '"process":$pid,"request_id":"$spo_request_id","remote":"$remote_addr",'
    '"method":"$spo_method","path":"$spo_path","status":$status,'
    '"bytes":$body_bytes_sent}\'',
}


def render_nginx_conf(
    settings: Settings,
    *,
    listen: str,
    upstream: str,
    prefix: Path,
    template: Path = NGINX_TEMPLATE,
    http2: str | None = None,
    ipv6: bool = False,
) -> str:
    """``deploy/nginx.conf`` for ``listen`` (HOST:PORT, or PORT: ``listen_directives``, with ``ipv6``)
    in front of ``upstream`` (gunicorn's bind).

    ``prefix`` holds the pid file and temp files, so nginx runs without root (it logs to stderr). With
    ``SPO_TLS_CERT`` and ``SPO_TLS_KEY`` it listens with TLS, and HTTP/2 as ``http2`` says
    (``nginx_http2``; None: HTTP/1.1 only). ``ValueError`` for a path nginx cannot be given.
    """
    listen_params, tls = _tls_block(settings, http2)
    retry_ms = (
        settings.request_timeout * 1000 if settings.request_timeout else settings.timeout * 500
    )
    values = {
        "LISTEN": listen_directives(listen, listen_params, ipv6=ipv6),
        "TLS": tls,
        "RETRY_TIMEOUT": f"{max(1, round(retry_ms))}ms",
        "UPSTREAM": upstream,
        "PREFIX": str(prefix),
        "MAX_BODY_BYTES": str(settings.max_body_bytes),
        "READ_TIMEOUT": f"{settings.timeout + 10}s",
        "USER": nginx_worker_user() if os.geteuid() == 0 else "",
        "ACCESS_LOG_FORMAT": _ACCESS_LOG_FORMATS[settings.log_format],
        "ACCESS_LOG": (
            "access_log /dev/stdout spo_nginx if=$spo_nginx_answered"
            if settings.access_log
            else "access_log off"
        ),
        "RATE_LIMIT_ZONE": (
            f"    limit_req_zone $spo_rate_key zone=spo_clients:10m rate={settings.rate_limit};"
            if settings.rate_limit
            else ""
        ),
        "RATE_LIMIT": (
            "            limit_req zone=spo_clients"
            # nginx refuses "burst=0": no burst is no burst parameter.
            + (f" burst={settings.rate_burst}" if settings.rate_burst else "")
            + " nodelay;\n"
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
