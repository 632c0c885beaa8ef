"""Communication: the communicator every algorithm talks through (every byte counted, every operation
clocked), its shared-memory bookkeeping board, blocked-time accounting, topologies and the
point-to-point trace.

The communicator (:mod:`lsgd.comm.communicator`) is made of one part per concern: its counters
(:mod:`lsgd.comm.accounting`), collectives (:mod:`lsgd.comm.collectives`), point-to-point messages
(:mod:`lsgd.comm.point_to_point`) and the clock's settlement (:mod:`lsgd.comm.settlement`); its
operations in flight are handles (:mod:`lsgd.comm.handles`); :mod:`lsgd.comm.process_group` holds
what it needs of torch.distributed beyond its plain calls."""
