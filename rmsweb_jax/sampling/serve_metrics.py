"""ServeMetrics: what a ChatServer exposes at GET /metrics, in Prometheus' text format (prometheus_client).

Each server has its own registry (a test process runs several servers; the global one would merge them).
Series: chat requests by HTTP status, prompt and completion tokens, generations run, the queue depth and
requests in progress (read when scraped), a request latency histogram, and XLA compilations. Compilations
are counted from JAX's own monitoring event for each backend compile, so they are the process's (any
compile, by the server or not) since the first ServeMetrics was made: the number a warm-up should hold still.
"""
from __future__ import annotations

import threading
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # one per XLA compilation
# Seconds: a cached tiny request takes milliseconds, a first 8B request at a new shape a minute.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class _CompileCounter:
    """Counts JAX backend compilations from the moment it is started (once per process)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._count = 0
        self._started = False

    def start(self) -> None:
        with self._lock:
            if not self._started:
                import jax  # here: the server's flags and --help load without JAX
                jax.monitoring.register_event_duration_secs_listener(self._on_event)
                self._started = True

    def _on_event(self, event: str, duration: float, **kwargs) -> None:
        if event == COMPILE_EVENT:
            with self._lock:
                self._count += 1

    @property
    def count(self) -> int:
        with self._lock:
            return self._count


COMPILES = _CompileCounter()


def compile_count() -> int:
    """Returns the XLA compilations this process ran since a ServeMetrics was first made (0 before)."""
    return COMPILES.count


class _CompileCollector:
    def collect(self):
        yield CounterMetricFamily("rmsweb_serve_xla_compiles", "XLA compilations in this process (all of them, "
                                  "since the server started)", value=COMPILES.count)


class ServeMetrics:
    """A server's Prometheus series; `queue_depth` and `in_progress` are read at each scrape."""

    def __init__(self, queue_depth: Callable[[], int], in_progress: Callable[[], int]):
        COMPILES.start()
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("rmsweb_serve_requests", "Chat-completion requests answered, by HTTP status",
                                ["status"], registry=registry)
        self.prompt_tokens = Counter("rmsweb_serve_prompt_tokens", "Prompt tokens of answered requests",
                                     registry=registry)
        self.completion_tokens = Counter("rmsweb_serve_completion_tokens", "Tokens generated for answered requests",
                                         registry=registry)
        self.generations = Counter("rmsweb_serve_generations", "Batched generations run (requests share them)",
                                   registry=registry)
        self.latency = Histogram("rmsweb_serve_request_latency_seconds", "Chat-completion request latency, from "
                                 "the body read to the last byte written", buckets=LATENCY_BUCKETS, registry=registry)
        Gauge("rmsweb_serve_queue_depth", "Requests queued for the next generation", registry=registry
              ).set_function(queue_depth)
        Gauge("rmsweb_serve_requests_in_progress", "Requests being read, queued or generated", registry=registry
              ).set_function(in_progress)
        registry.register(_CompileCollector())

    def observe(self, status: int, prompt_tokens: int, completion_tokens: int, latency_s: float) -> None:
        """Counts one answered chat request."""
        self.requests.labels(status=str(status)).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.completion_tokens.inc(completion_tokens)
        self.latency.observe(latency_s)

    def text(self) -> bytes:
        """Returns the exposition text of every series."""
        return generate_latest(self.registry)
