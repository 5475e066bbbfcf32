"""Every option of the service and of the commands that run the model, declared once.

An ``Option`` says everything about one option: its name (the ``Settings`` field, or the parameter of
the commands), whether ``SPO_<NAME>`` sets it, the flags it has on which commands (and the older
spellings that still work there, hidden), how text becomes its value, its default, its check and its
help. From ``OPTIONS`` come:

- ``app.core.settings.Settings``: its fields (those with ``env``), their parsing and their checks;
- the flags of ``spo serve``, ``spo extract`` and ``spo spark-extract`` (``click_options(command)``),
  so a flag has the same name, meaning, default, check and ``--help`` in each;
- the settings table of docs/rest.md (``settings_table()``; tests/test_docs.py compares the two).

A command's file arguments and pass-through options (``-o``, ``--metrics-file``, Spark's ``--conf``)
stay beside the command. This module is low: it imports click and ``nlp.config``, nothing of ``app``.

>>> OPTIONS["max_texts"].parse("1_000")
1000
>>> OPTIONS["max_texts"].problems(0)
['must be between 1 and 10000, got 0']
>>> OPTIONS["input_format"].flags_for("extract")
('--input-format',)
"""

from __future__ import annotations

import functools
import re
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from nlp.config import (
    DEFAULT_MAX_TEXT_CHARS,
    DEMO_MODEL_DIR,
    EXTRA_REWRITES,
    PRECISIONS,
    SHORT_CALL_PLANS,
    precision_help,
)

PREFIX = "SPO_"
# The commands that read the SPO_* settings (their flags override the variables).
ENV_COMMANDS = frozenset({"serve"})
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOAD_MODES = ("boot", "background")
PAGES = ("open", "auth", "off")
INPUT_FORMATS = ("auto", "txt", "jsonl")
_BIND = re.compile(r"^(unix:.+|\[[0-9A-Fa-f:.]+\]:\d{1,5}|[A-Za-z0-9.-]*:\d{1,5})$")
# What `spo serve --nginx` accepts: HOST:PORT, [IPv6]:PORT or PORT (nginx's own listen syntax).
LISTEN = re.compile(
    r"^(\[[0-9A-Fa-f:.]+\]:|[A-Za-z0-9.-]+:)?\d{1,5}$"
)  # ":PORT": no host, to nginx
TOKEN = re.compile(r"^[A-Za-z0-9._~+/=-]{16,}$")
TOKEN_RULE = "16+ characters of [A-Za-z0-9._~+/=-]"
_RATE = re.compile(r"^[1-9][0-9]{0,6}r/[sm]$")
# A model name is a URL path segment (/v1/models/<name>/extract) and a CLI argument.
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_ORIGIN = re.compile(r"^https?://[A-Za-z0-9.-]+(:\d{1,5})?$")

Parse = Callable[[str], Any]
Check = Callable[[Any], list[str]]
Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


# -- parsers: text (a variable's or a flag's) -> value; ValueError says what was expected -------------
_INTEGER = re.compile(r"^[+-]?[0-9]+(_[0-9]+)*$")  # ASCII digits, _ between groups: 100_000


def _int(raw: str) -> int:
    """An integer in ASCII digits (``int()`` also took ``٦٤`` and ``１２``).

    >>> _int("100_000"), _int("-3")
    (100000, -3)
    """
    if not _INTEGER.match(raw):
        raise ValueError(f"expected an integer, got {raw!r}")
    return int(raw.replace("_", ""))


def _seconds(raw: str) -> float:
    try:
        if not raw.isascii():  # float() also takes other scripts' digits
            raise ValueError
        value = float(raw)
    except ValueError:
        raise ValueError(f"expected a number of seconds, got {raw!r}") from None
    if value != value:  # NaN
        raise ValueError(f"expected a number of seconds, got {raw!r}")
    return value


def _workers(raw: str) -> int:
    return 0 if raw.lower() == "auto" else _int(raw)


def _optional_int(raw: str) -> int | None:
    return None if raw.lower() in ("auto", "none") else _int(raw)


