"""Choose which few programs to measure on a new device (or for a new network).

``KMeansSampler`` is CDMPP's choice: cluster the candidates' embeddings and measure the program
nearest each centroid, so the k measurements cover the space of programs instead of its dense middle.
``RandomSampler`` is the baseline it is compared against. Both behave like scikit-learn estimators:
constructor arguments stored as given, ``fit(X)`` returns self, learned state ends in ``_``.
``choose_shots`` picks from a pool by sampler name (``cdmpp sample``, the evaluation's k-shot settings);
``model_free_embedding`` is what it clusters where there is no model.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from sklearn.cluster import KMeans
from sklearn.metrics.pairwise import euclidean_distances


class KMeansSampler:
    """Pick ``k`` distinct rows of ``X``: for each KMeans centroid, the nearest row not yet picked.

    Centroids are visited from the largest cluster to the smallest, so when two centroids compete for
    one row the one representing more programs wins. ``indices_`` holds the picks in that order.
    """

    def __init__(self, k: int, random_state: int | None = 0, n_init: int = 4):
        self.k = k
        self.random_state = random_state
        self.n_init = n_init

    def fit(self, X, y=None) -> "KMeansSampler":
        X = np.asarray(X, dtype=np.float64)
        n = len(X)
        if self.k >= n:
            self.indices_ = np.arange(n)
            self.cluster_centers_ = X.copy()
            self.labels_ = np.arange(n)
            return self
        km = KMeans(n_clusters=self.k, random_state=self.random_state, n_init=self.n_init).fit(X)
        self.cluster_centers_ = km.cluster_centers_
        self.labels_ = km.labels_
        d2 = euclidean_distances(self.cluster_centers_, X, squared=True)  # [k, n]
        sizes = np.bincount(km.labels_, minlength=self.k)
        taken = np.zeros(n, dtype=bool)
        picks = []
        for c in np.argsort(-sizes, kind="stable"):
            d = np.where(taken, np.inf, d2[c])
            i = int(np.argmin(d))
            taken[i] = True
            picks.append(i)
        self.indices_ = np.asarray(picks, dtype=np.int64)
        return self

    def fit_select(self, X) -> np.ndarray:
        return self.fit(X).indices_


class RandomSampler:
    """Pick ``k`` distinct rows uniformly at random: the baseline for KMeansSampler."""

    def __init__(self, k: int, random_state: int | None = 0):
        self.k = k
        self.random_state = random_state

    def fit(self, X, y=None) -> "RandomSampler":
        n = len(X)
        rng = np.random.default_rng(self.random_state)
        self.indices_ = rng.choice(n, size=min(self.k, n), replace=False).astype(np.int64)
        return self

    def fit_select(self, X) -> np.ndarray:
        return self.fit(X).indices_


def sampler(name: str, k: int, random_state: int | None = 0):
    """Look a sampler up by short name: ``"kmeans"`` or ``"random"``."""
    if name == "kmeans":
        return KMeansSampler(k, random_state=random_state)
    if name == "random":
        return RandomSampler(k, random_state=random_state)
    raise ValueError(f"unknown sampler {name!r}: expected 'kmeans' or 'random'")


_by_name = sampler  # choose_shots's argument ``sampler`` is the name


def model_free_embedding(reference: Sequence, programs: Sequence) -> np.ndarray:
    """Mean of each program's normalized leaf features; the normalizer is fitted on ``reference`` only
    (the training programs), so choosing shots never looks at test statistics."""
    from cdmpp.model.network import PackedPrograms
    from cdmpp.model.transforms import FeatureNormalizer

    ref = PackedPrograms.from_programs([p.features for p in reference])
    norm = FeatureNormalizer().fit(ref.leaves)
    return PackedPrograms.from_programs([p.features for p in programs], norm.transform).program_means()


def choose_shots(pool: Sequence, k: int, sampler: str = "kmeans", seed: int = 0,
                 embedding: np.ndarray | None = None) -> np.ndarray:
    """Indices of ``k`` distinct programs of ``pool`` to measure (``embedding``: one row per program, from
    a model's ``embed`` or ``model_free_embedding``)."""
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    if embedding is None:
        raise ValueError("choose_shots needs an embedding of the pool (model.embed or model_free_embedding)")
    return np.asarray(_by_name(sampler, k, random_state=seed).fit_select(embedding), dtype=np.int64)
