"""Clustering a DeepSeek-V3-shaped problem: 58 MoE layers x 256 experts, synthetic embeddings.

Times :class:`moescope.explore.clustering.ExpertClusterer` (agglomerative, cosine, representatives
and weighted centres included) over every layer at keep 1/2, 1/4 and 1/8, side by side with the bare
scikit-learn path (``pairwise_distances`` then ``AgglomerativeClustering``) — the baseline a hand-
rolled script would use — and prints the ratio. Embeddings are planted groups plus noise, 128
dimensions (the width of moescope's multi-view embeddings). It reports; it does not pass or fail.

    .venv/bin/python bench/clustering.py [--layers 58] [--experts 256] [--dim 128]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.cluster import AgglomerativeClustering
from sklearn.metrics import pairwise_distances

from moescope.explore.clustering import ExpertClusterer


def embeddings(layers: int, experts: int, dim: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(layers):
        centres = rng.normal(size=(experts // 4, dim))
        out.append(np.repeat(centres, 4, axis=0) + 0.3 * rng.normal(size=(experts, dim)))
    return out


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=58)
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--dim", type=int, default=128)
    args = parser.parse_args()
    data = embeddings(args.layers, args.experts, args.dim)
    weights = [np.random.default_rng(i).integers(1, 1000, args.experts) for i in range(args.layers)]
    print(f"clustering {args.layers} layers x {args.experts} experts, {args.dim}-d embeddings")
    print(f"  {'keep':>5} {'moescope s':>11} {'sklearn s':>10} {'ratio':>6}")
    for keep in (2, 4, 8):
        k = args.experts // keep

        def ours(k: int = k) -> None:
            for x, w in zip(data, weights, strict=True):
                ExpertClusterer(n_clusters=k).fit(x, sample_weight=w)

        def floor(k: int = k) -> None:
            for x in data:
                unit = x / np.linalg.norm(x, axis=1, keepdims=True)
                dist = pairwise_distances(unit, metric="cosine")
                AgglomerativeClustering(k, metric="precomputed", linkage="average").fit(dist)

        t_ours, t_floor = timed(ours), timed(floor)
        print(f"  {'1/' + str(keep):>5} {t_ours:>11.2f} {t_floor:>10.2f} {t_ours / t_floor:>6.2f}")


if __name__ == "__main__":
    main()
