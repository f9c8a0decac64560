"""Prometheus metrics of one frontend (`GET /metrics`, text exposition format).

Synthesis metrics cover every surface (`surface`: webui, gradio_api, pai, openai) by `mode`; the HTTP
counters cover the HTTP routes.

| metric | labels | what |
| --- | --- | --- |
| cosy_http_requests_total | route, method, status | API requests answered (route: its template; 404s: unmatched) |
| cosy_http_errors_total | route, type | API answers >= 400, by error type (rate_limited, not_found, ...) |
| cosy_syntheses_total | surface, mode, outcome | syntheses ended: ok, or the error type |
| cosy_stream_errors_total | surface, mode | syntheses that failed after their first audio was sent |
| cosy_first_packet_seconds | surface, mode | request received -> first audio chunk ready |
| cosy_rtf | surface, mode | real-time factor of a finished request: wall time / audio seconds |
| cosy_audio_seconds_total | surface, mode | audio synthesized |
| cosy_ready_check_seconds | | how long the readiness check (models, LM backend reachability) took |
| cosy_queue_waiting, cosy_queue_limit, cosy_workers, cosy_workers_busy | | the worker pool, read at scrape time |

Each `Metrics` has its own registry, so several apps in one process (tests) do not collide.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from cosy.errors import error_type

LATENCY_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)


class _PoolCollector(Collector):
    """Queue depth and busy workers, asked of the pool when Prometheus scrapes."""

    def __init__(self, stats: Callable[[], dict], limit: Callable[[], int | None]):
        self.stats, self.limit = stats, limit

    def collect(self) -> Iterator[GaugeMetricFamily]:
        s = self.stats()
        yield GaugeMetricFamily("cosy_queue_waiting", "requests waiting for a synthesis worker", s["waiting"])
        yield GaugeMetricFamily("cosy_workers", "synthesis worker processes", s["workers"])
        yield GaugeMetricFamily("cosy_workers_busy", "workers running a job now", s["busy"])
        if (limit := self.limit()) is not None:
            yield GaugeMetricFamily("cosy_queue_limit", "waiting requests past which new ones get 429", limit)


class Metrics:
    def __init__(self, pool_stats: Callable[[], dict] | None = None,
                 queue_limit: Callable[[], int | None] = lambda: None):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("cosy_http_requests", "HTTP API requests answered", ["route", "method", "status"],
                                registry=r)
        self.errors = Counter("cosy_http_errors", "HTTP API error answers", ["route", "type"], registry=r)
        labels = ["surface", "mode"]
        self.syntheses = Counter("cosy_syntheses", "syntheses ended, by outcome", [*labels, "outcome"], registry=r)
        self.stream_errors = Counter("cosy_stream_errors", "syntheses failed after audio was sent", labels,
                                     registry=r)
        self.first_packet = Histogram("cosy_first_packet_seconds", "request received to first audio chunk",
                                      labels, buckets=LATENCY_BUCKETS, registry=r)
        self.rtf = Histogram("cosy_rtf", "wall time / audio duration of finished requests", labels,
                             buckets=RTF_BUCKETS, registry=r)
        self.audio_seconds = Counter("cosy_audio_seconds", "audio synthesized, seconds", labels, registry=r)
        self.ready_check = Histogram("cosy_ready_check_seconds", "duration of the readiness check",
                                     buckets=LATENCY_BUCKETS, registry=r)
        if pool_stats is not None:
            r.register(_PoolCollector(pool_stats, queue_limit))

    def answered(self, route: str, method: str, status: int) -> None:
        self.requests.labels(route, method, str(status)).inc()
        if status >= 400:
            self.errors.labels(route, error_type(status)).inc()

    def finished(self, surface: str, mode: str, wall_seconds: float, audio_seconds: float) -> None:
        self.syntheses.labels(surface, mode, "ok").inc()
        self.audio_seconds.labels(surface, mode).inc(audio_seconds)
        if audio_seconds > 0:
            self.rtf.labels(surface, mode).observe(wall_seconds / audio_seconds)

    def failed(self, surface: str, mode: str, status: int, after_audio: bool) -> None:
        self.syntheses.labels(surface, mode, error_type(status)).inc()
        if after_audio:
            self.stream_errors.labels(surface, mode).inc()

    def render(self) -> tuple[bytes, str]:
        """(body, content type) for GET /metrics."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
