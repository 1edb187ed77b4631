"""services.common.metrics batching: what reaches prometheus_client equals observing each value."""

import asyncio

from prometheus_client import Counter, Histogram, Metric

from services.common.metrics import FLUSH_SECONDS, LATENCY_BUCKETS_SECONDS, MetricBatch

# On a bound, between bounds, past the last bound, and zero.
DURATIONS = [0.0, 0.0005, 0.0004, 0.003, 0.1, 0.1000001, 10.0, 11.0, 0.0075]


def histogram(name: str) -> Histogram:
    return Histogram(name, "test", ["route"], buckets=LATENCY_BUCKETS_SECONDS, registry=None)


def values(metric: Histogram | Counter) -> dict[tuple[str, str], float]:
    """(sample name without the metric name, le) -> value; "created" samples left out."""
    family: Metric = next(iter(metric.collect()))
    return {
        (sample.name.removeprefix(family.name), sample.labels.get("le", "")): sample.value
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def test_a_flushed_histogram_equals_one_that_observed_each_value() -> None:
    direct, batched = histogram("direct"), histogram("batched")
    batch = MetricBatch()
    series = batch.histogram(batched.labels("/records"))
    for seconds in DURATIONS:
        direct.labels("/records").observe(seconds)
        series.observe(seconds)
    assert values(batched)[("_count", "")] == 0  # nothing written before the flush

    batch.flush()
    assert values(batched) == values(direct)
    batch.flush()  # a flush with nothing new adds nothing
    assert values(batched) == values(direct)

    series.observe(0.02)
    direct.labels("/records").observe(0.02)
    batch.flush()
    assert values(batched) == values(direct)


def test_a_flushed_counter_adds_what_was_counted() -> None:
    counter = Counter("calls", "test", ["method"], registry=None)
    batch = MetricBatch()
    series = batch.counter(counter.labels("ListRecords"))
    for _ in range(5):
        series.inc()
    assert values(counter)[("_total", "")] == 0
    batch.flush()
    batch.flush()
    assert values(counter)[("_total", "")] == 5


def test_flushing_writes_periodically_and_once_more_at_the_end() -> None:
    counter = Counter("periodic", "test", registry=None)
    batch = MetricBatch()
    series = batch.counter(counter)

    async def serve() -> list[float]:
        seen = []
        async with batch.flushing():
            series.inc()
            await asyncio.sleep(FLUSH_SECONDS * 1.5)
            seen.append(values(counter)[("_total", "")])  # the periodic flush wrote it
            series.inc()
        seen.append(values(counter)[("_total", "")])  # the final flush wrote the rest
        return seen

    assert asyncio.run(serve()) == [1, 2]
