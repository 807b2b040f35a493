"""Graph passes of hotcompile (installed as ``hotcompile.passes``)."""

from hotcompile.passes.rewrite import LayerPlan, layer_name, rewrite

__all__ = ["LayerPlan", "layer_name", "rewrite"]
