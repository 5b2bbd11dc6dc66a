"""File and process safety for a root tool: atomic writes, bounded reads, trusted paths,
terminal-safe text, stop signals and output directories (docs/architecture.md)."""
