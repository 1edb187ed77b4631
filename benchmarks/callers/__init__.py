"""Floor callers (preset caller): per client library, the same call as the lab's caller with the library
and nothing else: no client class, deadline, latency, error count or size check, only what measuring
needs (services.common.caller_loop, which the lab's callers run too). A lab caller against its floor is
the cost of the lab's client harness (labrunner.callers), as floor servers are of the servers'
(benchmarks/floor/). An import-linter contract keeps the lab's code out of them.
"""
