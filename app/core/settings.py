"""Service settings: one frozen ``Settings``, the only code that reads ``SPO_*`` environment variables.

Every setting is declared once, in ``app.core.options`` (variable, flags, parser, default, check, help);
``Settings``' fields are its ``SETTINGS`` in their order (checked at import), each field's default the
table's. ``Settings.from_env()`` parses every variable, validates every field (each option's check,
then the checks across fields in ``Settings.problems``) and raises one ``SettingsError`` naming every
bad variable at once. Precedence: defaults < ``SPO_*`` environment < command-line flags (``spo serve``
turns its flags into ``SPO_*`` values before parsing).

>>> Settings.from_env({"SPO_MODEL_DIR": "/nowhere", "SPO_MAX_TEXTS": "0", "SPO_WORKERS": "two"})
Traceback (most recent call last):
...
app.core.settings.SettingsError: invalid settings:
  SPO_WORKERS: expected an integer, got 'two'
  SPO_MODEL_DIR: not a directory: /nowhere
  SPO_MAX_TEXTS: must be between 1 and 10000, got 0

Several models: ``SPO_MODELS=ner=models/ner,demo=models/demo`` serves each under its name (the first is
the default, run by ``/v1/extract``); ``SPO_MODEL_DIR`` is the one-model shorthand, its name the
directory's base name. ``Settings.model_table`` is the resolved list either way.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import os
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.options import PREFIX, SETTINGS, TOKEN, TOKEN_RULE, model_name_for
from app.core.sizing import (
    BASE_RSS_MIB,
    Machine,
    Sizing,
    estimate_worker_rss_mib,
    intra_op_threads,
    model_precision,
    model_rss_mib,
    plan,
    short_call_rss_mib,
)
from nlp.config import DEMO_MODEL_DIR, MODEL_SETTINGS_HINT, LoadOptions

logger = logging.getLogger(__name__)

DEFAULT_MODEL_DIR = DEMO_MODEL_DIR
JEMALLOC_PATH = Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
# prometheus_client's multiprocess directory (its own variable, not a setting: app.web.metrics).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def cpu_count() -> int:
    """CPUs this process may keep busy: the cgroup CPU quota, then the affinity mask (``app.core.sizing``)."""
    return Machine.probe().cpus


def threads_per_worker(workers: int) -> int:
    """TensorFlow intra-op threads for each of ``workers`` model processes: the usable CPUs split evenly.

    The one cores / workers split: the service's workers, the batch command's workers and the
    benchmarks all call this; the CPUs are counted in ``app.core.sizing`` (cgroup quota, affinity mask).
    """
    return intra_op_threads(cpu_count(), workers)


class SettingsError(ValueError):
    """One or more settings are invalid; ``problems`` lists them all, each naming its variable."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid settings:\n" + "\n".join(f"  {p}" for p in problems))
        self.problems = problems


