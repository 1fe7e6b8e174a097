"""Placeholder: filled in by the control_flow op family."""
