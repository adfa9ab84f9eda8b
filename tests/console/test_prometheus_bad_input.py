"""Bad input to the Prometheus fleet view: one line saying what to do, exit status 2, no traceback."""

from __future__ import annotations

import contextlib
import http.server
import sys
import threading
from collections.abc import Iterator

import pytest

from testkit.ports import free_port
from tuiprof.cli import main


@contextlib.contextmanager
def web_page() -> Iterator[str]:
    """A web server that is not Prometheus: every path is an HTML 404 page."""
    class NotFound(http.server.BaseHTTPRequestHandler):
        def _page(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))  # the query, unread otherwise
            page = b"<html><body>not here</body></html>"
            self.send_response(404)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        do_GET = do_POST = _page

        def log_message(self, *_: object) -> None:
            pass

    class Server(http.server.ThreadingHTTPServer):
        def handle_error(self, request: object, client_address: object) -> None:
            # a client that hung up once it had its answer is no error of this page; anything else is
            if not isinstance(sys.exc_info()[1], ConnectionError):
                super().handle_error(request, client_address)  # type: ignore[arg-type]

    server = Server(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert captured.out == ""
    return lines[0]


@pytest.mark.parametrize("command", [["status"], []], ids=["status", "console"])
def test_unreachable_url(capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    line = one_line_error(capsys, [*command, "--prometheus", url])
    assert f"cannot reach Prometheus at {url}" in line and "check the URL" in line


@pytest.mark.parametrize("command", [["status"], []], ids=["status", "console"])
def test_not_a_prometheus_url(capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    with web_page() as url:
        line = one_line_error(capsys, [*command, "--prometheus", url])
    assert f"{url} is not a Prometheus HTTP API (POST /api/v1/query gave HTTP 404, text/html)" in line


def test_url_without_scheme(capsys: pytest.CaptureFixture[str]) -> None:
    line = one_line_error(capsys, ["status", "--prometheus", "prometheus:9090"])
    assert "expected an http:// or https:// URL" in line


@pytest.mark.parametrize("command", [["status"], []], ids=["status", "console"])
def test_bad_regex(capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    line = one_line_error(capsys, [*command, "--prometheus", "http://127.0.0.1:9", "--match", "gpu-(node"])
    assert "--match 'gpu-(node' is not a regular expression" in line


def test_match_needs_prometheus(capsys: pytest.CaptureFixture[str]) -> None:
    assert "give --prometheus URL too" in one_line_error(capsys, ["status", "--match", "gpu.*"])


def test_match_and_hosts_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    line = one_line_error(capsys, ["status", "--prometheus", "http://127.0.0.1:9", "--match", "a.*", "b1"])
    assert "either --match REGEX or the hosts" in line


@pytest.mark.parametrize(("argv", "expected"), [
    (["--label", "job=train"], "job is not free"),
    (["--label", "hostname=x"], "exported_hostname"),
    (["--label", "9lives=x"], "expected NAME=VALUE"),
    (["--label", "cluster"], "expected NAME=VALUE"),
    (["--metrics-port", "0"], "--metrics-port 0: expected 1-65535"),
    (["--output", "/nonexistent/dir/targets.json"], "cannot write /nonexistent/dir/targets.json"),
])
def test_prometheus_targets_bad_input(capsys: pytest.CaptureFixture[str], argv: list[str], expected: str) -> None:
    assert expected in one_line_error(capsys, ["prometheus-targets", "n1", *argv])


def test_prometheus_targets_needs_hosts(capsys: pytest.CaptureFixture[str]) -> None:
    assert "no hosts" in one_line_error(capsys, ["prometheus-targets"])
