"""The console's data model: immutable snapshots, history, cluster state.

No Textual imports here: the headless commands (`status --json`, `record`) use it too.
"""
