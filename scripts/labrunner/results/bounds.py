"""When a measured throughput is the service's and when it is only a lower bound of it.

Under a closed model the service answers as fast as k6 asks. If k6 ran out of CPU, or the service
left most of its quota unused, something other than the service limited the number: it says the
service can do at least this much, and it enters no ratio between targets (a ratio against k6's
limit measures k6).
"""

from collections.abc import Mapping
from typing import Any

K6_SATURATED = 0.8  # above this share of its CPUs, k6 may be what limits throughput
# Below this share of its quota under a closed model, something else held the service back.
SERVICE_CPU_BOUND = 0.5
CLOSED_EXECUTORS = ("constant-vus", "ramping-vus")


def lower_bound_reason(result: Mapping[str, Any]) -> str | None:
    """Why a closed-model result's throughput is only a lower bound, or None when it is the service's."""
    scenario = result.get("scenario") or {}
    if (scenario.get("load_model") or {}).get("executor") not in CLOSED_EXECUTORS:
        return None
    k6_cpu = (result.get("k6") or {}).get("cpu_utilisation")
    if k6_cpu is not None and k6_cpu > K6_SATURATED:
        return f"k6 used {k6_cpu:.0%} of its CPUs"
    service_cpu = ((result.get("service") or {}).get("usage") or {}).get("cpu_utilisation")
    if service_cpu is not None and service_cpu < SERVICE_CPU_BOUND:
        return f"the service used {service_cpu:.0%} of its quota"
    return None
