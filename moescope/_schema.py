"""Names shared by the library, the charts and the notebooks.

Axis names are the column names of every long-form frame (``to_frame()``); indices are the
0-based positions in the *original* model, also inside a proxy's manifest.
"""

from __future__ import annotations

LAYER = "layer"
EXPERT = "expert"
CLUSTER = "cluster"
STEP = "step"
TOKEN = "token"
TASK = "task"

SCHEMA_VERSION = 1
