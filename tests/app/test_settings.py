"""``Settings``: defaults, parsing of every ``SPO_*`` variable, every bad one reported at once."""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path

import pytest

from app.core.settings import DEFAULT_MODEL_DIR, FIELDS, Settings, SettingsError, cpu_count


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "model.json").write_text("{}")
    return tmp_path


def env(model_dir: Path, **variables: str) -> dict[str, str]:
    return {
        "SPO_MODEL_DIR": str(model_dir),
        **{f"SPO_{k.upper()}": v for k, v in variables.items()},
    }


def test_settings_defaults(model_dir: Path) -> None:
    settings = Settings.from_env(env(model_dir))
    assert settings.model_dir == model_dir
    assert (settings.max_texts, settings.max_text_chars, settings.max_body_bytes) == (
        64,
        10_000,
        1 << 20,
    )
    assert settings.workers == cpu_count()
    assert settings.tf_intra_op_threads == max(1, cpu_count() // settings.workers)
    assert settings.auth_tokens == () and not settings.auth_enabled
    assert settings.load_mode == "boot" and settings.precision is None  # the model's own
    assert settings.jemalloc and settings.log_format == "text"
    assert (settings.microbatch_wait_ms, settings.microbatch_max_texts) == (0, 32)  # off
    assert DEFAULT_MODEL_DIR.parts[-2:] == ("models", "demo")


def test_settings_parse_every_variable(model_dir: Path) -> None:
    settings = Settings.from_env(
        env(
            model_dir,
            load_mode="Background",
            precision="BF16",
            max_texts="8",
            max_text_chars="1_000",
            max_body_bytes="4096",
            auth_tokens=" aaaaaaaaaaaaaaaa , bbbbbbbbbbbbbbbb,",
            bind="0.0.0.0:9000",
            workers="3",
            threads="2",
            intra_op_threads="auto",
            inter_op_threads="2",
            timeout="60",
            graceful_timeout="5",
            max_requests="0",
            max_requests_jitter="0",
            max_worker_rss_mb="0",
            microbatch_wait_ms="5",
            microbatch_max_texts="16",
            jemalloc="off",
            log_format="JSON",
            log_level="debug",
            access_log="no",
        )
    )
    assert settings.load_mode == "background" and settings.precision == "bf16"
    assert (settings.max_texts, settings.max_text_chars, settings.max_body_bytes) == (8, 1000, 4096)
    assert settings.auth_tokens == ("a" * 16, "b" * 16)
    assert (settings.bind, settings.workers, settings.threads) == ("0.0.0.0:9000", 3, 2)
    assert settings.intra_op_threads is None and settings.inter_op_threads == 2
    assert (settings.max_requests, settings.max_worker_rss_mb) == (0, 0)
    assert (settings.microbatch_wait_ms, settings.microbatch_max_texts) == (5, 16)
    assert not settings.jemalloc and not settings.use_jemalloc and not settings.access_log
    assert (settings.log_format, settings.log_level) == ("json", "DEBUG")


def test_settings_report_every_bad_variable_at_once(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env(
            {
                "SPO_MODEL_DIR": str(tmp_path / "missing"),
                "SPO_MAX_TEXTS": "0",
                "SPO_MAX_TEXT_CHARS": "many",
                "SPO_MAX_BODY_BYTES": "10",
                "SPO_WORKERS": "-1",
                "SPO_PRECISION": "fp8",
                "SPO_JEMALLOC": "maybe",
                "SPO_LOG_FORMAT": "xml",
                "SPO_BIND": "localhost",
                "SPO_AUTH_TOKENS": "short",
                "SPO_MAX_REQUESTS": "10",
                "SPO_MAX_REQUESTS_JITTER": "10",
                "SPO_LOAD_MODE": "lazy",
            }
        )
    named = {p.split(":", 1)[0] for p in info.value.problems}
    assert named == {
        "SPO_MODEL_DIR",
        "SPO_MAX_TEXTS",
        "SPO_MAX_TEXT_CHARS",
        "SPO_MAX_BODY_BYTES",
        "SPO_WORKERS",
        "SPO_PRECISION",
        "SPO_JEMALLOC",
        "SPO_LOG_FORMAT",
        "SPO_BIND",
        "SPO_AUTH_TOKENS",
        "SPO_MAX_REQUESTS_JITTER",
        "SPO_LOAD_MODE",
    }
    assert len(info.value.problems) == len(named)  # one line each, parse errors not repeated
    assert "expected an integer, got 'many'" in str(info.value)


@pytest.mark.parametrize("var", ["SPO_AUTH_TOKENS", "SPO_CORS_ORIGINS"])
def test_settings_a_list_that_names_nothing_is_refused(model_dir: Path, var: str) -> None:
    """Only a blank value is unset: " , " (a templated list whose items came out empty) is refused
    rather than read as no tokens, which would serve the API without authentication."""
    with pytest.raises(SettingsError, match=f"{var}: expected comma-separated values, got ','"):
        Settings.from_env({"SPO_MODEL_DIR": str(model_dir), var: " , "})


@pytest.mark.parametrize("var", ["SPO_AUTH_TOKENS", "SPO_AUTH_TOKENS_FILE", "SPO_METRICS_TOKEN"])
@pytest.mark.parametrize("blank", ["", "   "])
def test_settings_a_protection_set_to_nothing_is_refused_not_turned_off(
    model_dir: Path, var: str, blank: str
) -> None:
    """Blank was unset for every variable: a secretKeyRef to an empty secret served /v1/* (or
    /metrics) without authentication, and said nothing. Any other blank setting is still unset."""
    with pytest.raises(SettingsError, match=f"{var}: set but empty"):
        Settings.from_env({"SPO_MODEL_DIR": str(model_dir), var: blank})
    settings = Settings.from_env({"SPO_MODEL_DIR": str(model_dir), "SPO_CORS_ORIGINS": blank})
    assert not settings.auth_enabled and settings.cors_origins == ()


def test_settings_model_dir_needs_model_json(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"no model\.json"):
        Settings(model_dir=tmp_path)


def test_settings_direct_construction_is_validated(model_dir: Path) -> None:
    with pytest.raises(SettingsError, match="SPO_THREADS"):
        Settings(model_dir=model_dir, threads=0)
    with pytest.raises(SettingsError):
        Settings(model_dir=model_dir).replace(max_texts=0)


def test_settings_are_frozen(model_dir: Path) -> None:
    settings = Settings(model_dir=model_dir)
    with pytest.raises(AttributeError):
        settings.max_texts = 3  # type: ignore[misc]


def test_settings_blank_means_default(model_dir: Path) -> None:
    assert Settings.from_env(env(model_dir, max_texts="  ")).max_texts == 64


def test_settings_unknown_variable_warns(model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="app.core.settings"):
        Settings.from_env(env(model_dir, service_port="80", port_8080_tcp_addr="10.0.0.1"))
    assert "ignoring unknown variables: SPO_PORT_8080_TCP_ADDR, SPO_SERVICE_PORT" in caplog.text
    # Kubernetes's links to Services named spo-model, spo-workers...: near misses by spelling only.
    links = {"model_port": "tcp://10.0.0.2:80", "workers_service_host": "10.0.0.3",
             "models_port_80_tcp_addr": "10.0.0.4", "threads_service_port_http": "80"}  # fmt: skip
    Settings.from_env(env(model_dir, **links))


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("auth_token", "SPO_AUTH_TOKENS"),
        ("metrics_tokens", "SPO_METRICS_TOKEN"),
        ("auth_token_file", "SPO_AUTH_TOKENS_FILE"),
        ("max_text", "SPO_MAX_TEXTS"),
    ],
)
def test_settings_a_near_miss_of_a_setting_is_refused_as_a_typo(
    model_dir: Path, typo: str, meant: str
) -> None:
    """A misspelt guard started the server without it, with a warning only: authentication off."""
    with pytest.raises(
        SettingsError, match=f"SPO_{typo.upper()}: not a setting; did you mean {meant}"
    ):
        Settings.from_env(env(model_dir, **{typo: "abcdefghijklmnop0123"}))
    # Only the whole parse judges: a command reading a few settings leaves the others to the server.
    Settings.from_env(env(model_dir, **{typo: "x"}), only=("model_dir",))


