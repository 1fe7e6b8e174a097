"""Placeholder: filled in by the bit_ops op family."""
