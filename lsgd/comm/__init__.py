"""Communication: the communicator every algorithm talks through (every byte counted, every operation
clocked), its shared-memory bookkeeping board, blocked-time accounting, topologies and the
point-to-point trace."""
