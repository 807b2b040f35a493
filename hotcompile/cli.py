"""The ``hotcompile`` command line."""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap


def _demo(args: argparse.Namespace) -> int:
    from hotcompile.demo import run_demo

    models = ["cnn", "vit"] if args.model == "both" else [args.model]
    run_demo(
        models,
        epochs=args.epochs,
        seed=args.seed,
        compiler=args.compiler,
        progress=not args.no_progress,
    )
    return 0


def _build(args: argparse.Namespace) -> int:
    """Build (or find cached) the CUTLASS kernels; say what happened and why."""
    from hotcompile.kernels import cutlass

    if args.check:
        reason = cutlass.unavailable_reason()
        print(
            "hotcompile build: "
            + ("can build here" if reason is None else f"unavailable: {reason}")
        )
        return 0 if reason is None else 1
    reason = cutlass.unavailable_reason()
    if reason is not None:
        print(f"hotcompile build: unavailable: {reason}; the Triton/torch kernels are used")
        return 1
    src, inc = cutlass.csrc_dir(), cutlass.cutlass_include_dirs()
    assert src is not None and inc is not None
    bdir = cutlass.build_dir(src, inc)
    cached = any(bdir.glob(f"{cutlass.NAME}*.so"))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ok = cutlass.build(verbose=args.verbose)
    if not ok:
        print(f"hotcompile build: failed: {cutlass.error()}; the Triton/torch kernels are used")
        return 1
    print(f"hotcompile build: {'cached' if cached else 'built'}: {bdir}")
    for i, name in enumerate(cutlass.config_names()):
        print(f"  config {i}: {name}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hotcompile",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.dedent("""\
            HOT (Hadamard-based Optimized Training) as a torch.compile backend.

            In your code:  torch.compile(model, backend="hot", options={...})
            HOT rewrites the backward of linear and conv2d layers: a Hadamard-quantized
            input gradient (INT4 on image layers, FP8 on text layers), an 8-bit weight
            gradient (through HLA's low-pass on image layers), and a compressed 8-bit copy
            of each layer's input saved instead of the full one (ABC). On a CUDA GPU a layer
            takes HOT only where it measured faster than bf16 (prefer="speed"; "memory" and
            "paper" put it everywhere). The forward stays bf16 unless forward="fp8".
            print(hotcompile.plans()) shows, per layer, the path it took and why."""),
        epilog="Run 'hotcompile demo --help' for the demo's options.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="train a CNN and a ViT on scikit-learn's digits: FP32 vs HOT",
        description=textwrap.dedent("""\
            Train a small CNN and a small ViT on scikit-learn's bundled digits (8x8 images,
            fixed 70/30 split), once with plain torch.compile in FP32 and once with
            backend="hot", from the same initial weights and batches. Prints the per-layer HOT
            plan, the test accuracy of both and the bytes each compiled training graph saves
            for its backward."""),
        epilog=textwrap.dedent("""\
            examples:
              hotcompile demo                       # both models, ~1-2 minutes on 2 CPU cores
              hotcompile demo --model vit --epochs 20
              hotcompile demo --compiler inductor   # generate kernels (slower to compile)"""),
    )
    demo.add_argument(
        "--model",
        choices=["cnn", "vit", "both"],
        default="both",
        help="which model to train (default: both)",
    )
    demo.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="training epochs of every model (default: CNN 8, ViT 30)",
    )
    demo.add_argument("--seed", type=int, default=0, help="seed of init, split and batches")
    demo.add_argument(
        "--compiler",
        choices=["aot_eager", "inductor", "eager"],
        default="aot_eager",
        help="inner compiler for both variants (default: aot_eager, which makes "
        "inductor's saved-tensor decisions without generating code)",
    )
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    demo.set_defaults(func=_demo)
    build = sub.add_parser(
        "build",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="build the optional CUTLASS sm_90a FP8/INT8 GEMMs now (else on first use)",
        description=textwrap.dedent("""\
            Compile the CUTLASS GEMMs of csrc/ (FP8 e4m3 and INT8, warp-specialized TMA +
            wgmma for sm_90a, the per-row/per-column dequantization fused in the epilogue,
            bf16/fp32 out, fp32 accumulation into a gradient) with torch.utils.cpp_extension.

            Needs an H100/H200 (sm_90), a CUDA torch, nvcc (CUDA_HOME) and the CUTLASS headers
            (pip install nvidia-cutlass, or CUTLASS_PATH). The first build takes about 2 minutes
            on 16 CPU cores and 4-5 on 2 (four translation units built in parallel); the result
            is cached in $HOTCOMPILE_CACHE_DIR (default ~/.cache/hotcompile), in a directory
            keyed by a hash of the sources, flags and torch version, so later runs load it in
            a second. The .so alone is enough: copy that directory to a machine with the same
            torch, Python and install paths (csrc/, the CUTLASS headers: the hash covers the
            include paths) and it loads there without a rebuild.
            Without these kernels everything still works: HOT falls back to the Triton and
            torch (cuBLAS) kernels."""),
        epilog=textwrap.dedent("""\
            examples:
              hotcompile build            # build or load from the cache, list the configs
              hotcompile build --check    # only say whether a build is possible here
              hotcompile build --verbose  # show the nvcc/ninja output"""),
    )
    build.add_argument("--verbose", action="store_true", help="show the compiler output")
    build.add_argument(
        "--check", action="store_true", help="only report whether the kernels can be built here"
    )
    build.set_defaults(func=_build)
    for module in ("hotcompile.report", "hotcompile.graphdiff"):
        try:
            mod = importlib.import_module(module)
        except ImportError:  # pragma: no cover - optional tool not present in this build
            continue
        mod.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
