"""valvey: the cooling controller (CDU supply temperature, pumps, leak and dew-point protection)."""
