"""Monitoring: a long-lived Prometheus every emulation run registers with, and re-serving."""
