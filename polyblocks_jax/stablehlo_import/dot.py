"""Placeholder: filled in by the dot op family."""
