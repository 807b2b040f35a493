"""``HotConfig.abc_swiglu``: a fused SwiGLU (``swiglu_hq``) saves FP8 codes of its gate and up
outputs, a scale per token, instead of the outputs themselves — ABC's idea applied to the
largest tensors a Llama block saves (the GPU kernel that reads the codes:
``tests/test_kernels_interpret.py`` on the CPU, ``tests/test_lowering_gpu.py`` on CUDA)."""

from __future__ import annotations

import pytest
import torch
from conftest import rel
from test_abc_recompute import SwiGLU, _run

from hotcompile import HotConfig, HotConfigError
from hotcompile.lowering.hot import swiglu_codes
from hotcompile.quant import dequantize

NATIVE = {"lowering": "native", "prefer": "paper"}

#: what the compiled runs below are fed (both tests' x: the same values)
X_SHAPE = (2, 32, 64)
_RUNS: dict[tuple, tuple[list[torch.Tensor], int]] = {}


def _shared_run(mode: str, compiler: str, options: dict) -> tuple[list[torch.Tensor], int]:
    """``_run(SwiGLU, x, mode, compiler, options)`` on the fixed x, once per session: the
    exact backward and the vision recipe's ``abc_swiglu="fp8"`` step (an inductor compile of
    ~30 s on 2 cores) are runs of both tests below, which only read what it returns."""
    key = (mode, compiler, tuple(sorted(options.items())))
    if key not in _RUNS:
        x = torch.randn(*X_SHAPE, generator=torch.Generator().manual_seed(0))
        _RUNS[key] = _run(SwiGLU, x, mode, compiler, options)
    return _RUNS[key]


def test_codes_are_per_token_e4m3_within_its_rounding():
    """Each element comes back within e4m3's half-ulp (2^-4 relative) or, below e4m3's
    normal range, its subnormal step (2^-9 of the row's scale); a row's max-abs exactly."""
    torch.manual_seed(0)
    t = torch.randn(64, 256, dtype=torch.bfloat16) * torch.logspace(-3, 2, 64)[:, None]
    codes, scale = swiglu_codes(t.reshape(4, 16, 256))
    assert codes.dtype == torch.float8_e4m3fn and codes.shape == (64, 256)
    assert scale.dtype == torch.float32 and scale.shape == (64,)
    back, tf = dequantize(codes, scale), t.float()
    err = (back - tf).abs()
    assert bool((err <= tf.abs() * 2.0**-4 + scale[:, None] * 2.0**-10).all())
    rows = torch.arange(64)
    top = tf.abs().argmax(dim=1)
    torch.testing.assert_close(back[rows, top].abs(), tf[rows, top].abs(), rtol=1e-6, atol=0)


@pytest.mark.slow
def test_the_forward_saves_half_the_bytes_of_gate_and_up():
    """float32 here: gate's and up's outputs (64 tokens x 128) are 4 bytes each, their codes
    1 byte plus a 4-byte scale per token. The down projection's gradients do not read them
    (bit-equal); gate's and up's carry e4m3's rounding of a and b: within a few percent of
    the uncompressed ones', and no further from the exact backward. Inductor's partition
    saves the same with the codes (it recomputes a little more than aot_eager's without)."""
    saved = {}
    # the exact backward is the reference for both compilers (one compile of it, not two);
    # the vision recipe is what "auto" gives this model (no token embedding), spelled out so
    # that the fp8 runs are those of test_downs_codes_come_from_the_swiglu_codes...[vision]
    grads_exact, _ = _shared_run("off", "aot_eager", {"exact": True})
    vision = {**NATIVE, "recipe": "vision"}
    for compiler in ("aot_eager", "inductor"):
        grads_off, saved_off = _shared_run("off", compiler, {**vision, "abc_swiglu": "off"})
        grads_fp8, saved[compiler] = _shared_run("off", compiler, {**vision, "abc_swiglu": "fp8"})
        rows, hidden = 64, 128
        if compiler == "aot_eager":
            gone = 2 * (rows * hidden * 4 - rows * hidden - rows * 4)
            assert saved_off - saved[compiler] == gone
        names = [n for n, _ in SwiGLU().named_parameters()]
        for name, off, fp8, exact in zip(names, grads_off, grads_fp8, grads_exact, strict=True):
            if name.startswith("down"):
                assert torch.equal(off, fp8), name
                continue
            assert rel(fp8, off) < 0.1, name
            err_off, err_fp8 = rel(off, exact), rel(fp8, exact)
            assert err_fp8 < 1.05 * err_off + 0.01, (name, err_off, err_fp8)
    assert saved["inductor"] == saved["aot_eager"]


