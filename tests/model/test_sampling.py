"""The KMeans sampler."""

from __future__ import annotations

import numpy as np

from cdmpp.model.sampling import KMeansSampler, RandomSampler


def test_kmeans_sampler_picks_distinct_nearest_and_is_deterministic():
    rng = np.random.default_rng(0)
    centers = np.array([[0, 0], [10, 0], [0, 10], [10, 10]], float)
    X = np.concatenate([c + rng.normal(scale=0.5, size=(50, 2)) for c in centers])
    s = KMeansSampler(4, random_state=0).fit(X)
    assert len(set(s.indices_.tolist())) == 4
    for c in s.cluster_centers_:  # every centroid's pick is its nearest row (clusters are well separated)
        nearest = np.argmin(((X - c) ** 2).sum(1))
        assert nearest in s.indices_
    assert np.array_equal(s.indices_, KMeansSampler(4, random_state=0).fit(X).indices_)
    assert len(set(KMeansSampler(30, random_state=1).fit(X).indices_.tolist())) == 30
    assert np.array_equal(KMeansSampler(500).fit(X).indices_, np.arange(len(X)))
    r = RandomSampler(5, random_state=3).fit(X)
    assert len(set(r.indices_.tolist())) == 5
    assert np.array_equal(r.indices_, RandomSampler(5, random_state=3).fit(X).indices_)
