"""Models: read any supported transformers MoE the same way, plus the tiny and embedded models.

``arch`` holds the architecture table and the uniform view of MoE layers; ``routers`` the router
math; ``loading`` finds and checks a checkpoint; ``looping``, ``multimodal`` and ``summary`` read
particular shapes of model; ``zoo`` builds tiny random models, ``toy`` is the embedded task-capable
model, and ``tasks`` / ``evaluation`` / ``accuracy`` are the verifiable task suite it is scored on.
"""
