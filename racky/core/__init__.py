"""racky's pure cores: power, thermal, links, lifecycle, payload decoding (DESIGN §2)."""
