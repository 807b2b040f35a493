"""The demo's training on real data (scikit-learn digits): a fast convergence regression test.

HOT must train the digits CNN to FP32-like accuracy in a couple of epochs; if a change to the
quantizers, HLA or LQS hurts training quality, this fails.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("sklearn")

from hotcompile.demo import load_digits_split, train  # noqa: E402


@pytest.fixture(scope="module")
def digits():
    torch.set_flush_denormal(True)
    return load_digits_split(0)


def test_hot_cnn_trains_like_fp32_on_digits(digits):
    fp32 = train("cnn", "fp32", digits, epochs=2, progress=False)
    torch._dynamo.reset()
    hot = train("cnn", "hot", digits, epochs=2, progress=False)
    assert fp32.accuracy > 0.9
    assert hot.accuracy > fp32.accuracy - 0.03, (hot.accuracy, fp32.accuracy)
    assert hot.saved_bytes < fp32.saved_bytes
    assert {p.path for p in hot.plan} == {"hot"}
    # LQS decided every layer that computes g_x in training; the stem's input needs no grad
    training = [p for p in hot.plan if p.needs_gx]
    assert {p.name for p in training} == {"conv1", "down", "conv2", "proj", "head"}
    assert all(p.quantizer in ("per_token", "per_tensor") for p in training)
