"""The embedded default: scikit-learn's ``load_digits`` (no download).

1,797 grey 8×8 images with 17 levels (0..16) and 10 classes, upsampled once to 16×16
(bilinear, ``align_corners=False``) and scaled to [-1, 1]. Fixed stratified split of 1,437
train / 360 test: ``train_test_split(arange(1797), test_size=360, stratify=labels,
random_state=0)`` on the dataset's own order, so anyone can rebuild it.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F

from ..api import ImageData, Split

IMAGE_SIZE = 16
N_TEST = 360


@functools.lru_cache(maxsize=1)
def _build() -> tuple[Split, Split]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    raw = torch.as_tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0  # [0, 1]
    images = F.interpolate(raw, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear", align_corners=False)
    images = (images.clamp(0, 1) * 2 - 1).contiguous()
    labels = torch.as_tensor(bunch.target, dtype=torch.long)
    idx = np.arange(len(labels))
    train_idx, test_idx = train_test_split(idx, test_size=N_TEST, stratify=bunch.target, random_state=0)
    return Split(images[train_idx], labels[train_idx]), Split(images[test_idx], labels[test_idx])


def load_digits_data(**_: object) -> ImageData:
    """scikit-learn digits, 16x16 grey, 10 classes, 1437 train / 360 test (embedded, no download)."""
    train, test = _build()
    return ImageData(
        name="digits",
        train=train,
        test=test,
        class_names=tuple(str(i) for i in range(10)),
        description="scikit-learn load_digits, 16x16, 1437 train / 360 test (stratified, random_state=0)",
    )