@pytest.mark.parametrize("variable", ["SPO_MODEL_DIR", "SPO_MODELS", "SPO_TLS_CERT"])
def test_settings_a_path_that_cannot_be_looked_at_is_named_not_a_traceback(
    model_dir: Path, variable: str
) -> None:
    too_long = "/tmp/" + "a" * 300
    value = f"m={too_long}" if variable == "SPO_MODELS" else too_long
    given = {"SPO_TLS_KEY": str(model_dir / "model.json")} if variable == "SPO_TLS_CERT" else {}
    base = {} if variable in ("SPO_MODEL_DIR", "SPO_MODELS") else {"SPO_MODEL_DIR": str(model_dir)}
    with pytest.raises(
        SettingsError, match=f"{variable}: .*cannot read {too_long}: File name too long"
    ):
        Settings.from_env({**base, **given, variable: value})


def test_settings_explicit_intra_op_threads(model_dir: Path) -> None:
    settings = Settings(model_dir=model_dir, workers=64, intra_op_threads=3)
    assert settings.tf_intra_op_threads == 3
    assert Settings(model_dir=model_dir, workers=256).tf_intra_op_threads == 1


def test_settings_every_field_has_a_variable() -> None:
    assert [f.name for f in dataclasses.fields(Settings)] == list(FIELDS)
    assert all(
        option.help and option.var == f"SPO_{name.upper()}" for name, option in FIELDS.items()
    )


