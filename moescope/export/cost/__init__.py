"""Accelerator cost: parameter counts from published dimensions, devices and memory, full vs proxy."""
