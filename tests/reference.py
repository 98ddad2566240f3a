"""Reference decode + resize, written independently of dsc's compiler from PIL primitives and the
documented torchvision rules, so the tests compare dsc against the spec, not against itself."""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageOps

def ref_decode(path, mode="RGB", background=(255, 255, 255)) -> Image.Image:
    """The documented rules on PIL's own full load: oriented exactly as ``ImageOps.exif_transpose`` orients
    the freshly opened file (which loads it first); 16-bit grey keeps its high byte, a 16-bit transparency key
    compared with the full values; alpha and transparency keys composited over ``background``."""
    im = ImageOps.exif_transpose(Image.open(path))
    if im.mode.startswith("I"):
        wide = np.asarray(im).astype(np.int64)
        key = im.info.get("transparency")
        im = Image.fromarray((wide.clip(0, 65535) >> 8).astype(np.uint8), "L")
        if isinstance(key, int):
            im = Image.merge("LA", [im, Image.fromarray(((wide != key) * 255).astype(np.uint8), "L")])
    if im.mode in ("RGBA", "LA", "PA") or "transparency" in im.info:
        im = Image.alpha_composite(Image.new("RGBA", im.size, (*background, 255)), im.convert("RGBA"))
    if mode == "L" and im.mode not in ("L", "1"):
        im = im.convert("RGB")
    return im.convert(mode)


def _arr(im):
    a = np.asarray(im)
    return a[:, :, None] if a.ndim == 2 else a


def ref_resize(im, nw, nh, resizer="pil") -> np.ndarray:
    """torchvision's Resize(antialias=True): on a PIL image (resizer "pil") or on a uint8 CHW tensor
    (resizer "torch"); an (H, W, C) array either way."""
    if resizer == "pil":
        return _arr(im.resize((nw, nh), Image.Resampling.BILINEAR))
    import torch
    import torch.nn.functional as F

    chw = torch.from_numpy(_arr(im).copy()).permute(2, 0, 1).contiguous()
    out = F.interpolate(chw[None], size=(nh, nw), mode="bilinear", antialias=True)[0]
    return out.permute(1, 2, 0).numpy()


def tv_resize_shorter(h, w, size):
    """torchvision.transforms.functional._compute_resized_output_size for an int size."""
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = size, int(size * long / short)
    new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
    return new_h, new_w


def ref_center_crop(im, th, tw, resizer="pil"):
    h, w = im.height, im.width
    if th == tw:
        nh, nw = tv_resize_shorter(h, w, th)
    else:
        s = max(th / h, tw / w)
        nh, nw = (th, max(tw, int(th * w / h))) if th / h >= tw / w else (max(th, int(tw * h / w)), tw)
        assert abs(nh - h * s) < 1.01 and abs(nw - w * s) < 1.01
    r = ref_resize(im, nw, nh, resizer)
    top, left = int(round((nh - th) / 2.0)), int(round((nw - tw) / 2.0))
    return np.ascontiguousarray(r[top:top + th, left:left + tw]), (nw / w, nh / h, -left, -top)


def ref_stretch(im, th, tw, resizer="pil"):
    return ref_resize(im, tw, th, resizer), (tw / im.width, th / im.height, 0, 0)


def ref_pad(im, th, tw, fill=0, resizer="pil"):
    h, w = im.height, im.width
    if tw / w <= th / h:
        nw, nh = tw, min(th, max(1, round(h * tw / w)))
    else:
        nh, nw = th, min(tw, max(1, round(w * th / h)))
    r = ref_resize(im, nw, nh, resizer)
    out = np.full((th, tw, r.shape[2]), fill, np.uint8)
    top, left = (th - nh) // 2, (tw - nw) // 2
    out[top:top + nh, left:left + nw] = r
    return out, (nw / w, nh / h, left, top)


def ref_max_side(im, max_side, resizer="pil"):
    h, w = im.height, im.width
    if max_side is None or max(h, w) <= max_side:
        return _arr(im), (1.0, 1.0, 0, 0)
    if w >= h:
        nh, nw = max(1, round(h * max_side / w)), max_side
    else:
        nh, nw = max_side, max(1, round(w * max_side / h))
    return ref_resize(im, nw, nh, resizer), (nw / w, nh / h, 0, 0)


