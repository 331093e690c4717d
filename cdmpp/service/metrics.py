"""Prometheus metrics in the text exposition format, written by hand (no extra dependency).

Per worker process: with several uvicorn workers each keeps its own counters, and a scrape through a
load balancer sees one worker; scrape the workers' ports directly (or run one worker per container).
"""

from __future__ import annotations

import threading
from collections import defaultdict

from cdmpp.service.engine import PredictEngine

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ENDPOINTS = ("/v1/predict", "/v1/network", "/v1/devices", "/v1/models", "/healthz", "/readyz", "/metrics", "/docs",
             "/openapi.json")


class Metrics:
    """Request counts by endpoint and status, a request-latency histogram per endpoint, programs predicted."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.buckets: dict[str, list[int]] = defaultdict(lambda: [0] * (len(LATENCY_BUCKETS) + 1))
        self.sums: dict[str, float] = defaultdict(float)

    @staticmethod
    def endpoint(path: str) -> str:
        """Known paths by name, everything else as "other", so a scanner cannot blow up the label set."""
        return path if path in ENDPOINTS else "other"

    def observe(self, path: str, status: int, seconds: float) -> None:
        ep = self.endpoint(path)
        with self._lock:
            self.requests[(ep, status)] += 1
            counts = self.buckets[ep]
            for i, b in enumerate(LATENCY_BUCKETS):
                if seconds <= b:
                    counts[i] += 1
                    break
            else:
                counts[-1] += 1
            self.sums[ep] += seconds

    def render(self, engine: PredictEngine | None, lanes: tuple = ()) -> str:
        lines: list[str] = []

        def family(name: str, kind: str, help_: str) -> None:
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")

        with self._lock:
            family("cdmpp_requests_total", "counter", "HTTP requests by endpoint and status code.")
            for (ep, status), n in sorted(self.requests.items()):
                lines.append(f'cdmpp_requests_total{{endpoint="{ep}",status="{status}"}} {n}')
            family("cdmpp_request_duration_seconds", "histogram", "Time from request to response, by endpoint.")
            for ep, counts in sorted(self.buckets.items()):
                cum = 0
                for b, c in zip(LATENCY_BUCKETS, counts):
                    cum += c
                    lines.append(f'cdmpp_request_duration_seconds_bucket{{endpoint="{ep}",le="{b}"}} {cum}')
                cum += counts[-1]
                lines.append(f'cdmpp_request_duration_seconds_bucket{{endpoint="{ep}",le="+Inf"}} {cum}')
                lines.append(f'cdmpp_request_duration_seconds_sum{{endpoint="{ep}"}} {self.sums[ep]:.6f}')
                lines.append(f'cdmpp_request_duration_seconds_count{{endpoint="{ep}"}} {cum}')
        if engine is not None:
            s = engine.stats
            for name, kind, help_, value in (
                ("cdmpp_programs_predicted_total", "counter", "Programs predicted.", s.programs_predicted),
                ("cdmpp_prediction_cache_hits_total", "counter",
                 "Programs re-asked for the same device: answered from the prediction cache.", s.prediction_hits),
                ("cdmpp_feature_cache_hits_total", "counter",
                 "Programs not in the prediction cache whose features were cached (no parsing).", s.cache_hits),
                ("cdmpp_feature_cache_misses_total", "counter", "Programs parsed and featurized.", s.cache_misses),
                ("cdmpp_feature_cache_entries", "gauge", "Entries in the predictor's feature cache.",
                 engine.cache_len()),
                ("cdmpp_parse_seconds_total", "counter", "CPU time spent parsing programs.", s.parse_seconds),
                ("cdmpp_featurize_seconds_total", "counter", "Time spent extracting features.", s.featurize_seconds),
                ("cdmpp_model_seconds_total", "counter", "Time spent in the model.", s.model_seconds),
                ("cdmpp_sandbox_workers_ready", "gauge", "Sandbox workers ready (below the configured "
                 "number while killed or crashed ones restart).", engine.sandbox.ready()),
                ("cdmpp_sandbox_worker_restarts_total", "counter",
                 "Sandbox workers killed (deadline, limits, crashes) and replaced.", engine.sandbox.restarts),
            ):
                family(name, kind, help_)
                lines.append(f"{name} {value:.6f}" if isinstance(value, float) else f"{name} {value}")
        for name, kind, help_, get in (
            ("cdmpp_lane_running", "gauge", "Jobs running in each lane (small: cached and small requests; large: "
             "the rest, in chunks).", lambda lane: lane.running()),
            ("cdmpp_lane_queued", "gauge", "Jobs waiting for a thread of each lane.", lambda lane: lane.queued()),
            ("cdmpp_lane_wait_seconds", "gauge", "Estimated wait before a new job of each lane starts (503 when "
             "past the deadline).", lambda lane: round(lane.wait_estimate(), 3)),
            ("cdmpp_lane_refused_total", "counter", "Requests refused at once (503) because they could not start "
             "before their deadline.", lambda lane: lane.refused),
        ):
            if lanes:
                family(name, kind, help_)
                lines += [f'{name}{{lane="{lane.name}"}} {get(lane)}' for lane in lanes]
        return "\n".join(lines) + "\n"
