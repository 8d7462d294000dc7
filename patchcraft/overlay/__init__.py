"""The import-time overlay: built and reused (build), safe to serve (check), where it lives (store), and the bootstrap copied into it."""
