"""LightPipe test suite."""
