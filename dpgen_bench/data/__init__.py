"""Datasets, served as cached tensors with fixed splits."""

from __future__ import annotations

from ..api import ImageData
from ..registry import datasets


def load_dataset(name: str, **kwargs) -> ImageData:
    loader = datasets.get(name)
    return loader(**kwargs)
