"""The embedded toy model (placeholder)."""
