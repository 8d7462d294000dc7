"""The field's hand fix (DOMAIN.md, "The hand fix users apply today"), as edits of a real file's text.

Each edit is the exact line the field's sed changed, replaced by what sed
made of it; :func:`sed_fix` refuses a file where a line is not there once,
so a test never runs on a file the fix did not really change.
"""

from __future__ import annotations

from pathlib import Path

INIT = (
    "        self.layers_to_capture = []\n",
    "        self.layers_to_capture = []\n        self.capture_embedding_for_eagle3 = False\n",
)
SETTER = (
    "            self.model.layers_to_capture = [val + 1 for val in layer_ids]\n",
    "            self.model.capture_embedding_for_eagle3 = (-1 in layer_ids)\n"
    "            self.model.layers_to_capture = [val + 1 for val in layer_ids if val >= 0]\n",
)
FORWARD = (
    "        aux_hidden_states = []\n",
    "        aux_hidden_states = []\n"
    "        # Capture embedding output for EAGLE3 if requested (layer_id=-1)\n"
    "        if self.capture_embedding_for_eagle3:\n"
    "            # At this point hidden_states = embed_output, residual = None\n"
    "            aux_hidden_states.append(hidden_states.clone() if residual is None else hidden_states + residual)\n",
)
#: The three sed edits; the partial fix is the first alone.
FULL = (INIT, SETTER, FORWARD)
PARTIAL = (INIT,)


def sed_fix(path: Path, edits: tuple[tuple[str, str], ...] = FULL) -> None:
    """Make the field's sed edits to ``path`` in place (each target line must be there exactly once)."""
    text = path.read_text(encoding="utf-8")
    for old, new in edits:
        assert text.count(old) == 1, f"{path}: {old!r} is there {text.count(old)} times"
        text = text.replace(old, new)
    path.write_text(text, encoding="utf-8")
