"""LightPipe: emulation and simulation testbed for pipeline-parallel training across optical DCs."""

__version__ = "0.1.0"
