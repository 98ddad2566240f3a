"""Train torchvision's LR-ASPP (MobileNetV3-Large) for a few steps from a dsc segmentation dataset.

Install torchvision beside dsc: ``pip install torch==2.14.1 torchvision==0.29.1`` (the pair this was run
with on CPU; any matching pair works). Data and commands: examples/README.md ("Segmentation").

The only dsc lines are the two that open the dataset and build the loader: ``format="torchvision"`` hands
out ``(images, target)``: float (B, 3, H, W) images (normalised here by the loader's transforms) and the
masks as int64 (B, H, W) class ids, with ``ds.ignore_index`` (255) where no class applies, what
``cross_entropy(..., ignore_index=)`` takes. ``ds.mask_classes[v]`` names mask value v.
"""
import argparse
import time

import torch
import torch.nn.functional as F
import torchvision

import dsc
from dsc import transforms as T

parser = argparse.ArgumentParser(description="LR-ASPP from a dsc dataset")
parser.add_argument("data", help="a segmentation dataset compiled by dsc (dsc compile voc --masks / segfolder)")
parser.add_argument("--steps", type=int, default=10, help="training steps (default: 10)")
parser.add_argument("-b", "--batch-size", type=int, default=4)
parser.add_argument("-j", "--workers", type=int, default=2, help="loader threads (0: the main thread)")
parser.add_argument("--crop", type=int, default=160, help="training crop size (default: 160)")
parser.add_argument("--lr", type=float, default=0.01)


def main():
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)

    ds = dsc.open(args.data)
    loader = dsc.Loader(ds, batch_size=args.batch_size, order="random", num_threads=args.workers, device=device,
                        format="torchvision", transforms=[
                            T.RandomResizedCrop(args.crop, scale=(0.25, 1.0)), T.RandomHorizontalFlip(),
                            T.ToFloat(), T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    print(f"{ds}: {len(ds.mask_classes)} classes, ignore index {ds.ignore_index}")

    model = torchvision.models.segmentation.lraspp_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=len(ds.mask_classes)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)

    model.train()
    step, t0 = 0, time.time()
    while step < args.steps:
        for images, target in loader:  # each new iteration is the next epoch (new order and crops)
            out = model(images)["out"]
            loss = F.cross_entropy(out, target, ignore_index=ds.ignore_index)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            labelled = target != ds.ignore_index
            acc = (out.argmax(1) == target)[labelled].float().mean().item()
            print(f"step {step:3d}  loss {loss.item():.4f}  pixel accuracy {acc:.3f}")
            if step == args.steps:
                break
    print(f"{step} steps in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
