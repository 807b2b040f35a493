"""Graph passes of hotcompile (installed as ``hotcompile.passes``)."""

from hotcompile.passes.abc_recompute import tag_abc_recompute
from hotcompile.passes.rewrite import LayerPlan, layer_name, rewrite

__all__ = ["LayerPlan", "layer_name", "rewrite", "tag_abc_recompute"]
