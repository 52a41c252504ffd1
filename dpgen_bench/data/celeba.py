"""CelebA (aligned & cropped) from torchvision's layout, with gender or hair-colour labels.

Layout (``root`` from :func:`dpgen_bench.data.files.data_root`)::

    <root>/celeba/img_align_celeba/000001.jpg ...     (178x218 JPEGs)
    <root>/celeba/list_attr_celeba.txt                 (count line, 40 names, '<file> 1 -1 ...')
    <root>/celeba/list_eval_partition.txt              ('<file> 0|1|2')

Split: the standard partition, with **train = partitions 0 + 1 (train + valid)** and
**test = partition 2**, as Private GANs (App. C) reports: 182,637 train / 19,962 test.

Preprocessing: centre crop 178x218 -> 178x178 (torchvision ``CenterCrop(178)``: rows
20..197), then PIL bilinear resize (torchvision ``Resize`` on PIL images) to 64x64
(``celeba-gender``, ``celeba-hair``: DPAF) or 32x32 (``celeba-gender-32``,
``celeba-hair-32``: Private GANs, DPAC); RGB, ``x / 127.5 - 1``.

Labels: ``celeba-gender``: the ``Male`` attribute, classes ("female", "male").
``celeba-hair``: ``Black_Hair`` / ``Blond_Hair`` / ``Brown_Hair``, classes ("black",
"blonde", "brown"), keeping only images with exactly one of the three; how many were
dropped (total, train, test) is in ``ImageData.description`` and in
``dpgen_bench.data.files.dataset_info(name)["dropped"]`` (also :func:`hair_counts`).

One uint8 cache per (size, split) holds every image of the split; gender and hair share
it (hair takes the subset when building its float split). Memory: see ``files.py``
(CelebA-64's float32 splits, 9.96 GB, are served memory-mapped, not held in RAM).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import torch

from ..api import ImageData, Split
from ..cache import cache_dir
from . import files

ATTR_FILE = "list_attr_celeba.txt"
PARTITION_FILE = "list_eval_partition.txt"
IMAGE_DIR = "img_align_celeba"
HAIR = ("Black_Hair", "Blond_Hair", "Brown_Hair")
# the 40 names of list_attr_celeba.txt's second line, in file order: the loader looks its columns up
# by name, so this is the format's record for what writes the file (test fixtures, benchmarks)
ATTRIBUTES = (
    "5_o_Clock_Shadow Arched_Eyebrows Attractive Bags_Under_Eyes Bald Bangs Big_Lips Big_Nose Black_Hair "
    "Blond_Hair Blurry Brown_Hair Bushy_Eyebrows Chubby Double_Chin Eyeglasses Goatee Gray_Hair Heavy_Makeup "
    "High_Cheekbones Male Mouth_Slightly_Open Mustache Narrow_Eyes No_Beard Oval_Face Pale_Skin Pointy_Nose "
    "Receding_Hairline Rosy_Cheeks Sideburns Smiling Straight_Hair Wavy_Hair Wearing_Earrings Wearing_Hat "
    "Wearing_Lipstick Wearing_Necklace Wearing_Necktie Young"
).split()
CLASS_NAMES = {"gender": ("female", "male"), "hair": ("black", "blonde", "brown")}
ATTR_EXPECTED = ("torchvision's list_attr_celeba.txt: a line with the image count, a line of the 40 attribute "
                 "names, then one line per image: '<file>.jpg' and one 1/-1 per attribute")
PARTITION_EXPECTED = "torchvision's list_eval_partition.txt: one line per image, '<file>.jpg 0|1|2'"


def paths(root: Path) -> tuple[Path, Path, Path]:
    base = root / "celeba"
    return base / IMAGE_DIR, base / ATTR_FILE, base / PARTITION_FILE


def _expected(root: Path) -> str:
    img, attr, part = paths(root)
    return f"torchvision's CelebA layout: {img}/*.jpg, {attr} and {part}"


def parse_attr(dataset: str, path: Path) -> tuple[list[str], list[str], np.ndarray]:
    """(file names, attribute names, int8 matrix of +-1) from list_attr_celeba.txt."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise files.malformed(dataset, path, f"cannot read it: {type(e).__name__}", ATTR_EXPECTED) from None
    if len(lines) < 2:
        raise files.malformed(dataset, path, "fewer than 2 lines", ATTR_EXPECTED)
    try:
        count = int(lines[0].strip())
    except ValueError:
        raise files.malformed(dataset, path, f"line 1 is {lines[0][:40]!r}, not the image count",
                              ATTR_EXPECTED) from None
    names = lines[1].split()
    k = len(names)
    # Vectorised (202,599 x 40 values): every value is "1" or "-1" between whitespace.
    files_, rests, line_no = [], [], []
    for i, ln in enumerate(lines[2:], start=3):
        parts = ln.split(None, 1)
        if not parts:
            continue
        rest = parts[1] if len(parts) > 1 else ""
        if rest.count("1") != k:
            got = len(rest.split())
            problem = f"{got} values for {k} attributes" if got != k else "a value that is not 1 or -1"
            raise files.malformed(dataset, path, f"line {i} has {problem}", ATTR_EXPECTED)
        files_.append(parts[0])
        rests.append(rest)
        line_no.append(i)
    if len(files_) != count:
        raise files.malformed(dataset, path, f"line 1 says {count} images but {len(files_)} follow", ATTR_EXPECTED)
    text = np.frombuffer(" ".join(rests).encode("utf-8") + b" ", dtype=np.uint8)
    ones = np.flatnonzero(text == ord("1"))
    minus = np.flatnonzero(text == ord("-"))
    allowed, space = np.zeros(256, bool), np.zeros(256, bool)
    allowed[list(b" \t\r1-")] = True
    space[list(b" \t\r")] = True
    ok = allowed[text].all() and space[text[ones + 1]].all() and (text[minus + 1] == ord("1")).all()
    if not ok:
        pos = next((j for j, r in enumerate(rests) if any(t not in ("1", "-1") for t in r.split())), 0)
        raise files.malformed(dataset, path, f"line {line_no[pos]} has a value that is not 1 or -1", ATTR_EXPECTED)
    negative = np.zeros(len(text), bool)
    negative[minus + 1] = True
    values = np.where(negative[ones], -1, 1).astype(np.int8).reshape(len(files_), k)
    return files_, names, values


