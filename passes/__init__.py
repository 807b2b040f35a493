"""Graph passes of hotcompile (installed as ``hotcompile.passes``)."""

from hotcompile.passes import family
from hotcompile.passes.abc_recompute import tag_abc_recompute, tag_recompute
from hotcompile.passes.layout import pin_kernel_layouts, realize_kernel_inputs
from hotcompile.passes.rewrite import LayerPlan, layer_name, rewrite

__all__ = [
    "LayerPlan",
    "family",
    "layer_name",
    "pin_kernel_layouts",
    "realize_kernel_inputs",
    "rewrite",
    "tag_abc_recompute",
    "tag_recompute",
]
