"""Fidelity of a proxy: next-token agreement, task accuracy, routing, and the validity checklist."""