def _bool(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a boolean (1/0, true/false, yes/no, on/off), got {raw!r}")


def _path(raw: str) -> Path:
    """Relative paths are taken from the current directory, like any command-line path; links are
    resolved (a loop of them is refused, as is a path the system cannot take)."""
    try:
        return Path(raw).expanduser().resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: Python 3.11's symlink loop
        raise ValueError(f"cannot resolve {raw}: {exc}") from None


def _model_path(raw: str) -> Path:
    """An absolute path, links kept: the model is named after the directory as given (``SPO_MODEL_DIR=
    /srv/models/current`` serves ``current``, whichever version the link names); the server pins each
    generation of workers to where the link led then (``Settings.pinned``).

    >>> _model_path("/srv/models/current").name
    'current'
    """
    return Path(raw).expanduser().absolute()


def _file(raw: str) -> Path:
    """An absolute path, symlinks kept: a mounted secret (Kubernetes swaps a symlink to update it) is
    found again through the same name each time it is read."""
    return Path(raw).expanduser().absolute()


def _tokens(raw: str) -> tuple[str, ...]:
    """Comma-separated items; blank is none, but a value that names none (``" , "``) is refused, not
    read as none: a token list that came out empty must not turn authentication off.

    >>> _tokens("a, b,")
    ('a', 'b')
    """
    items = tuple(t.strip() for t in raw.split(",") if t.strip())
    if not items and raw.strip():
        raise ValueError(f"expected comma-separated values, got {raw!r}")
    return items


def _str(raw: str) -> str:
    return raw


def _models(raw: str) -> tuple[tuple[str, Path], ...]:
    """``NAME=DIR`` entries separated by commas; a bare ``DIR`` is named after its directory
    (``model_name_for``).

    >>> [(n, p.name) for n, p in _models("ner=models/ner, models/demo")]
    [('ner', 'ner'), ('demo', 'demo')]
    """
    out = []
    for entry in raw.split(","):
        entry = entry.strip()
        if not entry:
            continue
        name, sep, where = entry.partition("=")
        if not sep:
            name, where = "", entry
        name, where = name.strip(), where.strip()
        if not where:
            raise ValueError(f"entry {entry!r} names no directory (expected NAME=DIR)")
        path = _path(where)
        out.append((name if sep else model_name_for(_model_path(where)), path))
    if not out:
        raise ValueError("expected NAME=DIR entries separated by commas")
    return tuple(out)


def _shard(raw: str) -> tuple[int, int]:
    """``K/N``: records K, K+N, K+2N... (1-based)."""
    try:
        k, n = (int(part) for part in raw.split("/"))
    except ValueError:
        raise ValueError(f"expected K/N (e.g. 2/8), got {raw!r}") from None
    if not 1 <= k <= n:
        raise ValueError(f"expected 1 <= K <= N, got {raw!r}")
    return (k, n)


# -- checks: value -> what is wrong with it (empty: nothing) -----------------------------------------
def in_range(low: float, high: float, unit: str = "") -> Check:
    def check(value: Any) -> list[str]:
        if low <= value <= high:
            return []
        return [f"must be between {low} and {high}{unit}, got {value}"]

    return check


def matches(pattern: re.Pattern[str], expected: str) -> Check:
    """Each of a value's items (or the value) matches ``pattern``; ``expected`` says what it must be."""

    def check(value: Any) -> list[str]:
        items = value if isinstance(value, tuple) else (value,) if value else ()
        bad = [(n, item) for n, item in enumerate(items, 1) if not pattern.match(item)]
        return [expected.format(item=item, n=n) for n, item in bad]

    return check


def address_problem(address: str, pattern: re.Pattern[str], expected: str) -> str | None:
    """What is wrong with a listening ``address`` (None: nothing): it must match ``pattern``
    (``expected`` says how) and name a port from 1 to 65535 (unless it is ``unix:PATH``).

    >>> address_problem("127.0.0.1:99999", LISTEN, "HOST:PORT")
    'port 99999 is not between 1 and 65535 in 127.0.0.1:99999'
    >>> address_problem("unix:/run/spo.sock", _BIND, "HOST:PORT or unix:PATH") is None
    True
    """
    if not pattern.match(address):
        return f"expected {expected}, got {address!r}"
    if address.startswith("unix:"):
        return None
    port = int(address.rsplit(":", 1)[-1])
    return None if 1 <= port <= 65535 else f"port {port} is not between 1 and 65535 in {address}"


def _bind(value: str) -> list[str]:
    problem = address_problem(value, _BIND, "HOST:PORT or unix:PATH")
    if problem is None and value.startswith("unix:"):
        problem = _socket_path_problem(Path(value.removeprefix("unix:")))
    return [] if problem is None else [problem]


def _socket_path_problem(path: Path) -> str | None:
    """gunicorn replaces a socket left at ``path`` and refuses anything else, in a traceback."""
    try:
        mode = path.stat().st_mode  # a link to a socket is that socket, to gunicorn too
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot use {path}: {exc.strerror or exc}"
    if stat.S_ISSOCK(mode):
        return None
    return f"{path} exists and is not a socket: name a free path for gunicorn's socket"


def _existing_file(value: Path) -> list[str]:
    try:
        return [] if value.is_file() else [f"not a file: {value}"]
    except OSError as exc:  # a name too long, a folder this user may not enter
        return [f"cannot read {value}: {exc.strerror or exc}"]


def _rewrites(names: tuple[str, ...]) -> list[str]:
    unknown = [name for name in names if name not in EXTRA_REWRITES]
    if not unknown:
        return []
    return [
        f"unknown rewrite(s) {', '.join(map(repr, unknown))}; known: {', '.join(EXTRA_REWRITES)}"
    ]


def _plans() -> str:
    """The measured thread plans, in words (``nlp.config.SHORT_CALL_PLANS``)."""
    return "; ".join(
        f"{precision}: " + ", ".join(f"up to {n} tokens on {t} thread(s)" for n, t in plan)
        for precision, plan in SHORT_CALL_PLANS.items()
    )


def model_name_for(directory: Path) -> str:
    """The name a model directory is served under when none is given (``SPO_MODEL_DIR``, ``spo
    extract --model DIR``): its folder's name, made a valid model name (a URL path segment):
    characters outside ``[A-Za-z0-9._-]`` become ``-``, at most 64; ``model`` when none is left.

    >>> [model_name_for(Path(p)) for p in ("/m/demo", "/m/my demo", "/m/模型", "/m/.x", "/")]
    ['demo', 'my-demo', 'model', 'x', 'model']
    """
    name = re.sub(r"[^A-Za-z0-9._-]", "-", directory.name).strip("-._")[:64]
    return name if _MODEL_NAME.match(name) else "model"


def _model_names(models: tuple[tuple[str, Path], ...]) -> list[str]:
    names = [name for name, _ in models]
    out = []
    for n, name in enumerate(names):
        if not _MODEL_NAME.match(name):
            out.append(
                f"model name {name!r} must be 1-64 of [A-Za-z0-9._-], starting with a letter or digit"
            )
        elif name in names[:n]:
            out.append(f"model name {name!r} is given twice")
    return out


@dataclass(frozen=True)
class Option:
    """One option. ``env``: ``SPO_<NAME>`` sets it (a ``Settings`` field); ``flags``: its spellings on
    the ``commands`` that take it as a flag; ``old``: per command, older spellings that still work
    (hidden from ``--help``); ``choices``: the values it may take (checked, and listed by ``--help``);
    ``doc_default``: how a default computed at run time is written; ``flag``: an on/off switch;
    ``verbatim``: a flag's value is taken as given, its spaces kept (a JSON field name); ``guard``:
    it turns a protection on, so its variable set but blank is refused, not read as unset (a
    Kubernetes secret that came out empty must not turn authentication off)."""

    name: str
    default: Any
    help: str
    parse: Parse = _str
    check: Check | None = None
    env: bool = True
    flags: tuple[str, ...] = ()
    commands: frozenset[str] = frozenset()
    old: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    doc_default: str | None = None
    flag: bool = False
    verbatim: bool = False
    guard: bool = False

    @property
    def var(self) -> str:
        """The environment variable, ``SPO_<NAME>`` (the name settings problems are reported under)."""
        return PREFIX + self.name.upper()

    def flags_for(self, command: str) -> tuple[str, ...]:
        return self.flags if command in self.commands else ()

    def problems(self, value: Any) -> list[str]:
        """What is wrong with ``value`` (``None`` is always fine: the option is not set)."""
        if value is None:
            return []
        if self.choices and value not in self.choices:
            return [f"must be one of {', '.join(self.choices)}, got {value!r}"]
        return self.check(value) if self.check else []

    def doc_value(self) -> str:
        """The default as docs and ``--help`` write it."""
        value = self.default
        if self.doc_default is not None:
            return self.doc_default
        if value is None or value == "" or value == ():
            return "(none)"
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        return f"`{value}`" if isinstance(value, str) else str(value)


def _choices(values: Iterable[str], *, upper: bool = False) -> dict[str, Any]:
    return {"choices": tuple(values), "parse": str.upper if upper else str.lower}


_EXTRACT = frozenset({"extract"})
_BOTH = frozenset({"extract", "spark-extract"})
_SERVE = frozenset({"serve"})
_COUNT = in_range(0, 10**9)

# Option(name, default, help, parse, check, ...): kept compact, one option to a few lines.
# fmt: off
_TABLE = (
    # -- the model(s) ---------------------------------------------------------------------------------
    Option("model_dir", DEMO_MODEL_DIR, "model directory (SavedModel + model.json, or one written "
           "by spo export-onnx or spo export-openvino, which runs on that engine): one model, named "
           "after its directory",
           _model_path, doc_default="the embedded demo model"),
    Option("models", (), "several models, NAME=DIR,NAME=DIR, the first the default; instead of "
           "SPO_MODEL_DIR", _models, _model_names),
    Option("model", None, "A model name of SPO_MODELS (the names the service uses), or a model "
           "directory. Default: the service's default model (the first of SPO_MODELS, else "
           "SPO_MODEL_DIR, else the embedded demo model).", env=False, flags=("--model", "-m"),
           commands=_BOTH, old={"extract": ("--model-dir",)}, metavar="NAME|DIR"),
    Option("precision", None, "the model's own when not set (its model.json: fp32, or int8 for a "
           "spo quantize directory); " + precision_help(), flags=("--precision",),
           commands=_BOTH, doc_default="the model's own", **_choices(PRECISIONS)),
    Option("short_call_threads", False, "TF session: run short calls on a second session with fewer "
           "intra-op threads, by the plan measured for the precision (" + _plans() + "; none for "
           "the others, which run without); it holds the weights again (RBT6 int8: +551 MiB per "
           "worker, counted by the sizing) and makes no session at 1 intra-op thread, the default "
           "on 2 cores (BENCHMARKS.md, issue 24 part 3); ignored by the onnx and openvino engines",
           _bool, flags=("--short-call-threads",), commands=_EXTRACT, flag=True),
    Option("extra_rewrites", (), "TF session: comma-separated exact graph rewrites that are off by "
           "default, for frozen graphs (bf16, int8): " + "; ".join(
               f"{name}: {what}" for name, what in EXTRA_REWRITES.items()) + "; ignored by the "
           "onnx and openvino engines", _tokens, _rewrites, flags=("--extra-rewrites",),
           commands=_EXTRACT, metavar="NAME[,NAME]"),
    Option("load_mode", "boot", "boot: a worker accepts only once warm; background: it answers 503 "
           "meanwhile", **_choices(LOAD_MODES)),
    Option("load_retry_max_s", 30, "a worker whose model failed to load retries after 1, 2, 4... s, "
           "at most this many seconds apart", _int, in_range(1, 3600)),
    # -- limits per request and per text --------------------------------------------------------------
    Option("max_texts", 64, "most texts in one request", _int, in_range(1, 10_000)),
    Option("max_text_chars", DEFAULT_MAX_TEXT_CHARS, "most characters in one text; a longer one "
           "gets a text_too_long error", _int, in_range(1, 1_000_000), flags=("--max-text-chars",),
           commands=_BOTH),
    Option("max_body_bytes", 1 << 20, "largest request body in bytes (nginx's client_max_body_size "
           "too)", _int, in_range(1024, 1 << 30)),
    Option("max_request_tokens", 4096, "most model tokens one request may run, counted after "
           "tokenizing (0: no limit)", _int, _COUNT),
    Option("request_timeout", 30.0, "seconds a request may take, waiting for the model included; 504 "
           "after it; decimals allowed; below SPO_TIMEOUT (0: no deadline)", _seconds,
           in_range(0, 86_400, " seconds")),
    Option("rate_limit", "", "nginx per-client rate limit on /v1/, e.g. 10r/s or 600r/m (empty: "
           "none); refused without spo serve --nginx", str.lower,
           matches(_RATE, "expected N r/s or N r/m (e.g. 10r/s), got {item!r}")),
    Option("rate_burst", 20, "nginx: requests a client may go over the rate before 429", _int,
           in_range(0, 10**6)),
    # -- access ---------------------------------------------------------------------------------------
    Option("auth_tokens", (), "comma-separated bearer tokens (16+ characters) guarding /v1/*; "
           "health, metrics (its own token) and, unless SPO_PAGES=auth, the pages stay open",
           _tokens, matches(TOKEN, "token #{n} must be " + TOKEN_RULE), guard=True),
    Option("auth_tokens_file", None, "instead of SPO_AUTH_TOKENS: a file of tokens, one a line (blank "
           "lines and # comments ignored), e.g. a mounted secret; read at start and again on each reload "
           "(spo reload, SIGHUP), whose new workers serve what it says then; unreadable, empty or a bad line: "
           "refused at start, and a reload is refused, the old workers serving on (docs/security.md)", _file,
           guard=True),
    Option("pages", "open", "the demo page /, Swagger UI /docs and /openapi.json: open; auth (needs "
           "API tokens: then every path but /healthz, /readyz and /metrics needs one); off (404, with the page's assets). "
           "Exposed services: auth or off", **_choices(PAGES)),
    Option("tls_cert", None, "with spo serve --nginx: the PEM certificate (chain) nginx serves HTTPS "
           "(and HTTP/2 where it has it) with; needs SPO_TLS_KEY; refused without --nginx", _file,
           _existing_file),
    Option("tls_key", None, "with spo serve --nginx: the PEM private key of SPO_TLS_CERT", _file,
           _existing_file),
    Option("metrics_token", None, "bearer token (16+ characters) guarding GET /metrics; unset: open. "
           "Independent of SPO_AUTH_TOKENS", check=matches(TOKEN, "must be " + TOKEN_RULE),
           guard=True),
    Option("cors_origins", (), "comma-separated origins (https://host[:port], or *) whose pages may "
           "call the API; unset: no CORS headers", _tokens,
           matches(re.compile(rf"^\*$|{_ORIGIN.pattern}"),
                   "expected * or scheme://host[:port] origins, got {item!r}")),
    # -- processes: gunicorn, TensorFlow --------------------------------------------------------------
    Option("bind", "127.0.0.1:8000", "gunicorn's address, HOST:PORT or unix:PATH", check=_bind,
           flags=("--bind", "-b"),
           commands=_SERVE),
    Option("workers", 0, "gunicorn worker processes (gthread; model calls are serialized per "
           "worker); auto (or 0): usable CPUs (CPU quota, then affinity), capped by the memory limit",
           _workers, in_range(0, 256), flags=("--workers", "-w"), commands=_SERVE, metavar="N|auto",
           doc_default="auto"),
    Option("threads", 4, "threads per worker (model calls are serialized; the rest overlap)", _int,
           in_range(1, 256)),
    Option("intra_op_threads", None, "TensorFlow (or ONNX Runtime) intra-op threads per worker",
           _optional_int, in_range(1, 1024), doc_default="usable CPUs ÷ workers"),
    Option("inter_op_threads", 1, "TensorFlow (or ONNX Runtime) inter-op threads per worker", _int,
           in_range(1, 1024)),
    Option("timeout", 180, "gunicorn's worker timeout in seconds; must cover model load plus "
           "warm-up; a model call running longer gets its worker replaced; nginx waits 10 s longer",
           _int, in_range(10, 86_400)),
    Option("graceful_timeout", 30, "seconds a retiring worker has to finish its requests", _int,
           in_range(1, 86_400)),
    Option("max_requests", 10_000, "recycle a worker after this many requests (0: never)", _int,
           _COUNT),
    Option("max_requests_jitter", 1_000, "random extra requests per worker, so workers do not "
           "recycle together; below SPO_MAX_REQUESTS", _int, _COUNT),
    Option("max_worker_rss_mb", 4096, "RSS watchdog: retire a worker after the request that passes "
           "this many MiB (0: off)", _int, in_range(0, 10**7)),
    Option("microbatch_wait_ms", 0, "micro-batching: combine requests arriving within this many ms "
           "into one model call (0: off; needs SPO_THREADS >= 2)", _int, in_range(0, 1000)),
    Option("microbatch_max_texts", 32, "micro-batching: most texts in one combined model call", _int,
           in_range(1, 10_000)),
    Option("jemalloc", True, "LD_PRELOAD jemalloc when Debian's libjemalloc2 is installed", _bool),
    Option("pid_file", None, "gunicorn master's pid file, read by spo reload (in a writable "
           "directory that exists; an existing file must hold a pid: checked before gunicorn "
           "starts)", _path, doc_default="`$TMPDIR/spo-service-<address>.pid` (TMPDIR: /tmp unless set)"),
    # -- logs -----------------------------------------------------------------------------------------
    Option("log_format", "text", "text, or json for one JSON object per line (the service and every "
           "spo command)", **_choices(LOG_FORMATS)),
    Option("log_level", "INFO", "DEBUG, INFO, WARNING or ERROR", **_choices(LOG_LEVELS, upper=True)),
    Option("access_log", True, "gunicorn's access log on stdout (and with --nginx, nginx's lines for the requests gunicorn never answered)", _bool),
    Option("log_input_text", False, "put the request's input texts in its access-log line; off: input "
           "text is never logged", _bool),
    # -- the batch commands' input and output ---------------------------------------------------------
    Option("input_format", "auto", "Input format; auto: from each file's suffix (.txt, .jsonl, "
           ".ndjson, .json; .gz looked through), stdin is txt.", env=False,
           flags=("--input-format",), commands=_BOTH, old={"extract": ("--format",)},
           choices=INPUT_FORMATS),
    Option("output_format", "jsonl", "Output: JSON lines (spo extract's lines) or Parquet (nested "
           "entities/triples/error).", env=False, flags=("--output-format",),
           commands=frozenset({"spark-extract"}), old={"spark-extract": ("--format",)},
           choices=("jsonl", "parquet")),
    Option("text_field", "text", "JSONL field holding the text.", env=False,
           flags=("--text-field",), commands=_BOTH, verbatim=True),
    Option("id_field", "id", "JSONL field holding the id.", env=False, flags=("--id-field",),
           commands=_BOTH, verbatim=True),
    Option("force", False, "Overwrite an existing output.", env=False, flags=("--force",),
           commands=_BOTH, flag=True),
    Option("quiet", False, "No progress bar and no summary line.", env=False,
           flags=("-q", "--quiet"), commands=_BOTH, flag=True),
    # -- spo extract's processes and records ----------------------------------------------------------
    Option("batch_workers", 1, "Worker processes, each with its own model and cores/N TensorFlow "
           "threads; 0 runs the model in this process.", _int, in_range(0, 10_000), env=False,
           flags=("--workers",), commands=_EXTRACT),
    Option("recycle_after", 0, "Replace a worker after this many texts (0: never).", _int, _COUNT,
           env=False, flags=("--recycle-after",), commands=_EXTRACT, metavar="TEXTS"),
    Option("max_rss_mb", 0, "Replace a worker whose RSS is over this (0: no limit).", _int, _COUNT,
           env=False, flags=("--max-worker-rss",), commands=_EXTRACT, metavar="MIB"),
    Option("shard", (1, 1), "Process only records K, K+N, K+2N... (1-based; over all inputs "
           "together).", _shard, env=False, flags=("--shard",), commands=_EXTRACT, metavar="K/N",
           doc_default="all"),
    Option("window", 2048, "Records sorted by length together (bounds memory).", _int,
           in_range(1, 10**9), env=False, flags=("--window",), commands=_EXTRACT,
           metavar="RECORDS"),
    Option("record_timeout", 0.0, "Most model time one record may take; a record over it becomes a "
           "deadline_exceeded error record (0: no limit).", _seconds, in_range(0, 86_400), env=False,
           flags=("--record-timeout",), commands=_EXTRACT, metavar="SECONDS"),
    Option("partitions", None, "Tasks that run the model (default: one per input split). Order is "
           "kept either way.", _int, in_range(1, 10**9), env=False, flags=("--partitions",),
           commands=frozenset({"spark-extract"})),
)
# fmt: on
OPTIONS: dict[str, Option] = {option.name: option for option in _TABLE}
assert len(OPTIONS) == len(_TABLE), "an option is declared twice"
# The service's settings (``app.core.settings.Settings``'s fields), in declaration order.
SETTINGS: dict[str, Option] = {o.name: o for o in _TABLE if o.env}


_KINDS: dict[Parse, str] = {_int: "integer", _seconds: "float", _workers: "integer"}


class OptionType(click.ParamType[Any]):
    """A flag's value: parsed and checked as the option's variable is, so both fail alike."""

    def __init__(self, option: Option) -> None:
        self.option = option
        self.name = option.metavar or _KINDS.get(option.parse, "text")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):  # a default, already a value
            return value
        if not value.strip():  # `--workers=`: blank is "unset" in the environment, not on a flag
            self.fail("expected a value, got nothing", param, ctx)
        try:
            parsed = self.option.parse(value if self.option.verbatim else value.strip())
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        problems = self.option.problems(parsed)
        if problems:
            self.fail("; ".join(problems), param, ctx)
        return parsed


