"""Routing for ML traffic: flow model, two-layer max-min metric and routing policies."""
