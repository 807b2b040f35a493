"""hotcompile.kernels.shadow's comparison (CPU): a kernel equal to the reference is clean, a
wrong or non-finite one is flagged, and LQS state advances once per call (not twice)."""

from __future__ import annotations

import torch

from hotcompile import lqs, ops
from hotcompile.kernels import shadow

ARGS = (4, "per_token", "pseudo_stochastic", "sawb", 16, "blocks.0.fc1", "", False)


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(64, 48, generator=g), torch.randn(48, 32, generator=g) * 0.05


def test_reference_as_kernel_is_clean():
    shadow.clear()
    run = shadow._wrap_hq(ops.hq_grad_input._init_fn)
    gy, w = _inputs()
    out = run(gy, w, *ARGS)
    assert torch.equal(out, ops.hq_grad_input._init_fn(gy, w, *ARGS))
    (rec,) = shadow.records()
    assert rec.layer == "blocks.0.fc1" and rec.calls == 1 and rec.max_rel_err == 0
    assert not rec.bad and "MISMATCH" not in shadow.table()


def test_wrong_and_nonfinite_kernels_are_flagged():
    shadow.clear()
    gy, w = _inputs()

    def off_by_a_bit(*a):
        return ops.hq_grad_input._init_fn(*a) * 1.1

    def nan_row(*a):
        out = ops.hq_grad_input._init_fn(*a).clone()
        out[3] = float("nan")
        return out

    shadow._wrap_hq(off_by_a_bit)(gy, w, *ARGS)
    args2 = ARGS[:5] + ("blocks.0.fc2",) + ARGS[6:]
    shadow._wrap_hq(nan_row)(gy, w, *args2)
    recs = {r.layer: r for r in shadow.records()}
    assert recs["blocks.0.fc1"].bad and abs(recs["blocks.0.fc1"].max_rel_err - 0.1) < 1e-4
    assert recs["blocks.0.fc2"].bad and recs["blocks.0.fc2"].kernel_nonfinite == 32
    assert shadow.table().count("MISMATCH") == 2


def test_lqs_state_advances_once_per_call():
    shadow.clear()
    lqs.reset()
    key = "shadow-test"
    lqs.state(key, name=key, calibration_steps=2)
    gy, w = _inputs()
    run = shadow._wrap_hq(ops.hq_grad_input._init_fn)
    args = (4, "lqs", "pseudo_stochastic", "sawb", 16, "l", key, False)
    for _ in range(3):
        run(gy, w, *args)
    # two calibration calls (exact: nothing compared), then the decided quantizer
    assert lqs._STATES[key].steps == 3
    (rec,) = shadow.records()
    assert rec.calls == 1 and rec.op.startswith("hq_grad_input[per_")


def test_records_say_whether_a_nan_came_in():
    shadow.clear()
    gy, w = _inputs()
    gy[0, 0] = float("nan")
    shadow._wrap_hq(ops.hq_grad_input._init_fn)(gy, w, *ARGS)
    (rec,) = shadow.records()
    assert rec.kernel_nonfinite == rec.reference_nonfinite == 32  # the NaN row
    assert rec.inputs.split()[0].startswith("1/") and rec.inputs.split()[1].startswith("0/")


def test_enable_wraps_every_cuda_kernel_and_disable_restores_them(monkeypatch):
    """The wiring of enable()/disable() without a GPU: the kernels table (here the reference
    functions stand in for the CUDA kernels) is installed wrapped, each wrapper runs its own
    kernel and reference, and disable() installs the plain table again."""
    from hotcompile import kernels

    names = ("hq_grad_input", "abc_compress", "hla_grad_weight", "hla_grad_weight_dense")
    refs = {n: getattr(ops, n)._init_fn for n in names}
    installed: list[dict] = []
    monkeypatch.setattr(kernels, "register", lambda: True)
    monkeypatch.setattr(kernels, "cuda_kernels", lambda: dict(refs))
    monkeypatch.setattr(kernels, "install", lambda impls: installed.append(dict(impls)))
    shadow.clear()
    shadow.enable()
    try:
        wrapped = installed[-1]
        assert set(wrapped) == set(names) and all(wrapped[n] is not refs[n] for n in names)
        gy, w = _inputs()
        wrapped["hq_grad_input"](gy, w, *ARGS)
        rows = [0, 1, 2, 4, 8, 3, 5, 6]
        x, g3 = torch.randn(2, 32, 48), torch.randn(2, 32, 24)
        codes, scale = wrapped["abc_compress"](x, 0, rows, 16, 8, "pseudo_stochastic")
        tail = (16, 8, "pseudo_stochastic", "fc", False)  # block, bits, rounding, layer, check
        wrapped["hla_grad_weight"](g3, codes, scale, 0, rows, *tail)
        wrapped["hla_grad_weight_dense"](g3, x, 0, rows, *tail)
        seen = {r.op.split("[")[0] for r in shadow.records()}
        assert seen == {"hq_grad_input", "abc_compress codes·scale", "hla_grad_weight",
                        "hla_grad_weight_dense"}  # fmt: skip
        assert not [r for r in shadow.records() if r.bad], shadow.table()
    finally:
        shadow.disable()
    assert installed[-1] == refs
