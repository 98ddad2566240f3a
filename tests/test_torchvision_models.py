"""torchvision's Mask R-CNN and Keypoint R-CNN train from `format="torchvision"` batches with zero lines of
glue (issue 30's goal): the batch goes into the model as it comes out of the Loader. Runs where torchvision is
importable (not beside the pinned CPU torch of the dev machine: skipped there; the GPU machine's image has
it), on CUDA when there is a device. No weights are downloaded (weights=None, weights_backbone=None)."""
import pytest
import torch

import dsc
from dsc import transforms as T

tv = pytest.importorskip("torchvision")
from torchvision.models import detection as D  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def people(tmp_path_factory):
    from dsc.synthetic import write_coco_instances

    root = tmp_path_factory.mktemp("tvmodels")
    ann, images = write_coco_instances(root / "src", n=8, seed=4)
    dsc.compile_coco(ann, images, root / "out", masks="instance", progress=False, workers=1)  # native sizes
    return dsc.open(root / "out")


def _train(model, loader, steps=3):
    model.to(DEVICE).train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    losses = []
    for k, (images, targets) in enumerate(loader):
        loss = sum(model(images, targets).values())  # no glue: the Loader's images and targets as they are
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
        if k + 1 == steps:
            break
    return losses


def test_mask_rcnn_trains_from_dsc_batches(people):
    loader = dsc.Loader(people, batch_size=2, order="random", format="torchvision", device=DEVICE,
                        transforms=[T.RandomHorizontalFlip()])  # flip at native size: the model resizes
    images, targets = next(iter(loader))
    assert all(t["masks"].dtype == torch.uint8 and t["masks"].shape[0] == len(t["boxes"]) for t in targets)
    model = D.maskrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=len(people.classes) + 1,
                                    min_size=64, max_size=128)
    losses = _train(model, loader)
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))


def test_keypoint_rcnn_trains_from_dsc_batches(people):
    loader = dsc.Loader(people, batch_size=2, order="random", format="torchvision", device=DEVICE,
                        transforms=[T.RandomHorizontalFlip()])
    images, targets = next(iter(loader))
    assert all(t["keypoints"].shape[1:] == (17, 3) for t in targets)
    model = D.keypointrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=len(people.classes) + 1,
                                        num_keypoints=17, min_size=64, max_size=128)
    losses = _train(model, loader)
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
