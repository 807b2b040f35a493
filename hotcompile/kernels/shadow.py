"""Shadow checking: every CUDA kernel call of the HOT ops also runs the reference.

The kernels are tested bit-exact against the CPU reference on synthetic shapes; a kernel bug
that only shows on a real model's shapes or in reused memory (a pad column that is never
written, say) escapes those tests and surfaces as a NaN many layers later. With shadowing on,
each call of ``hq_grad_input``, ``hla_grad_weight``, ``hla_grad_weight_dense`` and
``abc_compress`` on CUDA runs the registered kernel *and* the op's pure-PyTorch reference on
the same inputs, and records per layer the relative error of the kernel's result against the
reference's and whether either had non-finite values. With deterministic rounding (``nearest``,
``pseudo_stochastic``) the two differ only by float rounding order (relative error ~1e-3 in
bf16), so anything larger names the layer and op at fault::

    from hotcompile.kernels import shadow
    with shadow.enabled():
        loss = compiled(x); loss.backward()
    print(shadow.table())

It syncs the device and doubles the backward's work: a debugging aid, not for training runs or
CUDA-graph capture. The calls run inside the compiled backward (the ops are opaque to
inductor), so a ``torch.compile``-d model is checked as it trains.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

import torch

from hotcompile import lqs, ops

#: relative error above which a call is reported as a mismatch in :func:`table`
TOLERANCE = 2e-2


@dataclasses.dataclass
class Record:
    """The worst call of one (layer, op) pair."""

    layer: str
    op: str
    shape: str
    calls: int = 0
    max_rel_err: float = 0.0
    kernel_nonfinite: int = 0
    reference_nonfinite: int = 0
    kernel_max_abs: float = 0.0
    reference_max_abs: float = 0.0
    #: per tensor input, "non-finite count / largest finite |value|", of the worst call: says
    #: whether a non-finite result was made by this op or came in with its inputs
    inputs: str = ""

    @property
    def bad(self) -> bool:
        return self.max_rel_err > TOLERANCE or self.kernel_nonfinite > self.reference_nonfinite


_records: dict[tuple[str, str], Record] = {}
_active = False


def _stats(t: torch.Tensor) -> str:
    t = t.detach().float()
    finite = torch.isfinite(t)
    top = torch.where(finite, t, 0).abs().max().item() if t.numel() else 0.0
    return f"{int((~finite).sum().item())}/{top:.3g}"


def _compare(
    layer: str,
    op: str,
    shape: str,
    k: torch.Tensor,
    r: torch.Tensor,
    inputs: tuple[torch.Tensor, ...] = (),
) -> None:
    k, r = k.detach().float(), r.detach().float()
    kf, rf = torch.isfinite(k), torch.isfinite(r)
    both = kf & rf
    diff = torch.where(both, k - r, 0.0).norm().item()
    ref_norm = torch.where(both, r, 0.0).norm().item()
    rel = diff / ref_norm if ref_norm > 0 else (0.0 if diff == 0 else float("inf"))
    rec = _records.setdefault((layer, op), Record(layer, op, shape))
    rec.calls += 1
    if rel >= rec.max_rel_err or (not kf.all() and not rec.inputs):
        rec.max_rel_err, rec.shape = max(rel, rec.max_rel_err), shape
        rec.inputs = " ".join(_stats(t) for t in inputs if isinstance(t, torch.Tensor))
    rec.kernel_nonfinite = max(rec.kernel_nonfinite, int((~kf).sum().item()))
    rec.reference_nonfinite = max(rec.reference_nonfinite, int((~rf).sum().item()))
    rec.kernel_max_abs = max(rec.kernel_max_abs, torch.where(kf, k, 0).abs().max().item())
    rec.reference_max_abs = max(rec.reference_max_abs, torch.where(rf, r, 0).abs().max().item())


def _shape(*ts: torch.Tensor) -> str:
    return " ".join("×".join(map(str, t.shape)) for t in ts)


def _wrap_hq(kernel: Callable) -> Callable:
    def run(gy, w, bits, scaling, rounding, weight_scale, block, layer, key, check):
        # resolve LQS / warm-up once (it advances the layer's state), then hand the kernel
        # and the reference the same resolved quantizer, without the key
        s, b = lqs.resolve(key, scaling, gy, bits, block)
        out = kernel(gy, w, b, s, rounding, weight_scale, block, layer, "", check)
        if s != "exact":
            ref = ops.hq_grad_input._init_fn(
                gy, w, b, s, rounding, weight_scale, block, layer, "", False
            )
            _compare(layer, f"hq_grad_input[{s}, INT{b}]", _shape(gy, w), out, ref, (gy, w))
        return out

    return run


def _wrap_hla(kernel: Callable, name: str) -> Callable:
    def run(*args):
        out = kernel(*args)
        ref = getattr(ops, name)._init_fn(*args)
        layer = args[-2]
        _compare(layer, name, _shape(args[0], args[1]), out, ref, args)
        return out

    return run


def _wrap_abc(kernel: Callable) -> Callable:
    def run(x, grid_w, rows, block, bits, rounding):
        codes, scale = kernel(x, grid_w, rows, block, bits, rounding)
        rc, rs = ops.abc_compress._init_fn(x, grid_w, rows, block, bits, rounding)
        # no layer name reaches abc_compress: key the record by shape
        k, r = codes.float() * scale, rc.float() * rs
        _compare("", "abc_compress codes·scale", _shape(x), k, r, (x,))
        return codes, scale

    return run


def enable() -> None:
    """Wrap the registered CUDA kernels (registering them first) with shadow checks."""
    global _active
    from hotcompile import kernels

    if _active:
        return
    if not kernels.register():
        raise RuntimeError("shadow checking needs the CUDA kernels (CUDA and Triton)")
    wrappers = {"hq_grad_input": _wrap_hq, "abc_compress": _wrap_abc}
    kernels.install(
        {
            name: wrappers[name](fn) if name in wrappers else _wrap_hla(fn, name)
            for name, fn in kernels.cuda_kernels().items()
        }
    )
    _active = True


def disable() -> None:
    """Back to the plain kernels (the records stay until :func:`clear`)."""
    global _active
    from hotcompile import kernels

    if not _active:
        return
    kernels.install(kernels.cuda_kernels())
    _active = False


@contextlib.contextmanager
def enabled() -> Iterator[None]:
    enable()
    try:
        yield
    finally:
        disable()


def clear() -> None:
    _records.clear()


def records() -> list[Record]:
    """Every (layer, op) seen, worst first: mismatches, then calls whose kernel output had
    non-finite values, then by relative error."""
    return sorted(_records.values(), key=lambda r: (not r.bad, -r.kernel_nonfinite, -r.max_rel_err))


def table(limit: int | None = None) -> str:
    """A markdown table of :func:`records` (mismatches flagged)."""
    rows = records()[:limit]
    lines = [
        "| layer | op | shape (worst call) | calls | rel. error | non-finite kernel/ref | "
        "max abs kernel/ref | inputs: non-finite/max abs | |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.layer or '-'} | {r.op} | {r.shape} | {r.calls} | {r.max_rel_err:.2e} | "
            f"{r.kernel_nonfinite}/{r.reference_nonfinite} | "
            f"{r.kernel_max_abs:.3g}/{r.reference_max_abs:.3g} | {r.inputs} | "
            f"{'MISMATCH' if r.bad else ''} |"
        )
    return "\n".join(lines)