@dataclass(frozen=True, init=False)
class Settings:
    """Everything the service can be told: one field per ``app.core.options.SETTINGS`` entry, in its order.
    The types are written here, for type checkers; variable, default, parser, check and help there."""

    model_dir: Path
    models: tuple[tuple[str, Path], ...]
    precision: str | None  # None: each model's own (its model.json: fp32, or int8)
    short_call_threads: bool
    extra_rewrites: tuple[str, ...]
    load_mode: str
    load_retry_max_s: int
    max_texts: int
    max_text_chars: int
    max_body_bytes: int
    max_request_tokens: int
    request_timeout: float
    rate_limit: str
    rate_burst: int
    auth_tokens: tuple[str, ...]
    auth_tokens_file: Path | None
    pages: str
    tls_cert: Path | None
    tls_key: Path | None
    metrics_token: str | None
    cors_origins: tuple[str, ...]
    bind: str
    workers: int  # 0: from the CPU quota, affinity mask and memory limit
    threads: int
    intra_op_threads: int | None
    inter_op_threads: int
    timeout: int
    graceful_timeout: int
    max_requests: int
    max_requests_jitter: int
    max_worker_rss_mb: int
    microbatch_wait_ms: int
    microbatch_max_texts: int
    jemalloc: bool
    pid_file: Path | None
    log_format: str
    log_level: str
    access_log: bool
    log_input_text: bool

    def __init__(self, *, require_model: bool = True, **values: Any) -> None:
        """A field given as a keyword, else its default (``app.core.options``). ``require_model``, not a
        setting: False skips the check that the model directory exists (a worker's: a missing model
        is a load failure it survives and retries, app.web.model_slot; ``spo serve`` checks it before
        starting), and that SPO_AUTH_TOKENS_FILE can be read (a worker that cannot read it stays up
        and refuses every request that needs a token, app.web.auth; ``spo serve`` and a reload check it
        first)."""
        unknown = sorted(set(values) - set(SETTINGS))
        if unknown:
            raise TypeError(f"Settings has no field {', '.join(unknown)}")
        for name, option in SETTINGS.items():
            object.__setattr__(self, name, values.get(name, option.default))
        self._complete(require_model)

    def _complete(self, require_model: bool) -> None:
        """Normalizes the fields, reads the tokens file, sizes `workers=auto` and checks it all."""
        object.__setattr__(self, "model_dir", Path(self.model_dir))
        object.__setattr__(self, "models", tuple((n, Path(d)) for n, d in self.models))
        object.__setattr__(self, "auth_tokens", tuple(self.auth_tokens))
        object.__setattr__(self, "extra_rewrites", tuple(self.extra_rewrites))
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
        """Workers and threads for this machine or container and why (``app.core.sizing.plan``): a function
        of these settings, the machine and every served model (all of ``model_table``, each worker
        loads them all), each model in the precision it will run in. Without ``machine``, the sizing
        made when these settings resolved ``workers=auto`` is reused (no second probe)."""
        cached: Sizing | None = self.__dict__.get("_sizing")
        if machine is None and cached is not None:
            return cached
        explicit = not self.workers_auto
        served = [(n, d) for n, d in self.model_table if _model_dir_problem(d) is None]
        machine = machine or Machine.probe()
        workers = self.workers if explicit and self.workers > 0 else None

        def sized(threads: int) -> Sizing:
            """The plan with each worker's RSS estimated at ``threads`` intra-op threads (a
            short-call thread plan makes its sessions only above one thread)."""
            rss = (
                estimate_worker_rss_mib(
                    [d for _, d in served],
                    self.precision,
                    short_call_threads=self.short_call_threads,
                    intra_op_threads=threads,
                )
                if served
                else None
            )
            return plan(
                machine, workers=workers, intra_op=self.intra_op_threads, worker_rss_mib=rss
            )

        threads = self.intra_op_threads or intra_op_threads(machine.cpus, workers or machine.cpus)
        sizing = sized(threads)
        if self.short_call_threads and sizing.intra_op_threads != threads:
            # Memory capped the workers, so each runs more threads: the plan's sessions follow.
            threads = sizing.intra_op_threads
            sizing = sized(threads)
        if not served:
            return sizing

        def share(d: Path) -> str:
            mib = model_rss_mib(
                d,
                self.precision,
                short_call_threads=self.short_call_threads,
                intra_op_threads=sizing.intra_op_threads,
            )
            extra = short_call_rss_mib(d, self.precision, sizing.intra_op_threads)
            session = (
                f", {extra:,.0f} MiB of it the short-call session"
                if self.short_call_threads and extra
                else ""
            )
            return f"{mib:,.0f} MiB ({model_precision(d, self.precision)}{session})"

        shares = " + ".join(f"{name} {share(d)}" for name, d in served)
        why = f"RSS per worker: runtime {BASE_RSS_MIB:,.0f} MiB + {shares}, estimated from disk"
        return dataclasses.replace(sizing, reasons=(*sizing.reasons, why))

    @property
    def tf_intra_op_threads(self) -> int:
        """TensorFlow intra-op threads per worker: usable CPUs / workers unless set (``app.core.sizing``)."""
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
            short_call_threads=self.short_call_threads,
            extra_rewrites=self.extra_rewrites,
        )

    @property
    def model_table(self) -> tuple[tuple[str, Path], ...]:
        """``(name, directory)`` of every model served, the default first: ``SPO_MODELS``, or the one
        model of ``SPO_MODEL_DIR`` named after its directory."""
        return self.models or ((model_name_for(self.model_dir), self.model_dir),)

    @property
    def default_model(self) -> str:
        return self.model_table[0][0]

    def pinned(self) -> Settings:
        """These settings with the model table's links resolved, as ``models`` (each named as it was
        given): what a generation of workers serves, so that a link moved later changes nothing for
        them, a worker recycled then included. ``spo serve`` pins at start, the master at a reload."""
        table = []
        for name, directory in self.model_table:
            try:
                table.append((name, directory.resolve()))
            except (OSError, RuntimeError):  # a loop: refused by the checks, left as given
                table.append((name, directory))
        return self.replace(model_dir=DEFAULT_MODEL_DIR, models=tuple(table))

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
            return model_name_for(path.resolve()), path.resolve()
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
        ``spo serve`` hands it to the gunicorn master it execs (``app.serving.master.handed_settings``).

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
        """Every invalid field, as ``VARIABLE: what is wrong`` (empty when all is well): the model
        directories, each option's own check (``app.core.options``), then what a field must be given the
        others."""
        out: list[str] = []

        def bad(name: str, problem: str) -> None:
            out.append(f"{SETTINGS[name].var}: {problem}")

        if self.models:
            if self.model_dir != DEFAULT_MODEL_DIR:
                out.append(_BOTH)
            for name, directory in self.models if require_model else ():
                problem = _model_dir_problem(directory)
                if problem:
                    bad("models", f"{name}: {problem}")
        elif require_model:
            problem = _model_dir_problem(self.model_dir)
            if problem:
                bad("model_dir", problem)
        invalid = set()
        for name, option in SETTINGS.items():
            problems = option.problems(getattr(self, name))
            out += [f"{option.var}: {p}" for p in problems]
            invalid.update([name] if problems else [])
        # The checks between two settings, where both are valid on their own (else only the
        # invalid one is named: SPO_TIMEOUT=-1 is not also a SPO_REQUEST_TIMEOUT problem).
        if (
            not invalid & {"timeout", "request_timeout"}
            and self.request_timeout > 0
            and self.request_timeout >= self.timeout
        ):
            bad(
                "request_timeout",
                f"must be below SPO_TIMEOUT ({self.timeout} s), got {self.request_timeout:g}",
            )
        if self.auth_tokens and self.auth_tokens_file is not None:
            bad("auth_tokens_file", "set SPO_AUTH_TOKENS or SPO_AUTH_TOKENS_FILE, not both")
        elif require_model and self.auth_tokens_problem:
            bad("auth_tokens_file", self.auth_tokens_problem)
        if self.pages == "auth" and not self.auth_enabled:
            bad("pages", "auth needs API tokens (SPO_AUTH_TOKENS or SPO_AUTH_TOKENS_FILE)")
        if (self.tls_cert is None) != (self.tls_key is None):
            bad(
                "tls_cert" if self.tls_cert is None else "tls_key",
                "TLS needs both SPO_TLS_CERT and SPO_TLS_KEY",
            )
        if (
            not invalid & {"max_requests", "max_requests_jitter"}
            and self.max_requests
            and self.max_requests_jitter >= self.max_requests
        ):
            bad("max_requests_jitter", "must be below SPO_MAX_REQUESTS")
        if self.microbatch_wait_ms > 0 and self.threads < 2:
            bad(
                "microbatch_wait_ms",
                f"needs SPO_THREADS >= 2 (got {self.threads}): one request at a time never combines",
            )
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
        values, problems = parse_env(env, SETTINGS if only is None else only)
        # Both set is refused whatever SPO_MODEL_DIR names (the constructor sees only a value
        # other than the default: the demo's own directory named outright slipped through).
        both = "model_dir" in values and "models" in values
        unknown = sorted(
            k for k in env if k.startswith(PREFIX) and k[len(PREFIX) :].lower() not in SETTINGS
        )
        if only is None:
            # A near miss of a setting is a typo that would leave its default in force (a misspelt
            # SPO_AUTH_TOKENS served without authentication): refused. Others (Kubernetes's service
            # links, SPO_SERVICE_PORT...) are told and ignored.
            misspelt = misspelt_settings(unknown)
            problems += [f"{k}: not a setting; did you mean {m}?" for k, m in misspelt.items()]
            if rest := [k for k in unknown if k not in misspelt]:
                logger.warning("ignoring unknown variables: %s", ", ".join(rest))
        # Fields that parsed are still validated, so one run reports parse and range problems together.
        try:
            settings = cls(**values, require_model=require_model)
        except SettingsError as exc:
            failed = {p.split(":", 1)[0] for p in problems}
            problems += [p for p in exc.problems if p.split(":", 1)[0] not in failed]
            raise SettingsError(_with_both(problems, both)) from None
        if problems or both:
            raise SettingsError(_with_both(problems, both))
        return settings


