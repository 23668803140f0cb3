"""rackplane: the shared runtime of valvey and racky (no cooling or power logic here)."""

__version__ = "0.1.0"
