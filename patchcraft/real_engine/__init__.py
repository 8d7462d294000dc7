"""The real engines, run on this machine's CPU: the proof standard for what a draft is fed.

One interface for both engines (:mod:`.dialects`): each engine says how its
environment is built (:mod:`.environments`), which tiny targets it can run,
the script that runs it inside that environment (``inenv/``, never imported
by patchcraft's own process) and what patchcraft predicts for the same
platform and config. :mod:`.check` runs a case unpatched or through
``patchcraft run`` and compares what the engine's draft received with the
prediction.
"""