def parse_env(env: Mapping[str, str], names: Iterable[str]) -> tuple[dict[str, Any], list[str]]:
    """The values of the settings ``names`` that ``env`` sets (blank is unset, but for a guard: a
    token), and the problems of those that do not parse, each as ``VARIABLE: what is wrong``."""
    values: dict[str, Any] = {}
    problems: list[str] = []
    for name in names:
        option = SETTINGS[name]
        raw = env.get(option.var, "").strip()
        if not raw:
            if option.guard and option.var in env:
                problems.append(
                    f"{option.var}: set but empty (an empty secret?); unset it to turn this "
                    "protection off"
                )
            continue
        try:
            values[name] = option.parse(raw)
        except ValueError as exc:
            problems.append(f"{option.var}: {exc}")
    return values, problems


def model_directory(ref: str | None, environ: Mapping[str, str] | None = None) -> Path:
    """The directory of a command's ``--model NAME|DIR`` as the service resolves a name (``SPO_MODELS``,
    ``SPO_MODEL_DIR``); ``None`` is the service's default model. ``ValueError`` (a ``SettingsError``
    for bad variables) says why there is none."""
    try:
        table = Settings.from_env(environ, only=("model_dir", "models"))
    except SettingsError:
        # A directory given outright needs no model table (nor a valid one).
        if ref is not None and Path(ref).expanduser().is_dir():
            return Path(ref).expanduser().resolve()
        raise
    return table.resolve_model(ref)[1]


