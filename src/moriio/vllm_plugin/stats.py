"""``KVConnectorStats`` and Prometheus metrics for the moriio connector."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)

from moriio.domain.worker.stats import WorkerStats

COUNTERS = (
    "transfers",
    "succeeded",
    "failed",
    "expired",
    "bytes",
    "descriptors",
    "posts",
    "retries",
    "backpressure_events",
    "lease_refusals",
    "messages_refused",
    "messages_ignored",
    "releases_refused",
    "verdicts_refused",
    "announcements_refused",
    "handoffs_refused",
    "early_blocks_evicted",
    "late_announcements",
    "quarantined_blocks",
    "late_completions",
    "peer_teardowns",
    "handshakes",
    "handshake_failures",
    "expired_leases",
    "rejected_params",
)
SERIES = ("transfer_seconds", "load_seconds")


LOAD_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]


def _empty() -> dict[str, Any]:
    data: dict[str, Any] = dict.fromkeys(COUNTERS, 0)
    for name in SERIES:
        data[name] = []
    data["failures_by_kind"] = {}
    return data


@dataclass
class MoriioKVConnectorStats(KVConnectorStats):
    """Counters summed over workers, plus per-transfer duration series."""

    data: dict[str, Any] = field(default_factory=_empty)

    def reset(self) -> None:
        self.data = _empty()

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        theirs = other.data
        for name in COUNTERS:
            self.data[name] = self.data.get(name, 0) + theirs.get(name, 0)
        for name in SERIES:
            self.data[name] = list(self.data.get(name, ())) + list(theirs.get(name, ()))
        kinds = dict(self.data.get("failures_by_kind", {}))
        for kind, count in theirs.get("failures_by_kind", {}).items():
            kinds[kind] = kinds.get(kind, 0) + count
        self.data["failures_by_kind"] = kinds
        return self

    def reduce(self) -> dict[str, int | float]:
        out: dict[str, int | float] = {name: self.data.get(name, 0) for name in COUNTERS}
        times = sorted(self.data.get("transfer_seconds", ()))
        if times:
            out["transfer_ms_avg"] = round(1e3 * sum(times) / len(times), 3)
            out["transfer_ms_p99"] = round(
                1e3 * times[min(len(times) - 1, int(0.99 * len(times)))], 3
            )
        loads = sorted(self.data.get("load_seconds", ()))
        if loads:
            out["load_ms_p50"] = round(1e3 * loads[len(loads) // 2], 3)
            out["load_ms_p99"] = round(1e3 * loads[min(len(loads) - 1, int(0.99 * len(loads)))], 3)
        for kind, count in self.data.get("failures_by_kind", {}).items():
            out[f"failed_{kind}"] = count
        return out

    def is_empty(self) -> bool:
        return not any(self.data.get(name) for name in COUNTERS) and not any(
            self.data.get(name) for name in SERIES
        )


# Exported counter name -> the :class:`WorkerStats` field it reports.
_WORKER_FIELDS = {
    "transfers": "transfers_started",
    "succeeded": "transfers_succeeded",
    "failed": "transfers_failed",
    "expired": "transfers_expired",
    "bytes": "bytes_moved",
    "descriptors": "descriptors",
    "posts": "posts",
    "retries": "retries",
    "backpressure_events": "backpressure_events",
    "lease_refusals": "lease_refusals",
    "messages_refused": "messages_refused",
    "messages_ignored": "messages_ignored",
    "releases_refused": "releases_refused",
    "verdicts_refused": "verdicts_refused",
    "announcements_refused": "announcements_refused",
    "handoffs_refused": "handoffs_refused",
    "early_blocks_evicted": "early_blocks_evicted",
    "late_announcements": "late_announcements",
    "quarantined_blocks": "quarantined_blocks",
    "late_completions": "late_completions",
    "peer_teardowns": "peer_teardowns",
    "handshakes": "handshakes",
    "handshake_failures": "handshake_failures",
}


class StatsTracker:
    """Turns a worker's cumulative :class:`WorkerStats` into per-interval stats objects."""

    def __init__(self) -> None:
        self._last: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._last_kinds: dict[str, int] = {}
        # Cumulative scheduler-side counts, kept up to date by the scheduler-role connector.
        self.expired_leases = 0
        self.rejected_params = 0

    def collect(self, worker: WorkerStats | None) -> MoriioKVConnectorStats | None:
        """The change since the previous call; ``worker``: a :meth:`WorkerService.take_stats`."""
        if (
            worker is None
            and self.expired_leases == self._last["expired_leases"]
            and self.rejected_params == self._last["rejected_params"]
        ):
            return None  # the scheduler side has nothing new: keep the per-step cost nil
        now = self._cumulative(worker)
        stats = MoriioKVConnectorStats()
        for name in COUNTERS:
            stats.data[name] = now[name] - self._last[name]
        self._last = now
        if worker is not None:
            kinds = dict(worker.failures_by_kind)
            stats.data["failures_by_kind"] = {
                k: v - self._last_kinds.get(k, 0)
                for k, v in kinds.items()
                if v != self._last_kinds.get(k, 0)
            }
            self._last_kinds = kinds
            stats.data["transfer_seconds"] = list(worker.transfer_seconds)
            stats.data["load_seconds"] = list(worker.load_seconds)
        return None if stats.is_empty() else stats

    def _cumulative(self, worker: WorkerStats | None) -> dict[str, int]:
        values = dict.fromkeys(COUNTERS, 0)
        values["expired_leases"] = self.expired_leases
        values["rejected_params"] = self.rejected_params
        if worker is not None:
            for name, attr in _WORKER_FIELDS.items():
                values[name] = getattr(worker, attr)
        return values


class MoriioPromMetrics(KVConnectorPromMetrics):
    """Prometheus counters and a transfer-duration histogram, labelled per engine."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        counter_cls: Any = self._counter_cls
        histogram_cls: Any = self._histogram_cls
        self._counters = {
            name: self._per_engine(
                counter_cls(
                    name=f"vllm:moriio_{name}_total",
                    documentation=f"moriio KV transfer {name.replace('_', ' ')}",
                    labelnames=labelnames,
                )
            )
            for name in COUNTERS
        }
        self._xfer_time = self._per_engine(
            histogram_cls(
                name="vllm:moriio_xfer_time_seconds",
                documentation="Duration of moriio KV transfer batches",
                buckets=[0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0],
                labelnames=labelnames,
            )
        )

        self._load_time = self._per_engine(
            histogram_cls(
                name="vllm:moriio_load_time_seconds",
                documentation=(
                    "Seconds from a request's KV load order to its KV having landed (decode)"
                ),
                buckets=LOAD_BUCKETS,
                labelnames=labelnames,
            )
        )

    def _per_engine(self, metric: Any) -> dict[int, Any]:
        return {idx: metric.labels(*values) for idx, values in self.per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, metric in self._counters.items():
            value = transfer_stats_data.get(name, 0)
            if value:
                metric[engine_idx].inc(value)
        for seconds in transfer_stats_data.get("load_seconds", ()):
            self._load_time[engine_idx].observe(seconds)
        for seconds in transfer_stats_data.get("transfer_seconds", ()):
            self._xfer_time[engine_idx].observe(seconds)
