"""Scripts run inside an engine environment (its Python, not patchcraft's): never imported by patchcraft itself."""
