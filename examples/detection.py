"""Train torchvision's Faster R-CNN (MobileNetV3-Large 320 FPN) for a few steps from a dsc dataset.

Install torchvision beside dsc: ``pip install torch==2.14.1 torchvision==0.29.1`` (the pair this was run
with on CPU; any matching pair works). Data and commands: examples/README.md ("Detection").

The only dsc lines are the two that open the dataset and build the loader: ``format="torchvision"`` hands
out ``(images, targets)`` as torchvision's detection models take them (a list of float (3, H, W) images in
[0, 1] at their own sizes, and per image ``{"boxes": float32 (k, 4) xyxy, "labels": int64 (k,), ...}``
with labels 1-based: 0 is the background, label k is ``loader.classes[k]``).
"""
import argparse
import time

import torch
import torchvision

import dsc
from dsc import transforms as T

parser = argparse.ArgumentParser(description="Faster R-CNN from a dsc dataset")
parser.add_argument("data", help="a detection dataset compiled by dsc (dsc compile coco / voc / yolo)")
parser.add_argument("--steps", type=int, default=10, help="training steps (default: 10)")
parser.add_argument("-b", "--batch-size", type=int, default=4)
parser.add_argument("-j", "--workers", type=int, default=2, help="loader threads (0: the main thread)")
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--letterbox", type=int, default=None, metavar="SIZE",
                    help="train at SIZE x SIZE (Letterbox + random flip; images then come as one tensor); "
                         "default: native sizes, no augmentation")


def main():
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)

    ds = dsc.open(args.data)
    ops = [T.Letterbox(args.letterbox), T.RandomHorizontalFlip()] if args.letterbox else None
    loader = dsc.Loader(ds, batch_size=args.batch_size, order="random", num_threads=args.workers, device=device,
                        transforms=ops, format="torchvision")
    print(f"{ds}: classes {loader.classes}")

    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=len(loader.classes)).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=args.lr, momentum=0.9, weight_decay=1e-4)

    model.train()
    step, t0 = 0, time.time()
    while step < args.steps:
        for images, targets in loader:  # each new iteration is the next epoch (new order)
            loss_dict = model(images, targets)
            loss = sum(loss_dict.values())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            print(f"step {step:3d}  loss {loss.item():.4f}  "
                  + "  ".join(f"{k} {v.item():.3f}" for k, v in loss_dict.items()))
            if step == args.steps:
                break
    model.eval()
    with torch.no_grad():
        images, targets = next(iter(loader))
        out = model(images)
    print(f"{step} steps in {time.time() - t0:.1f} s; eval on {len(out)} images: "
          f"{sum(len(o['boxes']) for o in out)} boxes predicted, {sum(len(t['boxes']) for t in targets)} annotated")


if __name__ == "__main__":
    main()
