"""Explore: a calibration pass, routing statistics, expert embeddings, and the selection of kept experts.

calibration data → :func:`~moescope.explore.routing.collect_routing` → ``RoutingStats`` →
:func:`~moescope.explore.embeddings.embed_experts` → ``ExpertEmbeddings`` →
:func:`~moescope.explore.clustering.select_experts` → ``Selection``.
"""
