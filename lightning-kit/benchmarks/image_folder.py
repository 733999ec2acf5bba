"""The image folder reader's speed, for the library's maintainers: it is not installed with lightning-kit.

    python benchmarks/image_folder.py 10000

Writes N generated JPEG and PNG images of 48-128 px, like small photos, lists, decodes and resizes them to
32x32 with the cache written (``lightning_kit.data``'s reader, which ``ImageFolderDataModule`` uses), then
reads them again from the cache. The files were just written, so the operating system has them in memory:
this times decoding and the cache, not the disk.
"""

import argparse
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from lightning_kit.data.image_decoding import load_images
from lightning_kit.data.image_files import list_labelled_images

CLASSES = 10
SIDES = (48, 128)  # smallest and largest side, in pixels
SIZE = 32  # the side the images are resized to, as CIFAR-10's
# The images are written to a temporary folder first (about 20 kB each): a count without bound filled the disk,
# and the writers' queue, the memory.
MOST_IMAGES = 1_000_000


def write_image_folder(root: Path, count: int, seed: int = 0) -> None:
    """Write ``count`` images like small photos into ``root/<class>/``: half JPEG, half PNG, each its own size.

    Each is a smooth random colour field with fine grain, so that both formats compress it about as much as they
    would a photograph. Each image has its own random numbers, so the folder is the same however the threads
    that write them take turns.
    """
    folders = [root / f"class_{label}" for label in range(CLASSES)]
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)

    def write(index: int) -> None:
        rng = np.random.default_rng([seed, index])
        width, height = (int(side) for side in rng.integers(SIDES[0], SIDES[1] + 1, 2))
        field = Image.fromarray(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8))
        field = np.asarray(field.resize((width, height), Image.Resampling.BILINEAR))
        pixels = (field + rng.normal(0, 12, field.shape)).clip(0, 255).astype(np.uint8)
        path = folders[index // 2 % CLASSES] / f"{index:06d}{'.jpg' if index % 2 else '.png'}"
        Image.fromarray(pixels).save(path, quality=90)

    with ThreadPoolExecutor(os.cpu_count()) as pool:
        list(pool.map(write, range(count)))


def image_folder_benchmark(count: int) -> None:
    """Time listing and decoding ``count`` generated images with the cache written, then reading them from it."""
    with tempfile.TemporaryDirectory() as scratch:
        root, cache = Path(scratch, "images"), Path(scratch, "cache")
        write_image_folder(root, count)
        seconds, results = [], []
        for _ in ("first", "cached"):
            start = time.perf_counter()
            results.append(load_images(list_labelled_images(root).files, SIZE, cache_dir=cache))
            seconds.append(time.perf_counter() - start)
    (first, _), (cached, _) = results
    if not torch.equal(first, cached):
        raise RuntimeError("the images read from the cache differ from the decoded ones")
    jpeg = count // 2
    print(
        f"image folder: {count:,} images ({jpeg:,} JPEG, {count - jpeg:,} PNG) of {SIDES[0]}-{SIDES[1]} px in "
        f"{CLASSES} classes, resized to {SIZE}x{SIZE} in {os.cpu_count()} threads, torch {torch.__version__}"
    )
    print(f"first load: list, decode, resize, write cache {seconds[0]:>9.3f} s {count / seconds[0]:>12,.0f} images/s")
    print(f"cached load: list, check, read cache          {seconds[1]:>9.3f} s")
    print(f"    ratio first/cached                        {seconds[0] / seconds[1]:>9.1f}")


def _count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MOST_IMAGES:
        raise argparse.ArgumentTypeError(f"expected a positive number of images, at most {MOST_IMAGES:,}, got {text!r}")
    return int(text)


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("count", type=_count, help="how many images to generate and read")
    image_folder_benchmark(parser.parse_args(args).count)


if __name__ == "__main__":
    main()
