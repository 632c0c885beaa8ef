"""lsgd's Hydra configs (shipped as the package ``lsgd.conf``). Importing it registers the
configs' OmegaConf resolvers (:mod:`lsgd.config.resolvers`), so every process that composes them can resolve them."""

from lsgd.config.resolvers import register_resolvers

register_resolvers()