def parse_partition(dataset: str, path: Path) -> dict[str, int]:
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise files.malformed(dataset, path, f"cannot read it: {type(e).__name__}", PARTITION_EXPECTED) from None
    out = {}
    for i, ln in enumerate(lines):
        r = ln.split()
        if not r:
            continue
        if len(r) != 2 or r[1] not in ("0", "1", "2"):
            raise files.malformed(dataset, path, f"line {i + 1} is {ln[:60]!r}", PARTITION_EXPECTED)
        out[r[0]] = int(r[1])
    return out


def _labels(task: str, names: list[str], values: np.ndarray, dataset: str, attr: Path) -> tuple[np.ndarray, np.ndarray]:
    """(labels, keep mask) over all rows."""
    need = ("Male",) if task == "gender" else HAIR
    absent = [a for a in need if a not in names]
    if absent:
        raise files.malformed(dataset, attr, f"no attribute {', '.join(absent)} on line 2", ATTR_EXPECTED)
    if task == "gender":
        col = values[:, names.index("Male")]
        return (col == 1).astype(np.int64), np.ones(len(col), bool)
    hair = np.stack([values[:, names.index(a)] == 1 for a in HAIR], axis=1)
    keep = hair.sum(axis=1) == 1
    return hair.argmax(axis=1).astype(np.int64), keep


