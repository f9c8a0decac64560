"""Prometheus metrics of one frontend (`GET /metrics`, text exposition format).

Synthesis metrics cover every surface (`surface`: webui, gradio_api, pai, openai, batch) by `mode`; the HTTP
counters cover the HTTP routes. The quality-of-service series are by priority class (`priority`: interactive,
default, bulk) and `api` (the surface): streams as a listener hears them (`cosy.frontend.qos.Playback`: first
packet, gaps, underrun, continuous streams), and for every request its queue wait and the LM backend's share
of its time (docs: operations/metrics.md has the formulas).

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
| cosy_queue_waiting_by_priority | priority | waiting requests by class, read at scrape time |
| cosy_stream_first_packet_seconds | priority, api | a stream's request received -> first audio chunk |
| cosy_stream_chunk_gap_seconds | priority, api | between consecutive chunks of a stream |
| cosy_stream_underrun_seconds | priority, api | a finished stream's time its listener waited after it started playing |
| cosy_streams_total, cosy_streams_continuous_total | priority, api | finished streams; those without underrun |
| cosy_stream_audio_seconds_total | priority, api | audio of finished streams |
| cosy_queue_wait_seconds | priority, api | request received by the pool -> a worker took it |
| cosy_backend_share | priority, api | the request's time spent waiting for the LM backends / its time |

Each `Metrics` has its own registry, so several apps in one process (tests) do not collide.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from cosy.errors import error_type
from cosy.frontend.qos import Playback

LATENCY_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)
# a stream's underrun: 0 (continuous) is its own bucket
UNDERRUN_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
SHARE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
QOS_LABELS = ["priority", "api"]


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


class _ByPriorityCollector(Collector):
    """Waiting requests by class, asked of the pool when Prometheus scrapes."""

    _labelnames = ("priority",)  # what the docs' series table shows

    def __init__(self, stats: Callable[[], dict]):
        self.stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("cosy_queue_waiting_by_priority",
                                   "requests waiting for a synthesis worker, by priority class (the queue serves "
                                   "the most urgent class first, then the oldest; a request moves up one class "
                                   "per --priority_aging seconds waited)", labels=self._labelnames)
        for name, n in self.stats().get("waiting_by_priority", {}).items():
            family.add_metric([name], n)
        yield family


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
        q = QOS_LABELS
        self.stream_first_packet = Histogram(
            "cosy_stream_first_packet_seconds", "streams: the request received to its first audio chunk ready "
            "(queue wait included): how long the listener waits before anything plays", q,
            buckets=LATENCY_BUCKETS, registry=r)
        self.chunk_gap = Histogram(
            "cosy_stream_chunk_gap_seconds", "streams: time between consecutive audio chunks' arrivals (t_k - "
            "t_{k-1})", q, buckets=LATENCY_BUCKETS, registry=r)
        self.underrun = Histogram(
            "cosy_stream_underrun_seconds", "finished streams: seconds a listener who starts playing at the first "
            "chunk and plays in real time waits for audio (sum over chunks k >= 2 of max(0, t_k - due_{k-1}), "
            "due_1 = t_1 + d_1, due_k = max(t_k, due_{k-1}) + d_k; d_k: chunk k's audio seconds); 0: continuous",
            q, buckets=UNDERRUN_BUCKETS, registry=r)
        self.streams = Counter("cosy_streams", "streams finished without error", q, registry=r)
        self.continuous = Counter(
            "cosy_streams_continuous", "streams finished without an underrun (continuous-stream ratio: rate of "
            "this / rate of cosy_streams_total)", q, registry=r)
        self.stream_audio = Counter(
            "cosy_stream_audio_seconds", "audio of finished streams, seconds (underrun share: rate of "
            "cosy_stream_underrun_seconds_sum / rate of this)", q, registry=r)
        self.queue_wait = Histogram(
            "cosy_queue_wait_seconds", "every request that reached a worker: seconds from entering the worker "
            "queue to a worker taking it", q, buckets=LATENCY_BUCKETS, registry=r)
        self.backend_share = Histogram(
            "cosy_backend_share", "requests served by LM backends: the seconds the request waited for the "
            "backends' tokens (each LM request sent until its tokens arrive) over the request's seconds "
            "(received to last audio)", q, buckets=SHARE_BUCKETS, registry=r)
        if pool_stats is not None:
            r.register(_PoolCollector(pool_stats, queue_limit))
            r.register(_ByPriorityCollector(pool_stats))

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

    def stream_finished(self, priority: str, api: str, play: Playback) -> None:
        """A stream ended without error: its underrun, whether it was continuous, its audio."""
        self.streams.labels(priority, api).inc()
        self.underrun.labels(priority, api).observe(play.underrun)
        if play.continuous:
            self.continuous.labels(priority, api).inc()
        self.stream_audio.labels(priority, api).inc(play.audio)

    def render(self) -> tuple[bytes, str]:
        """(body, content type) for GET /metrics."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
