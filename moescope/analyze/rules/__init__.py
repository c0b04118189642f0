"""The rules :func:`moescope.analyze.diagnosis.diagnose` runs, one module per finding family.

``thresholds`` holds the numbers every rule is tuned by, ``series`` reads step series and
running statistics out of a trace; ``nonfinite``, ``gradients``, ``losses``, ``policy`` and
``load`` each turn a trace into the findings of their family.
"""
