"""Seeded inputs and hand-written references shared by the metric tests."""

from __future__ import annotations

import sys

import numpy as np

EPS = sys.float_info.min

# 3-class fixed inputs: class 2 is never predicted, class 1 is predicted twice (once wrongly)
LOGITS = np.array(
    [
        [0.9, 0.05, 0.05],  # pred 0, true 0
        [0.1, 0.8, 0.1],  # pred 1, true 1
        [0.6, 0.3, 0.1],  # pred 0, true 2
        [0.2, 0.7, 0.1],  # pred 1, true 0
        [0.5, 0.2, 0.3],  # pred 0, true 0
        [0.3, 0.4, 0.3],  # pred 1, true 2
    ]
)
LABELS = np.array([0, 1, 2, 0, 0, 2])
SIZES = (5, 3, 7, 4, 6)  # uneven batches; under DDP an uneven split (3 vs 2 batches)


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def class_batches(classes: int = 4, seed: int = 0, ties: bool = False, one_hot: bool = False):
    """``(logits (n, C) float64, labels (n,))`` batches; ``ties``: scores on a coarse grid."""
    g = rng(seed)
    out = []
    for n in SIZES:
        x = g.integers(0, 3, size=(n, classes)) / 2 if ties else g.random((n, classes))
        y = g.integers(0, classes, size=n)
        out.append((x, np.eye(classes)[y] if one_hot else y))
    return out


def multilabel_batches(classes: int = 3, seed: int = 1):
    g = rng(seed)
    return [(g.integers(0, 2, size=(n, classes)), g.integers(0, 2, size=(n, classes)))
            for n in SIZES]


def stacked(batches, i: int) -> np.ndarray:
    return np.concatenate([b[i] for b in batches])


def labels_of(y: np.ndarray) -> np.ndarray:
    return y.argmax(1) if y.ndim == 2 else y


def hand_counts(logits: np.ndarray, labels: np.ndarray, c: int):
    pred = logits.argmax(1)
    tp = np.array([np.sum((pred == k) & (labels == k)) for k in range(c)], dtype=float)
    pred_pos = np.array([np.sum(pred == k) for k in range(c)], dtype=float)
    actual_pos = np.array([np.sum(labels == k) for k in range(c)], dtype=float)
    return tp, pred_pos, actual_pos


def rank_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mann-Whitney: P(score_pos > score_neg) + 0.5 P(tie), by brute force over pairs."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    wins = sum(float(p > n) + 0.5 * float(p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))
