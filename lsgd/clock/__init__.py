"""The cluster clock's network model: alpha-beta (LogGP) costs of collectives and messages, wire bytes,
ports, and the per-worker virtual clocks that give ``modeled_time_s``."""
