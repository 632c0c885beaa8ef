"""The run config: composing it from ``conf/`` (Hydra), its OmegaConf resolvers, and its validation in
the main process before any worker starts."""