def test_auto_is_fp8_under_prefer_memory_only():
    assert HotConfig(prefer="memory").abc_swiglu_codes
    assert not HotConfig().abc_swiglu_codes
    assert not HotConfig(prefer="paper").abc_swiglu_codes
    assert not HotConfig(prefer="memory", abc_swiglu="off").abc_swiglu_codes
    assert HotConfig(abc_swiglu="fp8").abc_swiglu_codes
    with pytest.raises(HotConfigError, match="abc_swiglu.*'auto', 'fp8', 'off'"):
        HotConfig.from_options({"abc_swiglu": "int8"})
    with pytest.raises(HotConfigError, match="abc_swiglu.*needs swiglu_hq=True"):
        HotConfig(abc_swiglu="fp8", swiglu_hq=False)
    assert not HotConfig(prefer="memory", swiglu_hq=False).abc_swiglu_codes


def test_under_autocast_the_partitioner_saves_the_codes_not_the_outputs():
    """The Llama's case (bf16 autocast): min-cut doubles the cost of saving a tensor whose
    readers it can fuse, and with an ATen dequantization it saved gate's and up's bf16
    outputs and recomputed the codes in the backward. The codes are read by an opaque op
    (``hotcompile.ops.dequantize_rows``; on CUDA the SwiGLU kernel), so they are what is
    saved — with down's ABC codes, which can no longer be recomputed from the outputs.
    ``prefer="memory"`` (``abc_recompute="unary"`` too): the codes' own computation reads
    the outputs outside the forward's outputs' ancestry; counted as the backward reading
    them, down's codes were tagged for recompute and the bf16 outputs saved again (H100
    Llama, 2026-11-27: the same saved bytes with and without the codes). Since 2026-11-28
    down's codes there are derived from the SwiGLU's codes and recomputed in the backward:
    two codes saved under ``prefer="memory"``, three under ``"paper"``."""
    from test_lowering import SwiGLU as Small
    from test_lowering import saved_by_forward

    outputs, codes = ((80, 64), torch.bfloat16), ((80, 64), torch.float8_e4m3fn)
    for prefer in ("paper", "memory"):
        base = {"lowering": "native", "prefer": prefer, "recipe": "text"}
        off = saved_by_forward({**base, "abc_swiglu": "off"}, True, "cpu", Small)
        fp8 = saved_by_forward({**base, "abc_swiglu": "fp8"}, True, "cpu", Small)
        assert off.count(outputs) == 2 and codes not in off, (prefer, off)
        n_codes = 3 if prefer == "paper" else 2  # gate's, up's (and down's ABC codes)
        assert outputs not in fp8 and fp8.count(codes) == n_codes, (prefer, fp8)
        assert fp8.count(((80,), torch.float32)) == 2, (prefer, fp8)  # a scale per token


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["vision", "text"])
def test_downs_codes_come_from_the_swiglu_codes_and_are_recomputed(recipe):
    """With ``abc_swiglu="fp8"`` and ``abc_recompute="unary"`` the down projection's ABC
    codes are derived from the SwiGLU's saved codes of gate and up (not from their product)
    and recomputed in the backward: the forward saves down's codes no more (the H100 Llama
    saved them, 0.5 GiB, run 39). Gate's and up's gradients do not change; down's weight
    gradient reads codes of the product of the dequantized codes, and stays as close to the
    exact one (vision: within 1%; text, float32 here, FP8 codes against the float32 product:
    within 0.02)."""
    rows, hidden = 64, 128
    opts = {**NATIVE, "abc_swiglu": "fp8", "recipe": recipe}
    grads_exact, _ = _shared_run("off", "aot_eager", {"exact": True})  # both compilers'
    for compiler in ("aot_eager", "inductor"):
        grads_off, saved_off = _shared_run("off", compiler, opts)  # [vision]: the test above's
        grads_unary, saved_unary = _shared_run("unary", compiler, opts)
        kept = rows // 2 if recipe == "vision" else rows  # HLA keeps 8 of 16 token rows
        assert saved_off - saved_unary == kept * hidden + 4, (compiler, saved_off, saved_unary)
        names = [n for n, _ in SwiGLU().named_parameters()]
        for name, off, unary, exact in zip(names, grads_off, grads_unary, grads_exact):
            if name != "down.weight":
                assert torch.equal(off, unary), (compiler, name)
                continue
            err_off, err_unary = rel(off, exact), rel(unary, exact)
            slack = 1.01 * err_off if recipe == "vision" else err_off + 0.02
            assert 0 < rel(unary, off) and err_unary < slack, (compiler, err_off, err_unary)


