"""valvey's pure cores: control loops, interlocks, payload decoding (DESIGN §2)."""
