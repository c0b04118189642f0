"""Display: charts as pure functions of results, widgets built from them, and notebook set-up.

Nothing here touches a model: every function reads a result the other stages computed.
"""
