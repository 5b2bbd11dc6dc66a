"""A run's own records: its manifest and summary, its directory written as it goes, and its log."""
