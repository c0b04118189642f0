"""Analyze: traces and other frameworks' logs → findings → a reproduction verdict.

``readers`` turn logs into traces, ``diagnosis`` finds what went wrong, ``verdict`` compares an
original run with a proxy's.
"""