_PATH_FIELDS = ("model_dir", "auth_tokens_file", "tls_cert", "tls_key", "pid_file")


_BOTH = "SPO_MODELS: set SPO_MODELS or SPO_MODEL_DIR (its one-model shorthand), not both"


# What Kubernetes puts in every pod for each Service of its namespace (a Service "spo-model":
# SPO_MODEL_SERVICE_HOST, SPO_MODEL_PORT, SPO_MODEL_PORT_80_TCP_ADDR...): never a typo of ours.
_SERVICE_LINK = re.compile(
    r".+_(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT|PORT_\d+_(TCP|UDP|SCTP)(_\w+)?)"
)


def misspelt_settings(names: Iterable[str]) -> dict[str, str]:
    """The names among ``names`` that are a near miss of a setting's variable, with that variable;
    never a Kubernetes service link.

    >>> misspelt_settings(["SPO_AUTH_TOKEN", "SPO_WORKER", "SPO_MODELS_DIR", "SPO_MODEL_PORT"])
    {'SPO_AUTH_TOKEN': 'SPO_AUTH_TOKENS', 'SPO_WORKER': 'SPO_WORKERS', 'SPO_MODELS_DIR': 'SPO_MODEL_DIR'}
    """
    known = [option.var for option in SETTINGS.values()]
    found = {
        name: difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        for name in names
        if not _SERVICE_LINK.fullmatch(name)
    }
    return {name: match[0] for name, match in found.items() if match}


def _with_both(problems: list[str], both: bool) -> list[str]:
    return [*problems, _BOTH] if both and _BOTH not in problems else problems


def _model_dir_problem(directory: Path) -> str | None:
    try:  # a name too long, a folder this user may not enter: one line, not a traceback
        if not directory.is_dir():
            hint = (
                f" (no model given: {MODEL_SETTINGS_HINT})"
                if directory == DEFAULT_MODEL_DIR
                else ""
            )
            return f"not a directory: {directory}{hint}"
        if not (directory / "model.json").is_file():
            return f"no model.json in {directory}"
    except OSError as exc:
        return f"cannot read {directory}: {exc.strerror or exc}"
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
        if not TOKEN.match(line):
            return (), f"{path} line {number}: a token must be {TOKEN_RULE}"
        tokens.append(line)
    if not tokens:
        return (), f"no token in {path} (one a line; blank lines and # comments are ignored)"
    return tuple(tokens), None


@dataclass(frozen=True)
class LogSettings:
    """The logging settings alone, for commands that need no other (``spo extract``, ``spo models``)."""

    log_format: str = SETTINGS["log_format"].default
    log_level: str = SETTINGS["log_level"].default

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LogSettings:
        """``SPO_LOG_FORMAT`` and ``SPO_LOG_LEVEL``, checked as ``Settings`` checks them."""
        names = [f.name for f in dataclasses.fields(cls)]
        values, problems = parse_env(os.environ if environ is None else environ, names)
        problems += [
            f"{SETTINGS[n].var}: {p}" for n, v in values.items() for p in SETTINGS[n].problems(v)
        ]
        if problems:
            raise SettingsError(problems)
        return cls(**values)


# The service's settings by name (``app.core.options.SETTINGS``), which ``Settings``' fields are.
FIELDS = SETTINGS
_missing = [f.name for f in dataclasses.fields(Settings)] != list(SETTINGS)
assert not _missing, "Settings' fields are not app.core.options.SETTINGS, in its order"
