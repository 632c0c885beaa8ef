"""lsgd's Hydra configs (shipped as the package ``lsgd.conf``). Importing it registers the configs'
OmegaConf resolvers (:mod:`lsgd.config.resolvers`) and the typed configs' schemas
(:mod:`lsgd.config.schemas`), so every process that composes them can resolve them."""

from lsgd.config.resolvers import register_resolvers
from lsgd.config.schemas import register_schemas

register_resolvers()
register_schemas()