def _click_option(option: Option, command: str) -> Decorator:
    help_text = option.help
    if re.match(r"[a-z]+('s)?\b(?![_:])", help_text):  # a sentence, as click's others; not a name
        help_text = help_text[:1].upper() + help_text[1:]
    if not help_text.endswith("."):
        help_text += "."
    if option.env and command in ENV_COMMANDS:
        help_text += f" Env {option.var}."
    kwargs: dict[str, Any] = {"help": help_text}
    if option.flag:
        kwargs["is_flag"] = True
    else:
        kwargs["type"] = click.Choice(option.choices) if option.choices else OptionType(option)
        # Choices are listed (click's own [a|b], which a metavar would replace).
        choices = f"[{'|'.join(option.choices)}]" if option.choices else None
        kwargs["metavar"] = option.metavar or choices or kwargs["type"].name.upper()
        kwargs["default"] = option.default
        if command in ENV_COMMANDS:
            # The flag's text stands in for the variable's and is parsed and checked with every other
            # setting, so one run reports them all; not given, the variable (or the default) applies.
            kwargs["type"], kwargs["default"] = click.STRING, None
        written = option.doc_default is not None or command in ENV_COMMANDS
        shown = option.default not in (None, "", ())
        kwargs["show_default"] = option.doc_value().strip("`") if written and shown else shown
    return click.option(*option.flags, option.name, **kwargs)


