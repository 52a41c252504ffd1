"""FFHQ with gender labels, from a folder of images and a label file (no download).

Layout (``root`` from :func:`dpgen_bench.data.files.data_root`)::

    <root>/ffhq/images/**/*.png  (or .jpg / .jpeg; sub-folders such as 00000/ are fine)
    <root>/ffhq/gender.csv       header 'file,gender'; gender female/male or 0/1 (1 = male)
    or <root>/ffhq/gender.json   {"<file>": "female" | "male" | 0 | 1, ...}

(gender.csv wins when both exist). A label's ``file`` is matched against the image's path
relative to ``images/`` (``00000/00001.png``), else its file name (``00001.png``), else
its stem (``00001``). Every labelled file must exist; images without a label are ignored
(counted in ``dataset_info(name)["unlabelled"]``).

Split: the labelled images sorted by relative path, then ``numpy.random.default_rng(0)
.permutation``; the first ``round(n / 10)`` are test, the rest train (90 / 10).
Preprocessing: centre square crop (FFHQ is square already), PIL bilinear resize to
128x128 (``ffhq-gender``) or 64x64 (``ffhq-gender-64``); RGB, ``x / 127.5 - 1``.
Classes ("female", "male").
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import torch

from ..api import ImageData, Split
from ..cache import cache_dir
from . import files

IMAGE_DIR = "images"
EXTENSIONS = (".png", ".jpg", ".jpeg")
CLASS_NAMES = ("female", "male")
SEED = 0
TEST_FRACTION = 0.1
LABEL_VALUES = {"female": 0, "male": 1, "0": 0, "1": 1}
CSV_EXPECTED = "a CSV with header 'file,gender' and one row per image, gender female/male or 0/1"
JSON_EXPECTED = "a JSON object mapping each image file to female/male or 0/1"


def paths(root: Path) -> tuple[Path, Path, Path]:
    base = root / "ffhq"
    return base / IMAGE_DIR, base / "gender.csv", base / "gender.json"


def _expected(root: Path) -> str:
    img, csv_path, json_path = paths(root)
    return f"{img}/*.png (or .jpg) and a label file {csv_path} (columns file,gender) or {json_path}"


def _label(dataset: str, path: Path, where: str, value: object, expected: str) -> int:
    key = str(value).strip().lower()
    if key not in LABEL_VALUES:
        raise files.malformed(dataset, path, f"{where}: gender {value!r} is not female/male/0/1", expected)
    return LABEL_VALUES[key]


def read_labels(dataset: str, csv_path: Path, json_path: Path) -> tuple[Path, list[tuple[str, int]]]:
    if csv_path.is_file():
        try:
            with open(csv_path, newline="") as f:
                reader = csv.reader(f)
                header = [h.strip().lower() for h in next(reader, [])]
                if "file" not in header or "gender" not in header:
                    raise files.malformed(dataset, csv_path, f"header is {','.join(header)!r}", CSV_EXPECTED)
                fi, gi = header.index("file"), header.index("gender")
                out = []
                for line_no, row in enumerate(reader, start=2):
                    if not any(c.strip() for c in row):
                        continue
                    if len(row) <= max(fi, gi):
                        raise files.malformed(dataset, csv_path, f"line {line_no} has {len(row)} columns",
                                              CSV_EXPECTED)
                    out.append((row[fi].strip(), _label(dataset, csv_path, f"line {line_no}", row[gi],
                                                        CSV_EXPECTED)))
        except (OSError, UnicodeDecodeError, csv.Error) as e:
            raise files.malformed(dataset, csv_path, f"cannot read it: {type(e).__name__}", CSV_EXPECTED) from None
        return csv_path, out
    try:
        mapping = json.loads(json_path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise files.malformed(dataset, json_path, f"not JSON: {type(e).__name__}", JSON_EXPECTED) from None
    if not isinstance(mapping, dict):
        raise files.malformed(dataset, json_path, f"top level is a {type(mapping).__name__}", JSON_EXPECTED)
    return json_path, [(str(k).strip(), _label(dataset, json_path, f"key {k!r}", v, JSON_EXPECTED))
                       for k, v in mapping.items()]


def _scan(img_dir: Path) -> list[str]:
    """Relative posix paths of every image under ``img_dir``, sorted."""
    found = []
    for dirpath, dirnames, filenames in os.walk(img_dir):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        rel = os.path.relpath(dirpath, img_dir)
        for name in filenames:
            if name.lower().endswith(EXTENSIONS) and not name.startswith("."):
                found.append(name if rel == "." else f"{rel}/{name}".replace(os.sep, "/"))
    return sorted(found)


def _match(dataset: str, img_dir: Path, labels: list[tuple[str, int]], images: list[str], label_file: Path
           ) -> tuple[list[str], np.ndarray]:
    by_rel = set(images)
    by_name: dict[str, str | None] = {}
    by_stem: dict[str, str | None] = {}
    for rel in images:
        name = rel.rsplit("/", 1)[-1]
        by_name[name] = rel if name not in by_name else None  # None: ambiguous
        stem = name.rsplit(".", 1)[0]
        by_stem[stem] = rel if stem not in by_stem else None
    matched: dict[str, int] = {}
    missing = []
    for key, y in labels:
        k = key.replace("\\", "/")
        k = k[2:] if k.startswith("./") else k
        rel = k if k in by_rel else by_name.get(k) or by_stem.get(k)
        if rel is None:
            missing.append(str(img_dir / k))
        else:
            matched[rel] = y
    if missing:
        raise files.missing_files(dataset, missing, f"one image per label of {label_file} under {img_dir} "
                                  f"({len(missing)} of {len(labels)} labelled files absent)")
    rels = sorted(matched)
    return rels, np.array([matched[r] for r in rels], dtype=np.int64)


def split_indices(n: int, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices: 90 / 10 with ``default_rng(seed).permutation``, each sorted."""
    perm = np.random.default_rng(seed).permutation(n)
    n_test = max(1, int(round(n * TEST_FRACTION)))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def load(size: int, root: str | os.PathLike | None = None, *, workers: int | None = None,
         in_memory: bool | None = None, **_: object) -> ImageData:
    dataset = "ffhq-gender" + ("" if size == 128 else f"-{size}")
    base = files.data_root(root)
    img_dir, csv_path, json_path = paths(base)
    missing = []
    if not img_dir.is_dir():
        missing.append(f"{img_dir}/")
    if not csv_path.is_file() and not json_path.is_file():
        missing.append(f"{csv_path} (or {json_path.name})")
    if missing:
        raise files.missing_files(dataset, missing, _expected(base))
    images = _scan(img_dir)
    if not images:
        raise files.missing_files(dataset, [f"{img_dir}/*.png"], _expected(base))
    label_file, labels = read_labels(dataset, csv_path, json_path)
    rels, y = _match(dataset, img_dir, labels, images, label_file)
    if len(rels) < 2:
        raise files.malformed(dataset, label_file, f"{len(rels)} labelled image(s); a train / test split needs 2")
    train_idx, test_idx = split_indices(len(rels))

    resolved = str((base / "ffhq").resolve())
    rh = files.short_hash(resolved)
    fp_common = dict(source=resolved, files=[files.file_stat(label_file)], n_images=len(images), size=size,
                     split=f"rng{SEED}-{TEST_FRACTION}", crop="center-square", resize="PIL bilinear")
    directory = cache_dir(files.CACHE_KIND)
    out, info = {}, {"cache_files": [], "cache_hit": True}
    modes, caches = [], {}
    # Every uint8 cache first (decode workers fork from a small process), then the float splits.
    for split, idx in (("train", train_idx), ("test", test_idx)):
        fp = files.fingerprint(part=split, **fp_common)
        family = f"ffhq-u8-{size}px-{split}-{rh}"
        split_paths = [str(img_dir / rels[i]) for i in idx]

        def fill(tmp: str, offset: int, split_paths=split_paths) -> None:
            files.decode_images(dataset, split_paths, tmp, offset, size, "RGB", workers)

        caches[split] = fp, files.cached_array(directory, f"{family}-{fp[:16]}", family, fp,
                                               (len(idx), 3, size, size), np.uint8, fill,
                                               {"dataset": "ffhq", "split": split, "images": len(idx)})
        info["cache_files"].append(str(directory / f"{family}-{fp[:16]}.npy"))
    in_memory = files.keep_in_memory(in_memory, len(rels), (3, size, size))
    for split, idx in (("train", train_idx), ("test", test_idx)):
        fp, (u8, hit) = caches[split]
        images_t, storage = files.float_images(u8, None, directory=directory, family=f"{dataset}-f32-{split}-{rh}",
                                               fp=fp, in_memory=in_memory)
        out[split] = Split(images_t, torch.as_tensor(y[idx]))
        info["cache_hit"] = info["cache_hit"] and hit
        modes.append(storage)
    info["storage"] = files.storage_note(modes, [out["train"].images, out["test"].images])
    n_tr, n_te = len(out["train"]), len(out["test"])
    unlabelled = len(images) - len(rels)
    description = (f"FFHQ ({img_dir}, labels {label_file.name}), centre square crop, bilinear resize to "
                   f"{size}x{size}, {n_tr} train / {n_te} test (90/10, default_rng({SEED}).permutation); "
                   f"gender female / male" + (f"; {unlabelled} unlabelled images ignored" if unlabelled else ""))
    info.update(name=dataset, root=str(base), n_train=n_tr, n_test=n_te, image_size=size, unlabelled=unlabelled,
                label_file=str(label_file), description=description)
    files.set_info(dataset, info)
    return ImageData(name=dataset, train=out["train"], test=out["test"], class_names=CLASS_NAMES,
                     description=description)


def load_ffhq_gender(root: str | os.PathLike | None = None, **kw) -> ImageData:
    """FFHQ 128x128, gender (female, male), 90 / 10 split with seed 0 (local files: <root>/ffhq)."""
    return load(128, root, **kw)


def load_ffhq_gender_64(root: str | os.PathLike | None = None, **kw) -> ImageData:
    """FFHQ 64x64, gender (female, male), 90 / 10 split with seed 0 (local files: <root>/ffhq)."""
    return load(64, root, **kw)