def test_downs_compression_reads_only_the_swiglu_codes_and_is_tagged(monkeypatch):
    """Down's ABC derived from the SwiGLU's saved codes is one native compression whose only
    inputs are those codes (on CUDA one kernel: the product is made as it is quantized and
    never written), and the joint pass tags all of it ``MUST_RECOMPUTE``. The tag is what
    moves it to the backward on CUDA, where it is a ``triton_op`` that min-cut never
    recomputes by choice (on the CPU min-cut recomputes the ATen anyway, so the saved bytes
    alone would not show a missing tag)."""
    from torch.utils.checkpoint import CheckpointPolicy

    from hotcompile.passes import abc_recompute

    seen: list[tuple[int, bool]] = []
    tag = abc_recompute.tag_abc_recompute
    must = CheckpointPolicy.MUST_RECOMPUTE

    def spy(graph, mode="unary"):
        out = tag(graph, mode)
        codes = abc_recompute._saved_codes_nodes(graph)
        for reads, members, _ in abc_recompute._compressions(graph, codes):
            if len(reads) == 4 and set(reads) <= codes:  # (ca, sa, cb, sb)
                seen.append((len(members), all(n.meta.get("recompute") is must for n in members)))
        return out

    monkeypatch.setattr(abc_recompute, "tag_abc_recompute", spy)
    x = torch.randn(2, 32, 64, generator=torch.Generator().manual_seed(0))
    _run(SwiGLU, x, "unary", "aot_eager", {**NATIVE, "abc_swiglu": "fp8", "recipe": "text"})
    assert seen and all(n > 1 and tagged for n, tagged in seen), seen


def test_the_report_says_the_swiglu_saves_codes():
    from test_lowering import SwiGLU as Small

    from hotcompile.report import report

    opts = {"recipe": "text", "prefer": "memory", "lowering": "native"}
    rows = {r["name"]: r for r in report(Small(), [(2, 8, 32)], opts).to_json()["layers"]}
    assert "FP8 codes (abc_swiglu)" in rows["gate"]["gy_from"], rows["gate"]
    opts["abc_swiglu"] = "off"
    rows = {r["name"]: r for r in report(Small(), [(2, 8, 32)], opts).to_json()["layers"]}
    assert rows["gate"]["gy_from"] == "SwiGLU backward (gate * up)"


class ResidualSwiGLU(SwiGLU):
    """``h + down(silu(gate(h)) * up(h))``: down meets the residual stream, so it is no head
    and takes the FP8 forward (a model's last layer keeps bf16)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(x)
        return h + super().forward(h)


@pytest.mark.slow
def test_lean_fp8_forward_reads_the_swiglu_kernels_operand(monkeypatch):
    """``forward="fp8"`` with ``abc_swiglu="fp8"`` and ``abc_recompute="unary"`` (the lean
    plan): the down projection's FP8 forward takes its operand of ``silu(a)·b`` from the
    SwiGLU's forward (``lowering.hot.swiglu_forward``: on CUDA the kernel that also writes
    a's and b's codes, so the bf16 product is never written), not from a cast of the product
    of its own. The same quantizer of the same values: the step's output and gradients are
    bit for bit those of down casting the product itself."""
    import sys

    from hotcompile import fp8

    rewrite = sys.modules["hotcompile.passes.rewrite"]
    taken, linear = [], fp8.linear

    def spy(*args, **kwargs):
        taken.append(len(args) > 6 and args[6] is not None)
        return linear(*args, **kwargs)

    monkeypatch.setattr(fp8, "linear", spy)
    opts = {**NATIVE, "forward": "fp8", "abc_swiglu": "fp8", "abc_recompute": "unary",
            "recipe": "text", "compiler": "aot_eager"}  # fmt: skip

    def step():
        torch._dynamo.reset()
        taken.clear()
        torch.manual_seed(0)
        model = ResidualSwiGLU()
        with torch.autocast("cpu", torch.bfloat16):
            out = torch.compile(model, backend="hot", options=opts)(torch.randn(2, 32, 64))
        out.float().square().mean().backward()
        return out.detach(), [p.grad for p in model.parameters()], sum(taken)

    out, grads, shared = step()
    assert shared >= 1  # down, the one layer that reads a SwiGLU's product
    monkeypatch.setattr(rewrite, "_fp8_forward_reader", lambda node: False)
    out_own, grads_own, shared_own = step()
    assert shared_own == 0
    assert torch.equal(out, out_own)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_own, strict=True))
