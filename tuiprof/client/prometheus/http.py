"""Prometheus's HTTP API as the console uses it: instant queries, their answers, and why one failed."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Self

import httpx
import msgspec

from tuiprof.errors import BadInputError

QUERY_TIMEOUT_S = 30.0


class PrometheusError(BadInputError):
    """Prometheus could not answer; the message says why and what to do."""


class PrometheusUnreachableError(PrometheusError):
    """Nothing answered at the URL."""


class NotPrometheusError(PrometheusError):
    """Something answered, but not with Prometheus's HTTP API."""


class QueryRejectedError(PrometheusError):
    """Prometheus refused a query (a bad ``--match`` pattern, a server limit)."""


class Labels(msgspec.Struct, gc=False):
    """The labels the console reads (others are skipped while decoding; absent ones are "")."""

    hostname: str = ""
    level: str = ""
    collector: str = ""
    reason: str = ""
    pid: str = ""
    rank: str = ""
    instance: str = ""
    job: str = ""
    job_id: str = ""
    cause: str = ""
    kind: str = ""


class Sample(msgspec.Struct, gc=False):
    # gc=False: ten thousand samples an answer, kept while a refresh lasts, would otherwise
    # make Python's collector walk them again and again (3-4x the decoding time)
    metric: Labels
    value: tuple[float, str]


class _Vector(msgspec.Struct):
    resultType: str
    result: list[Sample]


class _Answer(msgspec.Struct):
    status: str
    data: _Vector | None = None
    errorType: str = ""
    error: str = ""


_decode_answer = msgspec.json.Decoder(_Answer).decode


@dataclass(frozen=True)
class QueryResult:
    """An instant vector: ``evaluated_at`` (the server's clock) and its samples."""

    evaluated_at: float
    samples: list[Sample]


class PrometheusClient:
    """Instant queries against ``url`` (the server's base URL) over one HTTP connection pool."""

    def __init__(self, url: str, timeout: float = QUERY_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        if not re.match(r"https?://[^/]", self.url):
            raise NotPrometheusError(f"--prometheus {url!r}: expected an http:// or https:// URL, "
                                     "such as http://prometheus:9090")
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout)
        self.queries_sent = 0

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self._http.aclose()

    async def query(self, promql: str, at: float | None = None) -> QueryResult:
        """One instant query (POST, so long host lists fit), evaluated ``at`` that time (the server's
        Unix time; None: its now); PrometheusError with the reason."""
        self.queries_sent += 1
        form = {"query": promql} if at is None else {"query": promql, "time": f"{at:.3f}"}
        try:
            reply = await self._http.post("/api/v1/query", data=form)
        except httpx.TimeoutException:
            raise PrometheusUnreachableError(
                f"Prometheus at {self.url} did not answer within {self._http.timeout.read:g} s") from None
        except httpx.HTTPError as exc:
            raise PrometheusUnreachableError(
                f"cannot reach Prometheus at {self.url}: {exc or type(exc).__name__}; "
                "check the URL and that the server runs") from None
        try:
            answer = _decode_answer(reply.content)
        except msgspec.DecodeError:
            kind = reply.headers.get("content-type", "no content type").split(";")[0]
            raise NotPrometheusError(
                f"{self.url} is not a Prometheus HTTP API (POST /api/v1/query gave HTTP "
                f"{reply.status_code}, {kind}); give the server's base URL, such as http://prometheus:9090"
            ) from None
        if answer.status != "success" or answer.data is None:
            raise QueryRejectedError(f"Prometheus at {self.url} refused a query ({answer.errorType}): "
                                     f"{answer.error}")
        if answer.data.resultType != "vector":
            raise NotPrometheusError(f"{self.url} answered an instant query with a {answer.data.resultType}, "
                                     "not a vector; is it a Prometheus HTTP API?")
        evaluated = at if at is not None else answer.data.result[0].value[0] if answer.data.result else time.time()
        return QueryResult(evaluated, answer.data.result)

    async def check(self) -> None:
        """Raise PrometheusError unless the URL answers PromQL (before a console starts)."""
        await self.query("vector(1)")
