"""Pure cores of the shared runtime: no sockets, no clocks, no I/O library (DESIGN §2)."""
