"""The cluster clock's network model: alpha-beta (LogGP) costs of collectives and messages, wire bytes,
ports, and the per-worker virtual clocks that give ``modeled_time_s``.

:mod:`lsgd.comm` moves the data and reports what happened to the clock (an operation issued, waited,
a message sent or received, its size, group and link); the clock prices it. Nothing here imports
torch: the analysis (:mod:`lsgd.analysis`) prices what-if links with the same network model.

* :mod:`lsgd.clock.network`: the network model: alpha-beta costs of collectives and messages
  (:func:`~lsgd.clock.network.cost_terms`), the wire bytes each worker sends, a link
  (:class:`~lsgd.clock.network.NetworkModel`), the cluster's links and placement with the what-if
  links (:class:`~lsgd.clock.network.Network`, the network presets' latencies), the emulated link's
  framing (:data:`~lsgd.clock.network.WIRE_FACTOR`);
* :mod:`lsgd.clock.ports`: a worker's egress and ingress ports and their lanes (LogGP,
  :class:`~lsgd.clock.ports.Ports`);
* :mod:`lsgd.clock.worker_clock`: the clock's rules and one worker's virtual clock
  (:class:`~lsgd.clock.worker_clock.Clock`), and a communicator's stream
  (:func:`~lsgd.clock.worker_clock.stream_end`).
"""
