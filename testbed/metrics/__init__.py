"""Metrics: a real Prometheus server run by LightPipe, its HTTP query API, agreement."""
