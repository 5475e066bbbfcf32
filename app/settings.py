"""Service settings: one frozen ``Settings``, the only code that reads ``SPO_*`` environment variables.

Every setting is declared once in ``FIELDS`` (variable, parser, help) with its default on the dataclass
and its check in ``Settings.problems``. ``Settings.from_env()`` parses every variable, validates every
field and raises one ``SettingsError`` naming every bad variable at once. Precedence: defaults < ``SPO_*``
environment < command-line flags (``spo serve`` turns its flags into ``SPO_*`` values before parsing).

>>> Settings.from_env({"SPO_MODEL_DIR": "/nowhere", "SPO_MAX_TEXTS": "0", "SPO_WORKERS": "two"})
Traceback (most recent call last):
...
app.settings.SettingsError: invalid settings:
  SPO_WORKERS: expected an integer, got 'two'
  SPO_MODEL_DIR: not a directory: /nowhere
  SPO_MAX_TEXTS: must be between 1 and 10000, got 0

Several models: ``SPO_MODELS=ner=models/ner,demo=models/demo`` serves each under its name (the first is
the default, run by ``/v1/extract``); ``SPO_MODEL_DIR`` is the one-model shorthand, its name the
directory's base name. ``Settings.model_table`` is the resolved list either way.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import InitVar, dataclass
from pathlib import Path
from typing import Any

from app.sizing import (
    BASE_RSS_MIB,
    Machine,
    Sizing,
    estimate_worker_rss_mib,
    intra_op_threads,
    model_precision,
    model_rss_mib,
    plan,
)
from nlp.config import (
    DEFAULT_MAX_TEXT_CHARS,
    DEMO_MODEL_DIR,
    MODEL_SETTINGS_HINT,
    PRECISIONS,
    LoadOptions,
    precision_help,
)

logger = logging.getLogger(__name__)

DEFAULT_MODEL_DIR = DEMO_MODEL_DIR
JEMALLOC_PATH = Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
PREFIX = "SPO_"
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOAD_MODES = ("boot", "background")
PAGES = ("open", "auth", "off")
_BIND = re.compile(r"^(unix:.+|\[[0-9A-Fa-f:.]+\]:\d{1,5}|[A-Za-z0-9.-]*:\d{1,5})$")
_TOKEN = re.compile(r"^[A-Za-z0-9._~+/=-]{16,}$")
_RATE = re.compile(r"^[1-9][0-9]{0,6}r/[sm]$")
# A model name is a URL path segment (/v1/models/<name>/extract) and a CLI argument.
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_ORIGIN = re.compile(r"^https?://[A-Za-z0-9.-]+(:\d{1,5})?$")


def cpu_count() -> int:
    """CPUs this process may keep busy: the cgroup CPU quota, then the affinity mask (``app.sizing``)."""
    return Machine.probe().cpus


def threads_per_worker(workers: int) -> int:
    """TensorFlow intra-op threads for each of ``workers`` model processes: the usable CPUs split evenly.

    The one cores / workers split: the service's workers, the batch command's workers and the
    benchmarks all call this; the CPUs are counted in ``app.sizing`` (cgroup quota, affinity mask).
    """
    return intra_op_threads(cpu_count(), workers)


class SettingsError(ValueError):
    """One or more settings are invalid; ``problems`` lists them all, each naming its variable."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid settings:\n" + "\n".join(f"  {p}" for p in problems))
        self.problems = problems


