"""The one error type a user can cause.

Everything the user can get wrong (a missing path, a file that is not
UTF-8, an anchor that is missing or ambiguous) is raised as
:class:`PatchcraftError` and printed by the CLI as one line with exit
code 2. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class PatchcraftError(Exception):
    """A usage or environment error: one clear line, exit code 2."""
