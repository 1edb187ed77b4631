"""The label set every scenario's series carry, and where k6 writes its samples.

The same names are the k6 tags, the Prometheus target labels and the InfluxDB annotation
tags, so one Grafana variable filters all of them (docs/CONTRACTS.md).
"""

from labrunner.model.scenario import Scenario, churn_name

# The InfluxDB 1.x database k6 writes to; influxdb/, compose and Grafana's datasource name it too.
INFLUXDB_DATABASE = "myk6db"


def scenario_labels(run_id: str, scenario: Scenario) -> dict[str, str]:
    """run, scenario, target, protocol, profile, connection model ("10x1": connections x streams),
    churn ("never", or the calls a connection carries) and compression ("identity", "gzip"): what
    identifies a scenario's samples."""
    return {
        "run": run_id,
        "scenario": scenario.id,
        "target": scenario.target.name,
        "protocol": scenario.target.protocol,
        "profile": scenario.profile.name,
        "connections": scenario.connection_model,
        "churn": churn_name(scenario.churn),
        "compression": scenario.compression,
    }
