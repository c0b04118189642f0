"""Models: read any supported transformers MoE the same way, plus the tiny and embedded models.

``table`` holds the architecture table, ``rules`` the routing rule each row builds from a config,
``view`` the uniform view of MoE layers (``adapt``), ``routers`` the router math; ``loading`` finds
and checks a checkpoint; ``looping``, ``multimodal`` and ``summary`` read particular shapes of
model; ``zoo`` builds tiny random models, ``toy`` is the embedded task-capable model, and
``tasks`` / ``evaluation`` / ``accuracy`` are the verifiable task suite it is scored on.
"""