def test_settings_defaults_are_the_tables(model_dir: Path) -> None:
    settings = Settings(model_dir=model_dir)
    for name, option in FIELDS.items():
        if name not in ("model_dir", "workers"):  # given above; auto is sized
            assert getattr(settings, name) == option.default, name
    with pytest.raises(TypeError, match="no field max_text"):
        Settings(model_dir=model_dir, max_text=5)


def test_settings_microbatch_ranges_and_threads(model_dir: Path) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env(
            env(model_dir, microbatch_wait_ms="1001", microbatch_max_texts="0", threads="4")
        )
    assert {p.split(":", 1)[0] for p in info.value.problems} == {
        "SPO_MICROBATCH_WAIT_MS",
        "SPO_MICROBATCH_MAX_TEXTS",
    }
    with pytest.raises(SettingsError, match=r"SPO_MICROBATCH_WAIT_MS: needs SPO_THREADS >= 2"):
        Settings(model_dir=model_dir, threads=1, microbatch_wait_ms=5)
    with pytest.raises(SettingsError, match="SPO_MICROBATCH_WAIT_MS"):
        Settings.from_env(env(model_dir, microbatch_wait_ms="-1"))
    # Off, one thread is fine: nothing to combine, nothing waits.
    assert Settings(model_dir=model_dir, threads=1).microbatch_wait_ms == 0


# -- secure defaults for an exposed service (issue 21) ---------------------------------------------
def test_settings_auth_tokens_file_one_token_a_line(model_dir: Path, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(
        "# rotated 2026-12-01\n\n  first-token-0123456789  \nsecond-token-0123456789\n"
    )
    settings = Settings.from_env(env(model_dir, auth_tokens_file=str(tokens)))
    assert settings.api_tokens == ("first-token-0123456789", "second-token-0123456789")
    assert settings.auth_enabled and settings.auth_tokens == ()
    # Read again by each new Settings (each worker's): the file as it is now.
    tokens.write_text("third-token-0123456789\n")
    assert settings.replace().api_tokens == ("third-token-0123456789",)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "cannot read"),
        ("", "no token in"),
        ("# only a comment\n\n", "no token in"),
        ("good-token-0123456789\nshort\n", "line 2: a token must be 16+ characters"),
        (b"\xff\xfe-not-utf8-at-all-0123", "cannot read"),
    ],
)
def test_settings_auth_tokens_file_problems(
    model_dir: Path, tmp_path: Path, content: str | bytes | None, problem: str
) -> None:
    path = tmp_path / "tokens"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(SettingsError) as info:
        Settings.from_env(env(model_dir, auth_tokens_file=str(path)))
    assert info.value.problems == [
        next(p for p in info.value.problems if p.startswith("SPO_AUTH_TOKENS_FILE: "))
    ]
    assert problem in str(info.value)
    assert "short\n" not in str(info.value)  # a token is never shown