def _hidden(option: Option, flags: tuple[str, ...]) -> Decorator:
    kind: dict[str, Any] = {"is_flag": True} if option.flag else {"type": OptionType(option)}
    if option.choices:
        kind = {"type": click.Choice(option.choices)}
    return click.option(*flags, f"old_{option.name}", hidden=True, default=None, **kind)


def click_options(command: str) -> Decorator:
    """Every option of ``OPTIONS`` that ``command`` takes as a flag, in table order, with its older
    spellings hidden: giving both a flag and its older spelling is a usage error, the older one alone
    works as the flag. The command receives each under the option's name."""
    mine = [o for o in _TABLE if command in o.commands]
    old = [(o, o.old[command]) for o in mine if command in o.old]

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def with_old_spellings(**kwargs: Any) -> Any:
            ctx = click.get_current_context()
            for option, flags in old:
                value = kwargs.pop(f"old_{option.name}")
                if value is None:
                    continue
                if ctx.get_parameter_source(option.name) == click.core.ParameterSource.COMMANDLINE:
                    raise click.UsageError(f"give {option.flags[0]} or {flags[0]}, not both")
                kwargs[option.name] = value
            return func(**kwargs)

        wrapped: Callable[..., Any] = with_old_spellings
        for option, flags in reversed(old):
            wrapped = _hidden(option, flags)(wrapped)
        for option in reversed(mine):
            wrapped = _click_option(option, command)(wrapped)
        return wrapped

    return decorate


def settings_table() -> str:
    """docs/rest.md's settings table: one row per ``SPO_*`` variable, in declaration order."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for option in SETTINGS.values():
        rows.append(f"| `{option.var}` | {option.doc_value()} | {option.help} |")
    return "\n".join(rows)


def precision_option(default: str | None = None, help_lead: str = "Model precision") -> Decorator:
    """``--precision`` for the commands outside the table (``spo evaluate``): its choices and help
    are the table's."""
    return click.option(
        "--precision",
        type=click.Choice(OPTIONS["precision"].choices),
        default=default,
        show_default=default is not None,
        help=f"{help_lead}: {OPTIONS['precision'].help}.",
    )


if __name__ == "__main__":  # python -m app.core.options: the table to paste into docs/rest.md
    print(settings_table())