def load(task: str, size: int, root: str | os.PathLike | None = None, *, workers: int | None = None,
         in_memory: bool | None = None, **_: object) -> ImageData:
    dataset = f"celeba-{task}" + ("" if size == 64 else f"-{size}")
    base = files.data_root(root)
    img_dir, attr, part = paths(base)
    missing = [p for p in (attr, part) if not p.is_file()]
    if not img_dir.is_dir():
        missing.insert(0, f"{img_dir}/")
    if missing:
        raise files.missing_files(dataset, missing, _expected(base))
    present = {e.name for e in os.scandir(img_dir) if e.name.lower().endswith(".jpg")}
    if not present:
        raise files.missing_files(dataset, [f"{img_dir}/*.jpg"], _expected(base))

    names, attr_names, values = parse_attr(dataset, attr)
    partition = parse_partition(dataset, part)
    unpartitioned = [n for n in names if n not in partition]
    if unpartitioned:
        raise files.malformed(dataset, part, f"no partition for {files.fmt_paths(unpartitioned, 3)} "
                              f"({len(unpartitioned)} images of {attr.name})", PARTITION_EXPECTED)
    labels_all, keep_all = _labels(task, attr_names, values, dataset, attr)
    which = np.array([partition[n] for n in names], dtype=np.int8)
    split_rows = {"train": np.flatnonzero(which <= 1), "test": np.flatnonzero(which == 2)}
    for split, rows in split_rows.items():
        if len(rows) == 0:
            what = "0 or 1 (train, valid)" if split == "train" else "2 (test)"
            raise files.malformed(dataset, part, f"no image in partition {what}", PARTITION_EXPECTED)

    resolved = str((base / "celeba").resolve())
    rh = files.short_hash(resolved)
    fp_common = dict(source=resolved, files=[files.file_stat(attr), files.file_stat(part)], n_images=len(present),
                     size=size, crop="center-square", resize="PIL bilinear")
    directory = cache_dir(files.CACHE_KIND)
    for split, rows in split_rows.items():
        if not keep_all[rows].any():
            raise files.malformed(dataset, attr, f"no {split} image has exactly one of {', '.join(HAIR)}")
    out, info = {}, {"dropped": {}, "cache_files": [], "cache_hit": True}
    modes, caches = [], {}
    # Every uint8 cache first (decode workers fork from a small process), then the float splits.
    for split, rows in split_rows.items():
        split_names = [names[i] for i in rows]
        fp = files.fingerprint(split=split, **fp_common)
        family = f"celeba-u8-{size}px-{split}-{rh}"

        def fill(tmp: str, offset: int, split_names=split_names) -> None:
            absent = [str(img_dir / n) for n in split_names if n not in present]
            if absent:
                raise files.missing_files(dataset, absent, f"all {len(split_names)} images of this split: "
                                          f"{len(absent)} of the files listed in {attr} are absent")
            files.decode_images(dataset, [str(img_dir / n) for n in split_names], tmp, offset, size, "RGB", workers)

        caches[split] = fp, files.cached_array(directory, f"{family}-{fp[:16]}", family, fp,
                                               (len(rows), 3, size, size), np.uint8, fill,
                                               {"dataset": "celeba", "split": split, "images": len(rows)})
        info["cache_files"].append(str(directory / f"{family}-{fp[:16]}.npy"))
    in_memory = files.keep_in_memory(in_memory, int(sum(keep_all[r].sum() for r in split_rows.values())),
                                     (3, size, size))
    for split, rows in split_rows.items():
        fp, (u8, hit) = caches[split]
        keep = keep_all[rows]
        index = None if keep.all() else np.flatnonzero(keep)
        keep_hash = None if index is None else hashlib.sha1(index.tobytes()).hexdigest()
        images, storage = files.float_images(u8, index, directory=directory, family=f"{dataset}-f32-{split}-{rh}",
                                             fp=files.fingerprint(u8=fp, task=task, keep=keep_hash),
                                             in_memory=in_memory)
        labels = labels_all[rows] if index is None else labels_all[rows][index]
        out[split] = Split(images, torch.as_tensor(labels, dtype=torch.long))
        info["dropped"][split] = int((~keep).sum())
        info["cache_hit"] = info["cache_hit"] and hit
        modes.append(storage)
    info["storage"] = files.storage_note(modes, [out["train"].images, out["test"].images])
    n_tr, n_te = len(out["train"]), len(out["test"])
    if task == "gender":
        what = "label Male: female / male"
    else:
        d = info["dropped"]
        what = (f"hair black / blonde / brown (Black_Hair, Blond_Hair, Brown_Hair), keeping images with exactly one: "
                f"dropped {d['train'] + d['test']} (train {d['train']}, test {d['test']})")
    description = (f"CelebA aligned ({base / 'celeba'}), centre crop 178x178, bilinear resize to {size}x{size}, "
                   f"train = partitions 0+1 (train+valid) {n_tr} / test = partition 2 {n_te}; {what}")
    info.update(name=dataset, root=str(base), n_train=n_tr, n_test=n_te, image_size=size,
                dropped_total=sum(info["dropped"].values()), description=description)
    files.set_info(dataset, info)
    return ImageData(name=dataset, train=out["train"], test=out["test"], class_names=CLASS_NAMES[task],
                     description=description)


