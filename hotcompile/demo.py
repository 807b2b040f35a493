"""The demo: train a small CNN and a small ViT on scikit-learn's bundled digits, plain FP32 vs
``backend="hot"``, and show accuracy, the per-layer plan and the saved-activation bytes.

Everything here is real: the data ships with scikit-learn (1,797 8x8 images of handwritten
digits; fixed 70/30 split), both variants start from the same weights and see the same
batches, and the saved bytes are read off the autograd graph of the compiled models.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F

from hotcompile.backend import HotBackend
from hotcompile.memory import saved_activation_bytes
from hotcompile.passes import LayerPlan
from hotcompile.plantable import format_plans


def load_digits_split(seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Digits as ``[N, 1, 8, 8]`` float tensors in [0, 1], split 70/30 (stratified, fixed)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.3, random_state=seed, stratify=y)
    return xtr, ytr, xte, yte


class DigitsCNN(nn.Module):
    """A small ResNet-flavoured CNN: 3x3 convs, a strided conv, a 1x1 conv, a linear head."""

    def __init__(self, width: int = 32, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(1, width, 3, padding=1)
        self.conv1 = nn.Conv2d(width, width, 3, padding=1)
        self.down = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(2 * width, 2 * width, 3, padding=1)
        self.proj = nn.Conv2d(2 * width, 2 * width, 1)
        self.bn1, self.bn2 = nn.BatchNorm2d(width), nn.BatchNorm2d(2 * width)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x):
        x = F.relu(self.stem(x))
        x = F.relu(self.bn1(self.conv1(x)) + x)
        x = F.relu(self.down(x))
        x = F.relu(self.bn2(self.conv2(x)) + self.proj(x))
        return self.head(x.mean((2, 3)))


class Block(nn.Module):
    """Pre-norm transformer block (SDPA attention, GELU MLP); ``causal`` for decoders."""

    def __init__(self, dim: int, heads: int, mlp: int, causal: bool = False):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, mlp), nn.Linear(mlp, dim)

    def forward(self, x):
        B, N, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).reshape(B, N, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        a = a.transpose(1, 2).reshape(B, N, D)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class DigitsViT(nn.Module):
    """A small ViT: 2x2 patches of the 8x8 image (16 tokens), 2 blocks, mean-pooled head.

    ``img``/``patch``/``mlp_ratio`` size it for other square one-channel images (the MNIST
    task of ``tools/accuracy.py``: a ViT-S-sized model on 28x28 digits, 4x4 patches).
    """

    def __init__(
        self,
        dim: int = 64,
        depth: int = 2,
        heads: int = 4,
        classes: int = 10,
        img: int = 8,
        patch: int = 2,
        mlp_ratio: int = 2,
    ):
        super().__init__()
        self.patch = nn.Conv2d(1, dim, patch, stride=patch)
        self.pos = nn.Parameter(torch.zeros(1, (img // patch) ** 2, dim))
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio * dim) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x).mean(1))


MODELS: dict[str, Callable[[], nn.Module]] = {"cnn": DigitsCNN, "vit": DigitsViT}


@dataclasses.dataclass
class RunResult:
    model: str
    variant: str
    accuracy: float
    final_loss: float
    saved_bytes: int
    seconds: float
    plan: list = dataclasses.field(default_factory=list)


def _compile(model: nn.Module, variant: str, compiler: str, options: dict | None):
    if variant == "fp32":
        plain = {
            "inductor": "inductor",
            "aot_eager": "aot_eager_decomp_partition",
            "eager": "eager",
        }[compiler]
        return torch.compile(model, backend=plain), None
    backend = HotBackend(compiler=compiler, **(options or {}))
    return torch.compile(model, backend=backend), backend


def train(
    name: str,
    variant: str,
    data: tuple[torch.Tensor, ...],
    epochs: int = 12,
    batch_size: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    compiler: str = "aot_eager",
    options: dict | None = None,
    progress: bool = True,
) -> RunResult:
    """Train one model variant (``"fp32"`` or ``"hot"``) and evaluate it on the test split."""
    xtr, ytr, xte, yte = data
    torch.manual_seed(seed)
    model = MODELS[name]()
    compiled, backend = _compile(model, variant, compiler, options)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    steps = epochs * ((len(xtr) + batch_size - 1) // batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=steps)
    gen = torch.Generator().manual_seed(seed)
    bar = _progress(steps, f"{name:>3} {variant:<4}", progress)
    t0 = time.perf_counter()
    loss = torch.tensor(0.0)
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(xtr), generator=gen)
        for i in range(0, len(xtr), batch_size):
            idx = perm[i : i + batch_size]
            loss = F.cross_entropy(compiled(xtr[idx]), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
    seconds = time.perf_counter() - t0
    bar.close()
    saved = saved_activation_bytes(compiled(xtr[:batch_size]), model)
    model.eval()
    with torch.no_grad():
        acc = (compiled(xte).argmax(1) == yte).float().mean().item()
    # the training graphs' plans: the evaluation under no_grad compiled an inference graph
    plan = [p for p in backend.layers if p.path != "inference"] if backend is not None else []
    return RunResult(name, variant, acc, loss.item(), saved, seconds, plan)


class _NoBar:
    def update(self, n: int) -> None: ...
    def set_postfix(self, **kw) -> None: ...
    def close(self) -> None: ...


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is in the demo extra
        return _NoBar()
    return tqdm(total=total, desc=desc, unit="step", leave=True, dynamic_ncols=True)


def plan_table(plan: Iterable[LayerPlan]) -> str:
    """The per-layer plan as a text table, one row per layer and path (the demo's last, smaller
    batch recompiles): the formatter of ``print(hotcompile.plans())``."""
    return format_plans(plan, dedupe=True)


#: epochs per model: HOT's ViT needs ~30 to match FP32 on the 16-token digits grid
DEFAULT_EPOCHS = {"cnn": 8, "vit": 30}


def run_demo(
    models: list[str],
    epochs: int | None = None,
    seed: int = 0,
    compiler: str = "aot_eager",
    progress: bool = True,
) -> list[RunResult]:
    """Train every model in plain FP32 and with HOT; print plan, accuracy and memory."""
    from tabulate import tabulate

    # denormal floats make CPU training steps ~100x slower for stretches of training
    torch.set_flush_denormal(True)
    data = load_digits_split(seed)
    print(
        f"digits: {len(data[0])} train / {len(data[2])} test images (scikit-learn), "
        f"torch {torch.__version__}, compiler={compiler}"
    )
    results = []
    for name in models:
        for variant in ("fp32", "hot"):
            torch._dynamo.reset()
            n_epochs = epochs or DEFAULT_EPOCHS[name]
            results.append(
                train(
                    name, variant, data, n_epochs, seed=seed, compiler=compiler, progress=progress
                )
            )
        print(f"\nHOT plan of the {name.upper()} (per layer):")
        print(plan_table(results[-1].plan))
    rows = []
    for r in results:
        base = next(b for b in results if b.model == r.model and b.variant == "fp32")
        rows.append(
            {
                "model": r.model,
                "variant": "HOT" if r.variant == "hot" else "FP32",
                "test accuracy": f"{100 * r.accuracy:.2f}%",
                "final train loss": f"{r.final_loss:.3f}",
                "saved activations": _fmt_bytes(r.saved_bytes),
                "vs FP32": f"{r.saved_bytes / base.saved_bytes:.2f}x",
                "train time": f"{r.seconds:.1f}s",
            }
        )
    print("\n" + tabulate(rows, headers="keys", tablefmt="github"))
    print(
        "\nsaved activations: bytes the compiled training graph keeps for the backward (one "
        "batch of 64, parameters excluded). Times are CPU reference kernels, not speed claims."
    )
    return results


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
