"""racky: the rack power and infrastructure manager."""
