"""The synthetic store helpers under their old import path (they live in
``collector.synthetic``)."""

from collector.synthetic import Load, model_config, scrape_ok, steady_load, store_recommendation

__all__ = ["Load", "model_config", "scrape_ok", "steady_load", "store_recommendation"]
