"""Grafana dashboards as Python source, generated into deploy/grafana/dashboards/."""
