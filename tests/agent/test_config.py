"""agentd's configuration: TOML file, flags, precedence, and what bad input says."""

from __future__ import annotations

import pathlib
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentd.cli import load_config
from agentd.config import FIELDS, AgentConfig, parse_table, read_config_file
from agentd.errors import ConfigError, UsageError


def write(tmp_path: pathlib.Path, text: str) -> pathlib.Path:
    path = tmp_path / "agentd.toml"
    path.write_text(text)
    return path


def test_file_values_are_typed_and_paths_are_relative_to_the_file(tmp_path):
    path = write(tmp_path, """
host = "127.0.0.2"
port = 2001
metrics_port = 2002
interval_ms = 250
token_file = "secret/token"
trace_dir = "/data/traces"
log_format = "json"
json_sink = "metrics.jsonl"
metric_names = "dynolog"
""")
    config = load_config(["--config", str(path)])
    assert config == AgentConfig(
        host="127.0.0.2", port=2001, metrics_port=2002, interval_ms=250,
        token_file=tmp_path / "secret/token", trace_dir=pathlib.Path("/data/traces"),
        log_format="json", json_sink=str(tmp_path / "metrics.jsonl"), metric_names="dynolog",
    )
    assert config.interval_seconds == 0.25


def test_flags_override_the_file(tmp_path):
    path = write(tmp_path, 'port = 2001\ninterval_ms = 250\nlog_format = "json"\n')
    config = load_config(["--config", str(path), "--port", "3001", "--log-format", "text"])
    assert (config.port, config.interval_ms, config.log_format) == (3001, 250, "text")


def test_the_system_config_file_is_read_when_present_and_no_config_is_given(tmp_path, monkeypatch):
    system_file = write(tmp_path, "interval_ms = 5000\n")
    monkeypatch.setattr("agentd.cli.DEFAULT_CONFIG_FILE", system_file)
    assert load_config([]).interval_ms == 5000
    assert load_config(["--interval-ms", "200"]).interval_ms == 200
    other = tmp_path / "other.toml"
    other.write_text("port = 2500\n")
    explicit = load_config(["--config", str(other)])
    assert (explicit.port, explicit.interval_ms) == (2500, 1000)  # only the named file
    monkeypatch.setattr("agentd.cli.DEFAULT_CONFIG_FILE", tmp_path / "absent.toml")
    assert load_config([]) == AgentConfig()


def test_json_sink_dash_means_stdout_in_the_file_too(tmp_path):
    assert load_config(["--config", str(write(tmp_path, 'json_sink = "-"'))]).json_sink == "-"


@pytest.mark.parametrize("text, expected", [
    ('port = "1779"', "port must be an integer, got string '1779'"),
    ("port = 0", "port must be a port number 1-65535, got 0"),
    ("port = 70000", "port must be a port number 1-65535, got 70000"),
    ("metrics_port = true", "metrics_port must be an integer, got boolean True"),
    ("interval_ms = 1.5", "interval_ms must be an integer, got number 1.5"),
    ("interval_ms = 10", "interval_ms must be 100-3600000 milliseconds, got 10"),
    ("host = 127", "host must be a string, got integer 127"),
    ('host = ""', "host must be a non-empty string"),
    ('log_format = "xml"', "log_format must be one of text, json, got 'xml'"),
    ('metric_names = "otel"', "metric_names must be one of tuiprof, dynolog, got 'otel'"),
    ("token_file = [1]", "token_file must be a string, got array [1]"),
    ("[host]\nname = 'x'", "host must be a string, got a table"),
    ("bogus = 1", "unknown key 'bogus'; known keys: host, port,"),
])
def test_bad_values_name_the_file_key_and_rule(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        read_config_file(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert expected in str(caught.value)


def test_malformed_toml_names_the_file_and_position(tmp_path):
    path = write(tmp_path, "port = = 1\n")
    with pytest.raises(ConfigError, match=rf"config file {path} is not valid TOML: .*line 1"):
        read_config_file(path)


def test_missing_and_non_utf8_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file .*No such file or directory"):
        read_config_file(tmp_path / "absent.toml")
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'host = "\xe9"\n')
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        read_config_file(path)


@pytest.mark.parametrize("argv, expected", [
    (["--port", "abc"], "--port must be an integer, got 'abc'"),
    (["--port", "0"], "--port must be a port number 1-65535, got 0"),
    (["--interval-ms", "99"], "--interval-ms must be 100-3600000 milliseconds, got 99"),
    (["--log-format", "yaml"], "--log-format must be one of text, json, got 'yaml'"),
    (["--tls-cert", "a.pem"], "tls_cert and tls_key go together"),
])
def test_bad_flags(argv, expected):
    with pytest.raises(ConfigError) as caught:
        load_config(argv)
    assert expected in str(caught.value)


@pytest.mark.parametrize("argv, expected", [
    (["--bogus"], "unrecognized arguments: --bogus (see agentd --help)"),
    (["--port"], "argument --port: expected one argument"),
    (["--int", "500"], "unrecognized arguments: --int 500"),  # no abbreviations
])
def test_usage_errors(argv, expected):
    with pytest.raises(UsageError) as caught:
        load_config(argv)
    assert expected in str(caught.value)


# ---------------------------------------------------------------- fuzzing

toml_scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1), st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30),
)
toml_values = st.recursive(
    toml_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
keys = st.sampled_from(sorted(FIELDS)) | st.text(min_size=1, max_size=12)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(keys, toml_values, max_size=6))
def test_any_parsed_table_gives_settings_or_one_config_error(table):
    """Whatever a TOML file holds, the parser returns checked settings or one ConfigError line."""
    try:
        settings_ = parse_table(table, source="fuzz.toml", base_dir=pathlib.Path("/etc"))
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith("fuzz.toml: ") and "\n" not in message
        return
    assert set(settings_) <= set(FIELDS)
    config = AgentConfig(**settings_)
    assert 1 <= config.port <= 65535 and 100 <= config.interval_ms <= 3_600_000
    assert config.log_format in ("text", "json")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_file_bytes_give_a_config_or_one_config_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "agentd.toml"
    path.write_bytes(data)
    try:
        settings_ = read_config_file(path)
    except ConfigError as exc:
        assert str(exc)
        return
    # Bytes that parse must have been valid TOML with only known, valid keys.
    assert set(settings_) <= set(tomllib.loads(data.decode()))
