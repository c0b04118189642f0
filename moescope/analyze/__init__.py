"""Analyze: traces and other frameworks' logs → findings → a reproduction verdict.

``readers`` turn logs into traces, ``diagnosis`` finds what went wrong, ``verdict`` compares an
original run with a proxy's (with their healthy runs as baseline, when given); ``baseline`` judges
the fidelity study's stored comparisons so; ``log_diagnosis`` does the three for files, as
``moescope diagnose`` does (each run of a log that holds several pasted one after another).
"""
