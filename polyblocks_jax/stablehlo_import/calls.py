"""Placeholder: filled in by the calls op family."""
