"""patchcraft: structural, idempotent EAGLE-3 embedding-capture patches for SGLang."""

from __future__ import annotations

__version__ = "0.1.0"

#: The comment every inserted statement starts with; ``revert`` keys on it.
MARKER = "# patchcraft:"
