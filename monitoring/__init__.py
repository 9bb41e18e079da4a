"""trainstack's monitoring: the metrics exporter (`exporter/`), Prometheus rules and Grafana dashboards."""
