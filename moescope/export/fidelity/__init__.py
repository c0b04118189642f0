"""Fidelity of a proxy: next-token agreement, task accuracy, routing, and the validity checklist."""

CAPABILITY_THRESHOLD = 0.8
"""The accuracy ratio (proxy / original) the checklist's capability check asks for by default,
and the default target of a capability-targeted export (``ExportConfig.min_capability``)."""
