"""Pre-order positional encoding of compact-AST leaves.

The standard sinusoidal encoding (Vaswani et al. 2017) of a leaf's pre-order position ``p``:
``PE[p, 2i] = sin(p / 10000^(2i/d))``, ``PE[p, 2i+1] = cos(p / 10000^(2i/d))``. It is kept apart from the
leaf features so a model can switch it off (ablation). The CDMPP original adds the encoding directly to
the normalized 164-dim leaf features (so d = feature width and the positions come from its own tree
serialization); cdmpp adds it after projecting the features to the model width, where it does not
overwrite any raw feature.
"""

from __future__ import annotations

import numpy as np


def sinusoidal_table(max_position: int, dim: int) -> np.ndarray:
    """``[max_position, dim]`` float32 table; row ``p`` is the encoding of position ``p``."""
    pos = np.arange(max_position, dtype=np.float64)[:, None]
    i = np.arange(0, dim, 2, dtype=np.float64)[None, :]
    angle = pos / np.power(10000.0, i / dim)
    table = np.zeros((max_position, dim), dtype=np.float64)
    table[:, 0::2] = np.sin(angle)
    table[:, 1::2] = np.cos(angle[:, : dim // 2])
    return table.astype(np.float32)


def preorder_encoding(positions: np.ndarray, dim: int) -> np.ndarray:
    """Encoding of each leaf position: ``[n_leaves, dim]``."""
    positions = np.asarray(positions, dtype=np.int64)
    if positions.size == 0:
        return np.zeros((0, dim), dtype=np.float32)
    return sinusoidal_table(int(positions.max()) + 1, dim)[positions]
