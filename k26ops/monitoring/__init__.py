"""`k26ops monitoring`: Prometheus and Grafana files for the selected hosts, from the inventory.

- `metrics.py`: every metric name the dashboard and the alerts use, and where each
  name was seen (the real engine's recorded /metrics, or read from its source).
- `prometheus.py`: scrape config (file_sd targets: each engine's /metrics, the DCGM
  exporter, the gateway; the api key in a credentials file), recording and alert rules.
- `grafana.py`: the dashboard, and the metric names it uses (checked in tests).
"""
