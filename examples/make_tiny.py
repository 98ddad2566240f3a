"""Write tiny generated datasets for the examples (seconds on a CPU; nothing is downloaded).

    python examples/make_tiny.py tiny

makes ``tiny/imagenet/{train,val}`` (an ImageFolder of 6 classes: scenes of random sizes),
``tiny/coco`` (COCO detection: ``annotations.json`` + ``images/``, 3 classes, some images without boxes)
and ``tiny/voc`` (a segmentation-only VOC set: ``JPEGImages``, ``SegmentationClass``,
``ImageSets/Segmentation/train.txt``, no annotation XML). examples/README.md has the commands that
compile them with dsc and train on them.
"""
import shutil
import sys
from pathlib import Path

from dsc.synthetic import detection_scenes, write_coco, write_imagefolder, write_voc_segmentation


def main(root: str) -> None:
    root = Path(root)
    write_imagefolder(root / "imagenet" / "train", num_classes=6, per_class=16, size_range=(96, 320), seed=0)
    write_imagefolder(root / "imagenet" / "val", num_classes=6, per_class=5, size_range=(96, 320), seed=1)
    write_coco(root / "coco", detection_scenes(24, seed=0, size_range=(160, 320)))
    voc = write_voc_segmentation(root / "voc", detection_scenes(16, seed=1, size_range=(160, 320), ext=".jpg"))
    shutil.rmtree(voc / "Annotations")  # segmentation only: masks, no boxes
    print(f"wrote {root}/imagenet, {root}/coco and {root}/voc")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tiny")
