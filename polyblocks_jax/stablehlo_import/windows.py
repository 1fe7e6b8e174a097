"""Placeholder: filled in by the windows op family."""
