"""Datasets, served as cached tensors with fixed splits."""

from __future__ import annotations

from ..api import ImageData
from ..registry import datasets


def load_dataset(name: str, eval_split: str = "test", **kwargs) -> ImageData:
    """The dataset ``name``; with ``eval_split="val"``, its training split minus the fixed
    validation part, which then stands in for the test split (``ImageData.with_validation``)."""
    data = datasets.get(name)(**kwargs)
    return data.with_validation() if eval_split == "val" else data
