"""A whole-tree run: its records, one file's patch, the worker pool, the extra rows, the result and preflight caches, diffs, hand edits. Never prints."""
