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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hotcompile",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.dedent("""\
            HOT (Hadamard-based Optimized Training) as a torch.compile backend.

            In your code:  torch.compile(model, backend="hot", options={...})
            The forward stays full precision; the backward of every linear/conv2d layer runs
            HOT: an INT4 Hadamard-quantized input gradient, an HLA + INT8 weight gradient,
            and the forward saves an INT8 low-pass activation instead of the full one."""),
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
