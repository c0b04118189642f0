"""Integrations: moescope's trace and faults inside other training engines."""
