"""Export: cut a proxy checkpoint from a model and a selection, then measure what it kept.

In memory or over safetensors shards (``streaming``); fidelity and the validity checklist
(``fidelity``); optional healing; the accelerator cost model (``cost``); the fidelity study's tables.
"""
