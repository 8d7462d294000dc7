"""The one error type a user can cause.

Everything the user can get wrong (a missing path, a file that is not
UTF-8, an anchor that is missing or ambiguous) is raised as
:class:`PatchcraftError` and printed by the CLI as one line with exit
code 2. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

#: Exit codes (docs/usage.md), defined once for the CLI and machine_output.exit_code: done or
#: clean, would change or not verified, a usage or environment error, a bug (traceback
#: kept), interrupted.
OK, CHANGED, USAGE, BUG, INTERRUPTED = 0, 1, 2, 3, 130


class PatchcraftError(Exception):
    """A usage or environment error: one clear line, exit code 2."""
