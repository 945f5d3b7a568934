"""Outputs: what reads the core's snapshots: the Prometheus collector, its HTTP endpoint, the InfluxDB writer."""
