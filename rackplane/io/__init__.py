"""I/O adapters of the shared runtime: each the only importer of its library (DESIGN §2)."""
