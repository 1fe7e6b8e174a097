"""Placeholder: filled in by the reduce op family."""
