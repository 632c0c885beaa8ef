"""The in-process cluster: many logical workers in one Python process, running the same trainer,
algorithm and communicator code as processes do, over a torch.distributed backend of lsgd's own
(:mod:`.backend`), one worker at a time in a fixed order (:mod:`.scheduler`)."""
