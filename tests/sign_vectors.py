"""Gallery vectors with exact ties, for comparing the retrieval views with a float64 reference."""

import numpy as np


def clustered_sign_vectors(labels: np.ndarray, seed: int = 0) -> np.ndarray:
    """Distinct +-1 vectors in 16 dimensions, each its class's pattern with some signs flipped, float32 [n, 16]: their
    cosines are exact multiples of 1/8 in float32 and float64 alike, so the many exact ties are ties for the code and
    the reference, and no two are 1 ulp apart (an untrained model's embeddings lie within an ulp of one another, where
    the order is the float arithmetic's)."""
    rng = np.random.default_rng(seed)
    patterns = rng.choice([-1.0, 1.0], size=(int(labels.max()) + 1, 16))
    while True:
        flips = np.where(rng.random((len(labels), 16)) < 0.3, -1.0, 1.0)
        vectors = patterns[labels] * flips
        if len(np.unique(vectors, axis=0)) == len(labels):
            return (vectors / 4).astype(np.float32)
