"""The run config: composing it from ``conf/`` (Hydra), its OmegaConf resolvers, its validation in
the main process before any worker starts, and what ``debug=default`` adapts to each algorithm
(:mod:`lsgd.config.adapt`)."""
