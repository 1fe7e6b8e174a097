"""Placeholder: filled in by the sort op family."""
