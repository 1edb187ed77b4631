"""What watches a run: Prometheus targets, InfluxDB annotations, the local Prometheus and InfluxDB."""