@dataclass(frozen=True)
class Settings:
    """Everything the service can be told. Defaults are the production defaults."""

    model_dir: Path = DEFAULT_MODEL_DIR
    models: tuple[tuple[str, Path], ...] = ()
    load_mode: str = "boot"
    load_retry_max_s: int = 30
    precision: str | None = None  # None: each model's own (its model.json: fp32, or int8)
    max_texts: int = 64
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    max_body_bytes: int = 1 << 20
    max_request_tokens: int = 4096
    request_timeout: float = 30.0
    rate_limit: str = ""
    rate_burst: int = 20
    auth_tokens: tuple[str, ...] = ()
    auth_tokens_file: Path | None = None
    pages: str = "open"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    bind: str = "127.0.0.1:8000"
    workers: int = 0  # 0: from the CPU quota, affinity mask and memory limit (``sizing()``)
    threads: int = 4
    intra_op_threads: int | None = None
    inter_op_threads: int = 1
    timeout: int = 180
    graceful_timeout: int = 30
    max_requests: int = 10_000
    max_requests_jitter: int = 1_000
    max_worker_rss_mb: int = 4096
    microbatch_wait_ms: int = 0
    microbatch_max_texts: int = 32
    jemalloc: bool = True
    log_format: str = "text"
    log_level: str = "INFO"
    access_log: bool = True
    pid_file: Path | None = None
    log_input_text: bool = False
    metrics_token: str | None = None
    cors_origins: tuple[str, ...] = ()
    # Not a setting: False skips the check that the model directory exists (a worker's: a missing model
    # is a load failure it survives and retries, app.model_slot; ``spo serve`` checks it before starting),
    # and that SPO_AUTH_TOKENS_FILE can be read (a worker that cannot read it stays up and refuses
    # every request that needs a token, app.auth; ``spo serve`` and a reload check it first).
    require_model: InitVar[bool] = True

    def __post_init__(self, require_model: bool) -> None:
        object.__setattr__(self, "model_dir", Path(self.model_dir))
        object.__setattr__(self, "models", tuple((n, Path(d)) for n, d in self.models))
        object.__setattr__(self, "auth_tokens", tuple(self.auth_tokens))
        for name in ("auth_tokens_file", "tls_cert", "tls_key"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        # The file's tokens are read here, once per Settings (never serialized: ``from_json`` reads
        # the file again): the master makes one at start and one per reload (SIGHUP), so a reload's
        # new workers serve what the file says then.
        tokens, problem = read_tokens_file(self.auth_tokens_file)
        object.__setattr__(self, "_file_tokens", tokens)
        object.__setattr__(self, "_file_problem", problem)
        object.__setattr__(self, "_auto_workers", self.workers == 0)
        if self.workers == 0:
            # Probed once per Settings: ``sizing()`` without a machine returns this one again.
            sizing = self.sizing()
            object.__setattr__(self, "_sizing", sizing)
            object.__setattr__(self, "workers", sizing.workers)
        object.__setattr__(self, "cors_origins", tuple(self.cors_origins))
        problems = self.problems(require_model=require_model)
        if problems:
            raise SettingsError(problems)

    @property
    def workers_auto(self) -> bool:
        """Whether ``workers`` came from ``sizing()`` (not set by SPO_WORKERS or a flag)."""
        return bool(getattr(self, "_auto_workers", False))

    def sizing(self, machine: Machine | None = None) -> Sizing:
        """Workers and threads for this machine or container and why (``app.sizing.plan``): a function
        of these settings, the machine and every served model (all of ``model_table``, each worker
        loads them all), each model in the precision it will run in. Without ``machine``, the sizing
        made when these settings resolved ``workers=auto`` is reused (no second probe)."""
        cached: Sizing | None = self.__dict__.get("_sizing")
        if machine is None and cached is not None:
            return cached
        explicit = not self.workers_auto
        served = [(n, d) for n, d in self.model_table if (d / "model.json").is_file()]
        rss = estimate_worker_rss_mib([d for _, d in served], self.precision) if served else None
        sizing = plan(
            machine or Machine.probe(),
            workers=self.workers if explicit and self.workers > 0 else None,
            intra_op=self.intra_op_threads,
            worker_rss_mib=rss,
        )
        if not served:
            return sizing
        shares = " + ".join(
            f"{name} {model_rss_mib(d, self.precision):,.0f} MiB "
            f"({model_precision(d, self.precision)})"
            for name, d in served
        )
        why = f"RSS per worker: runtime {BASE_RSS_MIB:,.0f} MiB + {shares}, estimated from disk"
        return dataclasses.replace(sizing, reasons=(*sizing.reasons, why))

    @property
    def tf_intra_op_threads(self) -> int:
        """TensorFlow intra-op threads per worker: usable CPUs / workers unless set (``app.sizing``)."""
        if self.intra_op_threads is not None:
            return self.intra_op_threads
        return threads_per_worker(self.workers)

    def load_options(self, model_dir: Path | None = None) -> LoadOptions:
        """How each worker loads a model (``nlp.loader.load_extractor``): ``model_dir``, one of
        ``model_table``'s, or ``SPO_MODEL_DIR``."""
        return LoadOptions(
            model_dir or self.model_dir,
            precision=self.precision,
            intra_op_threads=self.tf_intra_op_threads,
            inter_op_threads=self.inter_op_threads,
            max_text_chars=self.max_text_chars,
        )

    @property
    def model_table(self) -> tuple[tuple[str, Path], ...]:
        """``(name, directory)`` of every model served, the default first: ``SPO_MODELS``, or the one
        model of ``SPO_MODEL_DIR`` named after its directory."""
        return self.models or ((self.model_dir.name or "model", self.model_dir),)

    @property
    def default_model(self) -> str:
        return self.model_table[0][0]

    def resolve_model(self, ref: str | None) -> tuple[str, Path]:
        """``(name, directory)`` of a served model's NAME, or of a model directory DIR (named after
        it); ``None`` is the default model. ``ValueError`` names the known models otherwise."""
        if ref is None:
            return self.model_table[0]
        table = dict(self.model_table)
        if ref in table:
            return ref, table[ref]
        path = Path(ref).expanduser()
        if path.is_dir():
            return path.resolve().name or "model", path.resolve()
        raise ValueError(
            f"{ref!r} is neither a model name ({', '.join(table)}) nor a model directory"
        )

    @property
    def api_tokens(self) -> tuple[str, ...]:
        """The bearer tokens the API accepts: ``SPO_AUTH_TOKENS``, or those of ``SPO_AUTH_TOKENS_FILE``
        as read when these settings were made."""
        file_tokens: tuple[str, ...] = getattr(self, "_file_tokens", ())
        return self.auth_tokens or file_tokens

    @property
    def auth_enabled(self) -> bool:
        """Whether the API needs a token: also when the tokens file could not be read (fail closed)."""
        return bool(self.auth_tokens) or self.auth_tokens_file is not None

    @property
    def auth_tokens_problem(self) -> str | None:
        """Why ``SPO_AUTH_TOKENS_FILE`` gave no tokens when these settings were made (None: it did)."""
        problem: str | None = getattr(self, "_file_problem", None)
        return problem

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def use_jemalloc(self) -> bool:
        return self.jemalloc and JEMALLOC_PATH.is_file()

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` (validated again; ``require_model=False`` may be passed). Workers
        sized automatically stay so unless ``workers`` is changed."""
        new = dataclasses.replace(self, **changes)
        if self.workers_auto and "workers" not in changes:
            object.__setattr__(new, "_auto_workers", True)
        return new

    # -- handing the resolved value down (``spo serve`` -> gunicorn master -> workers) ------------
    def to_json(self) -> str:
        """These settings as one JSON document, resolved (``workers`` a number, paths absolute):
        ``spo serve`` hands it to the gunicorn master it execs (``app.master.handed_settings``).

        >>> s = Settings(workers=2, require_model=False)
        >>> Settings.from_json(s.to_json(), require_model=False) == s
        True
        """
        values: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Path):
                value = str(value)
            elif f.name == "models":
                value = [[name, str(directory)] for name, directory in value]
            elif isinstance(value, tuple):
                value = list(value)
            values[f.name] = value
        return json.dumps({"settings": values, "workers_auto": self.workers_auto})

    @classmethod
    def from_json(cls, text: str, *, require_model: bool = True) -> Settings:
        """The settings ``to_json`` wrote: validated again, no environment read, no sizing probe
        (``workers`` comes resolved). ``SettingsError`` for a document that is not one."""
        try:
            doc = json.loads(text)
            values = dict(doc["settings"])
            auto = bool(doc.get("workers_auto", False))
            for name in _PATH_FIELDS:
                if values.get(name) is not None:
                    values[name] = Path(values[name])
            settings = cls(**values, require_model=require_model)
        except (ValueError, KeyError, TypeError) as exc:
            if isinstance(exc, SettingsError):
                raise
            raise SettingsError([f"handed-down settings are not readable: {exc}"]) from None
        object.__setattr__(settings, "_auto_workers", auto)
        return settings

    def problems(self, *, require_model: bool = True) -> list[str]:
        """Every invalid field, as ``VARIABLE: what is wrong`` (empty when all is well)."""
        out: list[str] = []

        def bad(name: str, problem: str) -> None:
            out.append(f"{PREFIX}{name.upper()}: {problem}")

        def in_range(name: str, low: int, high: int) -> None:
            value = getattr(self, name)
            if value is not None and not low <= value <= high:
                bad(name, f"must be between {low} and {high}, got {value}")

        def one_of(name: str, choices: tuple[str, ...]) -> None:
            if getattr(self, name) not in choices:
                bad(name, f"must be one of {', '.join(choices)}, got {getattr(self, name)!r}")

        if self.models:
            if self.model_dir != DEFAULT_MODEL_DIR:
                bad("models", "set SPO_MODELS or SPO_MODEL_DIR (its one-model shorthand), not both")
            names = [name for name, _ in self.models]
            for name, directory in self.models:
                if not _MODEL_NAME.match(name):
                    bad(
                        "models",
                        f"model name {name!r} must be 1-64 of [A-Za-z0-9._-], starting with a "
                        "letter or digit",
                    )
                elif names.count(name) > 1:
                    bad("models", f"model name {name!r} is given twice")
                problem = _model_dir_problem(directory) if require_model else None
                if problem:
                    bad("models", f"{name}: {problem}")
        elif require_model:
            problem = _model_dir_problem(self.model_dir)
            if problem:
                bad("model_dir", problem)
        one_of("load_mode", LOAD_MODES)
        in_range("load_retry_max_s", 1, 3600)
        if self.precision is not None:
            one_of("precision", tuple(PRECISIONS))
        in_range("max_texts", 1, 10_000)
        in_range("max_text_chars", 1, 1_000_000)
        in_range("max_body_bytes", 1024, 1 << 30)
        in_range("max_request_tokens", 0, 10**9)
        if not 0 <= self.request_timeout <= 86_400:
            bad(
                "request_timeout",
                f"must be between 0 and 86400 seconds, got {self.request_timeout}",
            )
        elif self.request_timeout and self.request_timeout >= self.timeout:
            bad(
                "request_timeout",
                f"must be below SPO_TIMEOUT ({self.timeout} s), got {self.request_timeout:g}",
            )
        if self.rate_limit and not _RATE.match(self.rate_limit):
            bad("rate_limit", f"expected N r/s or N r/m (e.g. 10r/s), got {self.rate_limit!r}")
        in_range("rate_burst", 0, 10**6)
        for i, token in enumerate(self.auth_tokens):
            if not _TOKEN.match(token):
                bad("auth_tokens", f"token #{i + 1} must be 16+ characters of [A-Za-z0-9._~+/=-]")
        if self.auth_tokens and self.auth_tokens_file is not None:
            bad("auth_tokens_file", "set SPO_AUTH_TOKENS or SPO_AUTH_TOKENS_FILE, not both")
        elif require_model and self.auth_tokens_problem:
            bad("auth_tokens_file", self.auth_tokens_problem)
        one_of("pages", PAGES)
        if self.pages == "auth" and not self.auth_enabled:
            bad("pages", "auth needs API tokens (SPO_AUTH_TOKENS or SPO_AUTH_TOKENS_FILE)")
        if (self.tls_cert is None) != (self.tls_key is None):
            bad(
                "tls_cert" if self.tls_cert is None else "tls_key",
                "TLS needs both SPO_TLS_CERT and SPO_TLS_KEY",
            )
        for name in ("tls_cert", "tls_key"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                bad(name, f"not a file: {path}")
        if not _BIND.match(self.bind):
            bad("bind", f"expected HOST:PORT or unix:PATH, got {self.bind!r}")
        in_range("workers", 1, 256)
        in_range("threads", 1, 256)
        in_range("intra_op_threads", 1, 1024)
        in_range("inter_op_threads", 1, 1024)
        in_range("timeout", 10, 86_400)
        in_range("graceful_timeout", 1, 86_400)
        in_range("max_requests", 0, 10**9)
        in_range("max_requests_jitter", 0, 10**9)
        if self.max_requests and self.max_requests_jitter >= self.max_requests:
            bad("max_requests_jitter", "must be below SPO_MAX_REQUESTS")
        in_range("max_worker_rss_mb", 0, 10**7)
        in_range("microbatch_wait_ms", 0, 1000)
        in_range("microbatch_max_texts", 1, 10_000)
        if self.microbatch_wait_ms > 0 and self.threads < 2:
            bad(
                "microbatch_wait_ms",
                f"needs SPO_THREADS >= 2 (got {self.threads}): one request at a time never combines",
            )
        one_of("log_format", LOG_FORMATS)
        one_of("log_level", LOG_LEVELS)
        if self.metrics_token is not None and not _TOKEN.match(self.metrics_token):
            bad("metrics_token", "must be 16+ characters of [A-Za-z0-9._~+/=-]")
        for origin in self.cors_origins:
            if origin != "*" and not _ORIGIN.match(origin):
                bad("cors_origins", f"expected * or scheme://host[:port] origins, got {origin!r}")
        return out

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        require_model: bool = True,
        only: Collection[str] | None = None,
    ) -> Settings:
        """Settings from ``SPO_*`` variables (``os.environ`` by default); every bad one reported at once.

        ``only`` reads just those fields (the others keep their defaults): ``spo extract`` reads the
        model table (``model_dir``, ``models``) and nothing of the server's."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        problems: list[str] = []
        for name, (parse, _help) in FIELDS.items():
            if only is not None and name not in only:
                continue
            var = PREFIX + name.upper()
            raw = env.get(var)
            if raw is None or raw.strip() == "":
                continue
            try:
                values[name] = parse(raw.strip())
            except ValueError as exc:
                problems.append(f"{var}: {exc}")
        unknown = sorted(
            k for k in env if k.startswith(PREFIX) and k[len(PREFIX) :].lower() not in FIELDS
        )
        if unknown and only is None:
            logger.warning("ignoring unknown variables (typo?): %s", ", ".join(unknown))
        # Fields that parsed are still validated, so one run reports parse and range problems together.
        try:
            settings = cls(**values, require_model=require_model)
        except SettingsError as exc:
            failed = {p.split(":", 1)[0] for p in problems}
            problems += [p for p in exc.problems if p.split(":", 1)[0] not in failed]
            raise SettingsError(problems) from None
        if problems:
            raise SettingsError(problems)
        return settings


_PATH_FIELDS = ("model_dir", "auth_tokens_file", "tls_cert", "tls_key", "pid_file")


def _model_dir_problem(directory: Path) -> str | None:
    if not directory.is_dir():
        hint = f" (no model given: {MODEL_SETTINGS_HINT})" if directory == DEFAULT_MODEL_DIR else ""
        return f"not a directory: {directory}{hint}"
    if not (directory / "model.json").is_file():
        return f"no model.json in {directory}"
    return None


def read_tokens_file(path: Path | None) -> tuple[tuple[str, ...], str | None]:
    """The bearer tokens of ``path``, one a line (blank lines and ``#`` comments ignored), and what is
    wrong with the file (``None`` when nothing is). A bad token is named by its line, never shown.

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
    ...     _ = f.write("# rotated 2026-12-01\\nnew-token-0123456789\\n\\nold-token-0123456789\\n")
    ...     f.flush()
    ...     read_tokens_file(Path(f.name))
    (('new-token-0123456789', 'old-token-0123456789'), None)
    """
    if path is None:
        return (), None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return (), f"cannot read {path}: {reason}"
    tokens = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not _TOKEN.match(line):
            return (), f"{path} line {number}: a token must be 16+ characters of [A-Za-z0-9._~+/=-]"
        tokens.append(line)
    if not tokens:
        return (), f"no token in {path} (one a line; blank lines and # comments are ignored)"
    return tuple(tokens), None


def _models(raw: str) -> tuple[tuple[str, Path], ...]:
    """``NAME=DIR`` entries separated by commas; a bare ``DIR`` is named after its directory.

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
        out.append((name if sep else path.name, path))
    if not out:
        raise ValueError("expected NAME=DIR entries separated by commas")
    return tuple(out)


@dataclass(frozen=True)
class LogSettings:
    """The logging settings alone, for commands that need no other (``spo extract``, ``spo models``)."""

    log_format: str = Settings.log_format
    log_level: str = Settings.log_level

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LogSettings:
        """``SPO_LOG_FORMAT`` and ``SPO_LOG_LEVEL``, checked as ``Settings`` checks them."""
        env = os.environ if environ is None else environ
        values = {}
        problems = []
        for name, choices in (("log_format", LOG_FORMATS), ("log_level", LOG_LEVELS)):
            var = PREFIX + name.upper()
            raw = env.get(var, "").strip()
            if not raw:
                continue
            value = FIELDS[name][0](raw)
            if value not in choices:
                problems.append(f"{var}: must be one of {', '.join(choices)}, got {value!r}")
            values[name] = value
        if problems:
            raise SettingsError(problems)
        return cls(**values)


def _int(raw: str) -> int:
    try:
        return int(raw.replace("_", ""))
    except ValueError:
        raise ValueError(f"expected an integer, got {raw!r}") from None


def _seconds(raw: str) -> float:
    try:
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
    """Relative paths are taken from the current directory, like any command-line path."""
    return Path(raw).expanduser().resolve()


def _file(raw: str) -> Path:
    """An absolute path, symlinks kept: a mounted secret (Kubernetes swaps a symlink to update it) is
    found again through the same name each time it is read."""
    return Path(raw).expanduser().absolute()


def _tokens(raw: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in raw.split(",") if t.strip())


def _lower(raw: str) -> str:
    return raw.lower()


def _upper(raw: str) -> str:
    return raw.upper()


def _str(raw: str) -> str:
    return raw


FIELDS: dict[str, tuple[Callable[[str], Any], str]] = {
    "model_dir": (
        _path,
        "model directory (SavedModel + model.json, or one from spo export-onnx); default: the embedded "
        "demo model (models/demo in a checkout)",
    ),
    "models": (
        _models,
        "several models, NAME=DIR,NAME=DIR (the first is the default); replaces SPO_MODEL_DIR",
    ),
    "load_mode": (
        _lower,
        "boot: load and warm before the worker accepts; background: answer 503 meanwhile",
    ),
    "load_retry_max_s": (
        _int,
        "a worker whose model fails to load retries after 1, 2, 4... s, at most this many s apart",
    ),
    "precision": (_lower, precision_help()),
    "max_texts": (_int, "most texts in one request"),
    "max_text_chars": (_int, "most characters in one text"),
    "max_body_bytes": (_int, "largest request body in bytes (nginx client_max_body_size too)"),
    "max_request_tokens": (
        _int,
        "most model tokens one request may run, counted after tokenizing (0: no limit)",
    ),
    "request_timeout": (
        _seconds,
        "seconds a request may take, waiting for the model included; 504 after it (0: no deadline)",
    ),
    "rate_limit": (_lower, "nginx per-client rate limit on /v1/, e.g. 10r/s (empty: none)"),
    "rate_burst": (_int, "nginx: requests a client may go over the rate before 429"),
    "auth_tokens": (_tokens, "comma-separated bearer tokens for /v1/*; empty: no authentication"),
    "auth_tokens_file": (
        _file,
        "file of bearer tokens for /v1/*, one a line (blank lines and # comments ignored); read by "
        "each worker at start, so again on a reload (SIGHUP); instead of SPO_AUTH_TOKENS",
    ),
    "pages": (
        _lower,
        "the demo page /, the API docs /docs and /openapi.json: open (default), auth (the API "
        "tokens guard them, and every path but /healthz, /readyz and /metrics) or off (404)",
    ),
    "tls_cert": (
        _file,
        "with spo serve --nginx: PEM certificate (chain) nginx serves HTTPS with; needs SPO_TLS_KEY",
    ),
    "tls_key": (_file, "with spo serve --nginx: PEM private key of SPO_TLS_CERT"),
    "bind": (_str, "gunicorn bind address, HOST:PORT or unix:PATH"),
    "workers": (
        _workers,
        "gunicorn worker processes; auto (default): usable CPUs (CPU quota, then affinity), "
        "capped by the memory limit",
    ),
    "threads": (_int, "threads per worker (model calls are serialized; the rest overlap)"),
    "intra_op_threads": (
        _optional_int,
        "TensorFlow intra-op threads per worker (default: usable CPUs / workers)",
    ),
    "inter_op_threads": (_int, "TensorFlow inter-op threads per worker"),
    "timeout": (_int, "gunicorn worker timeout in seconds; must cover model load plus warm-up"),
    "graceful_timeout": (_int, "seconds a retiring worker has to finish its requests"),
    "max_requests": (_int, "recycle a worker after this many requests (0: never)"),
    "max_requests_jitter": (
        _int,
        "random extra requests per worker, so workers do not recycle together",
    ),
    "max_worker_rss_mb": (
        _int,
        "retire a worker once its RSS passes this many MiB (0: no watchdog)",
    ),
    "microbatch_wait_ms": (
        _int,
        "micro-batching: combine requests arriving within this many ms into one model call (0: off)",
    ),
    "microbatch_max_texts": (_int, "micro-batching: most texts in one combined model call"),
    "jemalloc": (_bool, "LD_PRELOAD jemalloc when libjemalloc2 is installed"),
    "log_format": (_lower, "text or json"),
    "log_level": (_upper, "DEBUG, INFO, WARNING or ERROR"),
    "access_log": (_bool, "gunicorn access log on stdout"),
    "pid_file": (
        _path,
        "gunicorn master's pid file (spo reload reads it); default: one per address in /tmp",
    ),
    "log_input_text": (_bool, "put the request's input texts in its access-log line (off: never)"),
    "metrics_token": (_str, "bearer token guarding GET /metrics (unset: open; never an API token)"),
    "cors_origins": (
        _tokens,
        "comma-separated origins browsers may call the API from (unset: no CORS headers)",
    ),
}

_missing = {f.name for f in dataclasses.fields(Settings)} ^ set(FIELDS)
assert not _missing, f"Settings and FIELDS disagree on {_missing}"
