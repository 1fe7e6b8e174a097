"""Placeholder: filled in by the convolution op family."""
