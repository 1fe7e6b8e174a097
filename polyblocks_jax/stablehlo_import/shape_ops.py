"""Placeholder: filled in by the shape_ops op family."""