def test_settings_auth_tokens_file_excludes_auth_tokens(model_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("file-token-0123456789\n")
    with pytest.raises(SettingsError, match="SPO_AUTH_TOKENS_FILE: set SPO_AUTH_TOKENS or"):
        Settings.from_env(
            env(model_dir, auth_tokens="env-token-0123456789", auth_tokens_file=str(path))
        )


def test_settings_pages(model_dir: Path) -> None:
    assert Settings.from_env(env(model_dir)).pages == "open"
    assert Settings.from_env(env(model_dir, pages="OFF")).pages == "off"
    authed = env(model_dir, pages="auth", auth_tokens="env-token-0123456789")
    assert Settings.from_env(authed).pages == "auth"
    with pytest.raises(SettingsError, match="SPO_PAGES: auth needs API tokens"):
        Settings.from_env(env(model_dir, pages="auth"))
    with pytest.raises(SettingsError, match="SPO_PAGES: must be one of open, auth, off"):
        Settings.from_env(env(model_dir, pages="hidden"))


def test_settings_tls_needs_both_files(model_dir: Path, tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    key.write_text("-----BEGIN PRIVATE KEY-----\n")
    settings = Settings.from_env(env(model_dir, tls_cert=str(cert), tls_key=str(key)))
    assert settings.tls and (settings.tls_cert, settings.tls_key) == (cert, key)
    assert not Settings.from_env(env(model_dir)).tls
    with pytest.raises(SettingsError, match="SPO_TLS_KEY: TLS needs both"):
        Settings.from_env(env(model_dir, tls_cert=str(cert)))
    with pytest.raises(SettingsError, match="SPO_TLS_CERT: TLS needs both"):
        Settings.from_env(env(model_dir, tls_key=str(key)))
    with pytest.raises(SettingsError, match="SPO_TLS_KEY: not a file"):
        Settings.from_env(env(model_dir, tls_cert=str(cert), tls_key=str(tmp_path / "nope")))


@pytest.mark.parametrize("doc", ["rest.md", "security.md"])
def test_settings_docs_name_real_settings_only(doc: str) -> None:
    text = (Path(__file__).parents[2] / "docs" / doc).read_text(encoding="utf-8")
    text = re.sub(r"there is no `SPO_\w+`", "", text)  # a setting the docs say does not exist
    named = set(re.findall(r"\bSPO_([A-Z][A-Z0-9_]*[A-Z0-9])\b", text))
    assert named, doc
    assert {n.lower() for n in named} <= set(FIELDS), sorted(
        n for n in named if n.lower() not in FIELDS
    )
    if doc == "rest.md":  # the settings table documents every one
        assert set(FIELDS) <= {n.lower() for n in named}, sorted(
            set(FIELDS) - {n.lower() for n in named}
        )


# -- handed down: spo serve -> gunicorn master -> workers (issue 20) -------------------------------
def test_settings_json_round_trip_keeps_every_field_and_auto_workers(
    model_dir: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.json").write_text("{}")
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("token-0123456789abcdef\n")
    settings = Settings.from_env(
        {
            "SPO_MODELS": f"a={model_dir},b={other}",
            "SPO_AUTH_TOKENS_FILE": str(tokens),
            "SPO_CORS_ORIGINS": "https://a.example",
            "SPO_PID_FILE": str(tmp_path / "spo.pid"),
            "SPO_PRECISION": "bf16",
            "SPO_REQUEST_TIMEOUT": "2.5",
            "SPO_ACCESS_LOG": "0",
        }
    )
    assert settings.workers_auto
    back = Settings.from_json(settings.to_json())
    assert back == settings
    assert back.workers_auto and back.workers == settings.workers
    assert back.models == ((("a", model_dir), ("b", other)))
    assert isinstance(back.pid_file, Path) and isinstance(back.auth_tokens_file, Path)
    assert back.api_tokens == ("token-0123456789abcdef",)  # the tokens file is read again
    explicit = Settings.from_json(settings.replace(workers=3).to_json())
    assert explicit.workers == 3 and not explicit.workers_auto


def test_settings_from_json_reads_no_environment(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = Settings.from_env(env(model_dir, workers="2", max_texts="7")).to_json()
    monkeypatch.setenv("SPO_WORKERS", "not-a-number")
    monkeypatch.setenv("SPO_MAX_TEXTS", "0")
    settings = Settings.from_json(text)
    assert (settings.workers, settings.max_texts) == (2, 7)


def test_settings_from_json_refuses_a_bad_document(model_dir: Path) -> None:
    with pytest.raises(SettingsError, match="handed-down settings are not readable"):
        Settings.from_json("{")
    with pytest.raises(SettingsError, match="handed-down settings are not readable"):
        Settings.from_json('{"settings": {"no_such_field": 1}}')
    doc = Settings.from_env(env(model_dir, workers="2")).to_json()
    with pytest.raises(SettingsError, match="SPO_MAX_TEXTS: must be between 1 and 10000, got 0"):
        Settings.from_json(doc.replace('"max_texts": 64', '"max_texts": 0'))


def test_settings_replace_keeps_auto_workers_and_the_sizing_is_probed_once(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.core.settings as settings_module

    probes = []
    real = settings_module.Machine.probe
    monkeypatch.setattr(
        settings_module.Machine, "probe", lambda *a, **k: probes.append(1) or real(*a, **k)
    )
    settings = Settings.from_env(env(model_dir))
    assert settings.workers_auto and len(probes) == 1
    assert settings.sizing() is settings.sizing() and len(probes) == 1
    moved = settings.replace(bind="unix:/tmp/x.sock")
    assert moved.workers_auto and moved.workers == settings.workers
    assert not settings.replace(workers=1).workers_auto


def test_settings_precision_defaults_to_each_models_own(model_dir: Path) -> None:
    settings = Settings.from_env(env(model_dir))
    assert settings.precision is None
    assert settings.load_options().precision is None  # resolved on load, from model.json
    assert Settings.from_env(env(model_dir, precision="int8")).load_options().precision == "int8"
    with pytest.raises(SettingsError, match="SPO_PRECISION: must be one of fp32, bf16, int8"):
        Settings.from_env(env(model_dir, precision="fp64"))


def test_settings_tf_session_opt_ins_are_off_by_default_and_reach_load_options(
    model_dir: Path,
) -> None:
    """Issue 24 part 3: SPO_SHORT_CALL_THREADS and SPO_EXTRA_REWRITES, the TF session's opt-ins."""
    default = Settings.from_env(env(model_dir, workers="1"))
    assert default.short_call_threads is False and default.extra_rewrites == ()
    options = default.load_options()
    assert options.short_call_threads is False and options.extra_rewrites == ()
    on = Settings.from_env(
        env(
            model_dir,
            workers="1",
            short_call_threads="on",
            extra_rewrites=" fuse_sibling_dense ,",
        )
    )
    assert on.short_call_threads is True and on.extra_rewrites == ("fuse_sibling_dense",)
    options = on.load_options()
    assert options.short_call_threads and options.extra_rewrites == ("fuse_sibling_dense",)
    assert options.intra_op_threads == on.tf_intra_op_threads and options.problems() == []
    back = Settings.from_json(on.to_json())  # handed to the gunicorn master and its workers
    assert back == on and back.load_options() == options


def test_settings_tf_session_opt_ins_bad_values_are_named_with_the_valid_ones(
    model_dir: Path,
) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env(
            env(
                model_dir,
                short_call_threads="sometimes",
                extra_rewrites="fuse_sibling_dense,fuse_qkv,int8_chain",
                max_texts="0",
            )
        )
    assert info.value.problems == [
        "SPO_SHORT_CALL_THREADS: expected a boolean (1/0, true/false, yes/no, on/off), got "
        "'sometimes'",
        "SPO_EXTRA_REWRITES: unknown rewrite(s) 'fuse_qkv', 'int8_chain'; known: "
        "fuse_sibling_dense",
        "SPO_MAX_TEXTS: must be between 1 and 10000, got 0",
    ]
    with pytest.raises(SettingsError, match="SPO_EXTRA_REWRITES: unknown rewrite"):
        Settings(model_dir=model_dir, extra_rewrites=("qkv",))


@pytest.mark.parametrize(
    ("env", "named", "not_named"),
    [
        ({"SPO_TIMEOUT": "-1"}, "SPO_TIMEOUT", "SPO_REQUEST_TIMEOUT"),
        ({"SPO_MAX_REQUESTS": "-1"}, "SPO_MAX_REQUESTS:", "SPO_MAX_REQUESTS_JITTER"),
    ],
)
def test_settings_an_invalid_setting_is_not_also_blamed_on_the_one_checked_against_it(
    triples_model_dir: Path, env: dict[str, str], named: str, not_named: str
) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"SPO_MODEL_DIR": str(triples_model_dir), **env})
    assert named in str(caught.value) and not_named not in str(caught.value)


def test_settings_a_linked_model_dir_keeps_the_links_name_and_pins_its_target(
    tmp_path: Path, model_dir: Path
) -> None:
    """SPO_MODEL_DIR=/srv/models/current served the target's name (v1, then v2 after the documented
    link switch and reload), so /v1/models/NAME of the old name turned 404."""
    from app.core.settings import DEFAULT_MODEL_DIR

    current = tmp_path / "current"
    current.symlink_to(model_dir)
    settings = Settings.from_env({"SPO_MODEL_DIR": str(current)})
    assert settings.model_table == (("current", current),)
    pinned = settings.pinned()
    assert pinned.model_table == (("current", model_dir.resolve()),)
    assert pinned.model_dir == DEFAULT_MODEL_DIR and pinned.default_model == "current"
    table = Settings.from_env({"SPO_MODELS": f"{current},x={current}"}).model_table
    assert table == (("current", model_dir.resolve()), ("x", model_dir.resolve()))


def test_settings_both_model_variables_are_refused_whatever_they_name(model_dir: Path) -> None:
    """SPO_MODEL_DIR naming the demo's own directory beside SPO_MODELS slipped through (compared
    with the default value, not with what was set)."""
    from app.core.settings import DEFAULT_MODEL_DIR

    for named in (DEFAULT_MODEL_DIR, model_dir):
        with pytest.raises(SettingsError, match="not both") as caught:
            Settings.from_env({"SPO_MODEL_DIR": str(named), "SPO_MODELS": f"m={model_dir}"})
        assert str(caught.value).count("not both") == 1


def test_settings_a_unix_bind_over_a_file_is_refused(model_dir: Path, tmp_path: Path) -> None:
    """gunicorn refused it after the start, in a ValueError traceback ("... is not a socket");
    a socket left by an earlier run is fine (gunicorn replaces it)."""
    import socket

    (tmp_path / "notes").write_text("keep\n")
    with pytest.raises(SettingsError, match=r"SPO_BIND: .*notes exists and is not a socket"):
        Settings.from_env(env(model_dir, bind=f"unix:{tmp_path / 'notes'}"))
    left = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(left))
    assert Settings.from_env(env(model_dir, bind=f"unix:{left}")).bind == f"unix:{left}"
    assert Settings.from_env(env(model_dir, bind=f"unix:{tmp_path / 'new.sock'}"))
