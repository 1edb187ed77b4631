"""Code shared by every protolab service: settings, the record pool, cgroups, metrics, workers."""