def hair_counts(root: str | os.PathLike | None = None) -> dict[str, int]:
    """Images per hair class and dropped (none or several of the three), from the attribute
    file alone (no image is decoded)."""
    base = files.data_root(root)
    _, attr, _ = paths(base)
    if not attr.is_file():
        raise files.missing_files("celeba-hair", [attr], _expected(base))
    _, attr_names, values = parse_attr("celeba-hair", attr)
    labels, keep = _labels("hair", attr_names, values, "celeba-hair", attr)
    counts = {c: int(((labels == i) & keep).sum()) for i, c in enumerate(CLASS_NAMES["hair"])}
    counts["dropped"] = int((~keep).sum())
    return counts


def hair_split_sizes(root: str | os.PathLike | None = None) -> tuple[int, int]:
    """(train, test) sizes of ``celeba-hair`` from the attribute and partition files alone
    (no image is read): what ``bench privacy`` needs to plan a budget before the images are
    downloaded."""
    base = files.data_root(root)
    _, attr, part = paths(base)
    missing = [p for p in (attr, part) if not p.is_file()]
    if missing:
        raise files.MissingDataFiles(files.one_line(
            f"dataset 'celeba-hair': missing {files.fmt_paths(missing)}; its N (the images with exactly one of "
            f"black / blonde / brown hair) is counted from {ATTR_FILE} and {PARTITION_FILE} alone, no image is "
            f"needed ({files.ROOT_HINT})"))
    names, attr_names, values = parse_attr("celeba-hair", attr)
    partition = parse_partition("celeba-hair", part)
    _, keep = _labels("hair", attr_names, values, "celeba-hair", attr)
    which = np.array([partition.get(n, -1) for n in names])
    return int((keep & (which >= 0) & (which <= 1)).sum()), int((keep & (which == 2)).sum())


def load_celeba_gender(root: str | os.PathLike | None = None, **kw) -> ImageData:
    """CelebA 64x64, Male -> (female, male); train = train+valid, test = test partition (local files: <root>/celeba)."""
    return load("gender", 64, root, **kw)


def load_celeba_gender_32(root: str | os.PathLike | None = None, **kw) -> ImageData:
    """CelebA 32x32, Male -> (female, male) (local files: <root>/celeba)."""
    return load("gender", 32, root, **kw)


def load_celeba_hair(root: str | os.PathLike | None = None, **kw) -> ImageData:
    """CelebA 64x64, hair black / blonde / brown, exactly one of the three (local files: <root>/celeba)."""
    return load("hair", 64, root, **kw)


def load_celeba_hair_32(root: str | os.PathLike | None = None, **kw) -> ImageData:
    """CelebA 32x32, hair black / blonde / brown (local files: <root>/celeba)."""
    return load("hair", 32, root, **kw)
