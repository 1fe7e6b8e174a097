"""Placeholder: filled in by the custom_call op family."""
