"""Placeholder: filled in by the indexing op family."""