def reference(path, *, size=None, resize="center-crop", max_side=None, mode="RGB", fill=0, resizer="pil"):
    im = ref_decode(path, mode)
    if size is None:
        return ref_max_side(im, max_side, resizer)
    th, tw = size
    if resize == "center-crop":
        return ref_center_crop(im, th, tw, resizer)
    if resize == "stretch":
        return ref_stretch(im, th, tw, resizer)
    return ref_pad(im, th, tw, fill, resizer)


def _nearest(mask: np.ndarray, nw: int, nh: int) -> np.ndarray:
    mode = "L" if mask.dtype == np.uint8 else "I"
    im = Image.fromarray(mask if mode == "L" else mask.astype(np.int32), mode)
    return np.asarray(im.resize((nw, nh), Image.Resampling.NEAREST)).astype(mask.dtype)


def ref_mask(mask: np.ndarray, *, size=None, resize="center-crop", max_side=None, ignore=255) -> np.ndarray:
    """A displayed-frame mask through the same geometry as ``reference`` gives the image, with PIL's
    nearest-neighbour resize and ``ignore`` as the letterbox padding."""
    h, w = mask.shape
    if size is None:
        if max_side is None or max(h, w) <= max_side:
            return mask
        nh, nw = (max(1, round(h * max_side / w)), max_side) if w >= h else (max_side, max(1, round(w * max_side / h)))
        return _nearest(mask, nw, nh)
    th, tw = size
    if resize == "stretch":
        return _nearest(mask, tw, th)
    if resize == "pad":
        if tw / w <= th / h:
            nw, nh = tw, min(th, max(1, round(h * tw / w)))
        else:
            nh, nw = th, min(tw, max(1, round(w * th / h)))
        out = np.full((th, tw), ignore, mask.dtype)
        top, left = (th - nh) // 2, (tw - nw) // 2
        out[top:top + nh, left:left + nw] = _nearest(mask, nw, nh)
        return out
    if th == tw:
        nh, nw = tv_resize_shorter(h, w, th)
    else:
        nh, nw = (th, max(tw, int(th * w / h))) if th / h >= tw / w else (max(th, int(tw * h / w)), tw)
    r = _nearest(mask, nw, nh)
    top, left = int(round((nh - th) / 2.0)), int(round((nw - tw) / 2.0))
    return r[top:top + th, left:left + tw]


def _aa_weights(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) weights of an antialiased bilinear resize along one axis: a triangle filter of radius
    max(1, n_in / n_out) input pixels around each output pixel centre, normalised to sum to one (the
    filter PIL and torch's ``antialias=True`` use), in float64."""
    scale = n_in / n_out
    support = max(scale, 1.0)
    W = np.zeros((n_out, n_in))
    for i in range(n_out):
        centre = (i + 0.5) * scale
        lo, hi = max(int(centre - support + 0.5), 0), min(int(centre + support + 0.5), n_in)
        j = np.arange(lo, hi)
        w = np.clip(1.0 - np.abs((j + 0.5 - centre) / support), 0, None)
        W[i, lo:hi] = w / w.sum()
    return W


def aa_resize(img: np.ndarray, h: int, w: int, round_between: bool = True) -> np.ndarray:
    """Antialiased bilinear resize of an (H, W, C) uint8 image to (h, w) in float64: the horizontal pass,
    then the vertical one. ``round_between``: round to uint8 between the passes, as PIL's and torch's uint8
    resamplers (so torchvision's resize on either) do; False: exact float math, rounded once."""
    Wy, Wx = _aa_weights(img.shape[0], h), _aa_weights(img.shape[1], w)
    x = img.astype(np.float64)
    t = np.matmul(Wx, x)  # (H, w, C): each row's pixels through the horizontal weights
    if round_between:
        t = np.clip(np.round(t), 0, 255)
    out = np.tensordot(Wy, t, axes=(1, 0))  # (h, w, C)
    return np.clip(np.round(out), 0, 255).astype(np.uint8)
