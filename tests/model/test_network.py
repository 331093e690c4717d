"""The CDMPP network: positional encoding, padding, packing, FLOPs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cdmpp.model.network import PackedPrograms, collate, sinusoidal_encoding
from tests.model.synthetic import F, FakeProgram, random_program, small_model


def test_sinusoidal_encoding_formula():
    pe = sinusoidal_encoding(torch.tensor([0, 3, 7]), 6)
    assert pe.shape == (3, 6)
    assert torch.allclose(pe[0], torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1.0]))
    assert torch.isclose(pe[1, 2], torch.sin(torch.tensor(3.0) / 10000 ** (2 / 6)))
    assert torch.isclose(pe[2, 5], torch.cos(torch.tensor(7.0) / 10000 ** (4 / 6)))
    assert sinusoidal_encoding(torch.tensor([[1, 2]]), 5).shape == (1, 2, 5)


def test_padding_does_not_change_prediction():
    rng = np.random.default_rng(0)
    short, long = random_program(rng, 2), random_program(rng, 9)
    model, dev = small_model(), torch.zeros(1, 8)
    with torch.inference_mode():
        alone = model(*collate([short]), dev)
        padded = model(*collate([short, long]), dev.expand(2, 8))
    x, pos, mask = collate([short, long])
    assert x.shape == (2, 9, F) and mask[0].sum() == 2 and not mask[0, 2:].any()
    assert torch.allclose(alone[0], padded[0], atol=1e-5)


def test_empty_program_gets_one_zero_leaf():
    x, pos, mask = collate([FakeProgram(np.zeros((0, F), np.float32), np.zeros(0, np.int64))])
    assert x.shape == (1, 1, F) and mask.all()


def test_positional_encoding_acts_only_through_positions():
    rng = np.random.default_rng(1)
    p = random_program(rng, 5)
    moved = FakeProgram(p.leaf_features, p.positions + 37)
    dev = torch.zeros(1, 8)
    with torch.inference_mode():
        for use_pe, should_change in ((False, False), (True, True)):
            m = small_model(use_pe)
            a, b = m(*collate([p]), dev), m(*collate([moved]), dev)
            assert (not torch.allclose(a, b, atol=1e-5)) == should_change
    # same weights, PE switched off at run time: identical to a model built without PE
    m_pe, m_no = small_model(True), small_model(False)
    m_pe.use_pe = False
    with torch.inference_mode():
        assert torch.allclose(m_pe(*collate([p]), dev), m_no(*collate([p]), dev))


def test_packed_subset_and_means():
    rng = np.random.default_rng(2)
    progs = [random_program(rng) for _ in range(10)]
    pack = PackedPrograms.from_programs(progs)
    sub = pack.subset(np.array([7, 2]))
    assert np.array_equal(sub.leaves[: len(progs[7].positions)], progs[7].leaf_features)
    assert np.allclose(pack.program_means()[3], progs[3].leaf_features.mean(0), atol=1e-6)


def test_leaf_flops_counts_a_multiply_add_as_two():
    from cdmpp.model.network import leaf_flops

    row = np.zeros((1, 164), np.float32)
    row[0, 0] = np.log2(1000 + 1)  # 1000 float multiply-adds
    row[0, 1] = np.log2(10 + 1)  # 10 float add/sub
    assert leaf_flops(row)[0] == pytest.approx(2010, rel=1e-6)


def test_matmul_flops_are_2n3():
    """A real 64x64x64 matmul (TVM featurizer): 2·64³ FLOPs, bytes and unique bytes present."""
    pytest.importorskip("tvm")
    from cdmpp.model.network import PackedPrograms
    from cdmpp.program.features import featurize
    from cdmpp.zoo import workloads

    f = featurize(workloads.matmul(64, 64, 64))
    stats = PackedPrograms.from_programs([f]).stats[0]
    assert np.exp2(stats[0]) - 1 == pytest.approx(2 * 64**3, rel=0.01)
    assert np.exp2(stats[2]) - 1 == pytest.approx(3 * 64 * 64 * 4, rel=0.01)  # A, B and C once (float32)
