# -*- test-case-name: tests.server.test_http -*-
"""
Prometheus metrics through prometheus_client.

Counters live as plain integers in L{lockservice.server.service.Stats} (cheap on
the hot path) and are read at scrape time by a custom collector; so do the
two histograms' bucket counts (L{Buckets}), counted as grants and releases
happen.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Iterator, List, Optional, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from lockservice.core.election import ROLES
from lockservice.core.sketch import Sketch
from lockservice.server.clusterview import ClusterView, replication
from lockservice.server.monitor import Monitor
from lockservice.server.service import LockService

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Per-key series only for this many of the busiest keys: a bounded number
# of label values whatever the number of keys.
TOP_KEYS = 20

_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 3600)


class Buckets(Collector):
    """
    A histogram counted in a plain list: one C{bisect} and two additions per
    observation, where prometheus_client's C{Histogram.observe} takes a
    lock per bucket it passes (about 2 µs; two per acquire and release on
    a node with C{--http}).  Rendered at scrape time exactly as
    that Histogram renders (C{le} inclusive, cumulative counts).

    @ivar counts: per bucket, the observations up to its bound (and above
        the one before); the last counts those above every bound.
    @ivar sum: the sum of every observation.
    """

    def __init__(self, name: str, documentation: str, bounds: Sequence[float]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = tuple(float(b) for b in bounds)
        self.counts: List[int] = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def collect(self) -> Iterator[Metric]:
        cumulative, buckets = 0, []
        for bound, count in zip(self.bounds + (float("inf"),), self.counts, strict=True):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=buckets,
                                    sum_value=self.sum)


class _StatsCollector(Collector):
    def __init__(self, locks: LockService, cluster: Optional[ClusterView]) -> None:
        self.locks = locks
        self.cluster = cluster

    def collect(self) -> Iterator[Metric]:
        stats = self.locks.stats
        counters = [
            ("grants", "Locks granted (at once or by FIFO hand-off)", stats.grants),
            ("expirations", "Leases that ran out and were reclaimed", stats.expirations),
            ("timeouts", "Acquires answered T (wait ran out)", stats.timeouts),
            ("withdrawals", "Queued acquires withdrawn by their client (C)", stats.withdrawals),
            ("waiters_dropped", "Queued acquires dropped because their connection went away",
             stats.waitersDropped),
            ("redirects", "Requests answered M (not active)", stats.redirects),
            ("errors", "Requests answered E (bad input)", stats.errors),
            ("connections", "Client connections accepted", stats.connections),
            ("merged_grants", "Grants taken from a peer's offer on a heal", stats.merged),
        ]
        for name, doc, value in counters:
            family = CounterMetricFamily(f"lockservice_{name}", doc)
            family.add_metric([], value)
            yield family
        releases = CounterMetricFamily(
            "lockservice_releases", "Releases by outcome", labels=["result"]
        )
        releases.add_metric(["ok"], stats.releasesOk)
        releases.add_metric(["stale"], stats.releasesStale)
        yield releases
        renewals = CounterMetricFamily(
            "lockservice_renewals", "Renewals by outcome", labels=["result"]
        )
        renewals.add_metric(["ok"], stats.renewalsOk)
        renewals.add_metric(["stale"], stats.renewalsStale)
        yield renewals
        rejected = CounterMetricFamily(
            "lockservice_rejected", "Refused by a limit: acquires (too many keys or waiters), "
            "connections (too many), connections closed for a flood of STALE answers",
            labels=["limit"])
        rejected.add_metric(["keys"], stats.rejectedKeys)
        rejected.add_metric(["waiters"], stats.rejectedWaiters)
        rejected.add_metric(["observers"], stats.rejectedObservers)
        rejected.add_metric(["connections"], stats.rejectedConnections)
        rejected.add_metric(["stale_flood"], stats.staleFloods)
        yield rejected
        internal = CounterMetricFamily(
            "lockservice_internal_errors", "Exceptions caught inside the server (bugs; "
            "the first of each kind is logged)")
        internal.add_metric([], stats.internalErrors)
        yield internal
        table = self.locks.table
        for name, doc, value in [
            ("held_keys", "Keys held right now", len(table)),
            ("waiters", "Acquire requests queued right now", table.waiterCount),
            ("shared_grants", "Grants of keys held by readers or as semaphores right now "
             "(such a key counts once in lockservice_held_keys)", table.sharedGrants),
            ("open_connections", "Client connections open right now",
             len(self.locks.connections)),
        ]:
            gauge = GaugeMetricFamily(f"lockservice_{name}", doc)
            gauge.add_metric([], value)
            yield gauge
        role = GaugeMetricFamily("lockservice_role", "1 for this node's current role",
                                 labels=["role"])
        current = self.locks.role
        for r in ROLES:
            role.add_metric([r], 1.0 if r == current else 0.0)
        yield role
        if self.cluster is not None:
            alive = GaugeMetricFamily("lockservice_peers_alive", "Peers heard from recently")
            alive.add_metric([], sum(1 for v in self.cluster.views.values() if v.alive))
            yield alive
            promotions = CounterMetricFamily("lockservice_promotions",
                                             "Times this node became active")
            promotions.add_metric([], self.cluster.promotions)
            yield promotions
            yield from _replicationMetrics(self.cluster)


def _replicationMetrics(cluster: ClusterView) -> Iterator[Metric]:
    """
    The standbys in sync, and the acknowledgement wait's median and 99th
    percentile over the latest writes (see clusterview.replication).
    """
    figures = replication(cluster)
    if figures is None:
        return
    inSync = GaugeMetricFamily("lockservice_in_sync_standbys",
                               "Standbys that client answers wait for now (synchronised)")
    inSync.add_metric([], figures["in_sync_standbys"])
    yield inSync
    wait = GaugeMetricFamily("lockservice_replication_ack_wait_seconds",
                             "How long the latest replication writes waited for every in-sync "
                             "standby's acknowledgement (--replication ack)",
                             labels=["quantile"])
    for quantile, key in (("0.5", "ack_wait_p50_ms"), ("0.99", "ack_wait_p99_ms")):
        if figures[key] is not None:
            wait.add_metric([quantile], figures[key] / 1000)
    yield wait


class _MonitorCollector(Collector):
    """
    Long holds, deadlocks, force-releases, and the busiest keys' statistics.
    """

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        monitor = self.monitor
        for name, doc, value in [
            ("long_holds", "Grants held longer than --warn-hold (each counted once)",
             monitor.longHolds),
            ("deadlocks", "Wait-for cycles detected (each counted once)",
             monitor.graph.detected),
            ("force_releases", "Grants released by an admin (POST /locks/KEY/release)",
             monitor.forceReleases),
        ]:
            family = CounterMetricFamily(f"lockservice_{name}", doc)
            family.add_metric([], value)
            yield family
        for name, doc, value in [
            ("long_holds_now", "Grants held longer than --warn-hold right now",
             monitor.currentLongHolds()),
            ("deadlocks_now", "Wait-for cycles present right now", len(monitor.graph.cycles)),
        ]:
            gauge = GaugeMetricFamily(f"lockservice_{name}", doc)
            gauge.add_metric([], value)
            yield gauge
        top = monitor.keys.top(TOP_KEYS)
        counters = {
            "grants": CounterMetricFamily("lockservice_key_grants",
                                          f"Grants of each of the {TOP_KEYS} busiest keys",
                                          labels=["key"]),
            "timeouts": CounterMetricFamily("lockservice_key_timeouts",
                                            "Acquires of a busy key answered T",
                                            labels=["key"]),
            "expiries": CounterMetricFamily("lockservice_key_expiries",
                                            "Leases of a busy key that ran out",
                                            labels=["key"]),
        }
        hold = Metric("lockservice_key_hold_seconds",
                      "Hold time of a busy key's grants (streaming sketch)", "summary")
        wait = Metric("lockservice_key_wait_seconds",
                      "Wait of a busy key's acquires, granted or timed out", "summary")
        for key, record in top:
            label = key.decode("utf-8", "replace")
            counters["grants"].add_metric([label], record.grants)
            counters["timeouts"].add_metric([label], record.timeouts)
            counters["expiries"].add_metric([label], record.expiries)
            _summary(hold, label, record.hold)
            _summary(wait, label, record.wait)
        yield from counters.values()
        yield hold
        yield wait


def _summary(family: Metric, key: str, sketch: Sketch) -> None:
    for q in (0.5, 0.99):
        value = sketch.quantile(q)
        if value is not None:
            family.add_sample(family.name, {"key": key, "quantile": str(q)}, value)
    family.add_sample(family.name + "_count", {"key": key}, sketch.count)
    family.add_sample(family.name + "_sum", {"key": key}, sketch.total)


class Metrics:
    """
    A registry of this node's metrics; also a LockService observer feeding
    the histograms.
    """

    def __init__(self, locks: LockService, cluster: Optional[ClusterView] = None,
                 monitor: Optional[Monitor] = None) -> None:
        self.locks = locks
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_StatsCollector(locks, cluster))
        if monitor is not None:
            self.registry.register(_MonitorCollector(monitor))
        self.acquireWait = Buckets(
            "lockservice_acquire_wait_seconds",
            "Time from acquire to grant (0 for a free key)", _BUCKETS)
        self.holdTime = Buckets(
            "lockservice_hold_seconds", "Time a grant held its key (release or expiry)",
            _BUCKETS)
        self.registry.register(self.acquireWait)
        self.registry.register(self.holdTime)
        locks.observers.append(self)

    def granted(self, key: bytes, token: int, grantedAt: float, expiresAt: float,
                waited: float, name: Optional[bytes]) -> None:
        self.acquireWait.observe(waited)

    def renewed(self, key: bytes, token: int, grantedAt: float, expiresAt: float) -> None:
        pass  # counted in Stats (lockservice_renewals)

    def dropped(self, key: bytes, token: int, heldFor: float, expired: bool) -> None:
        self.holdTime.observe(heldFor)

    def delayed(self, key: bytes, token: int, until: float) -> None:
        pass  # an expiry, counted as one already

    def delayEnded(self, key: bytes, token: int) -> None:
        pass

    def render(self) -> bytes:
        # The highest token is written by hand: prometheus_client renders
        # every value as a float (1.795999280385865e+15), and a u64 token
        # needs all its digits.
        token = self.locks.table.tokens.last
        return generate_latest(self.registry) + (
            "# HELP lockservice_highest_token Highest fencing token issued or learned\n"
            "# TYPE lockservice_highest_token gauge\n"
            f"lockservice_highest_token {token}\n"
        ).encode()
