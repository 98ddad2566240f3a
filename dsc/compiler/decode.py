"""Decode one image file to a PIL image in the stored mode, EXIF orientation applied.

Every PIL mode is handled explicitly:

* 16-bit and 32-bit integer grayscale (``I;16*``, ``I``) are scaled to 8 bits by keeping the high
  byte (``v >> 8``), not clipped: PIL's own conversion would saturate them to white;
* anything with alpha (RGBA, LA, PA, palette or grayscale with a transparency key) is composited over
  ``background`` (default white), so hidden pixels under alpha = 0 never leak into the sample;
* palette, 1-bit, CMYK, YCbCr, LAB, HSV images go through PIL's ``convert``;
* 32-bit float images (``F``) are refused: their value range is not defined by the file.
"""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageOps

from ..errors import ImageDecodeError

ORIENTATION_TAG = 0x0112
_ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}
_WIDE_GRAY = {"I;16", "I;16L", "I;16B", "I;16N", "I"}


def _to_mode(im: Image.Image, mode: str, background: tuple[int, int, int]) -> Image.Image:
    if im.mode == "F":
        raise ValueError("32-bit float images (PIL mode F) have no defined 8-bit range; convert them first")
    if im.mode in _WIDE_GRAY:
        wide = np.asarray(im).astype(np.int64)
        im = Image.fromarray((np.clip(wide, 0, 65535) >> 8).astype(np.uint8), "L")
    if im.mode in _ALPHA_MODES or "transparency" in im.info:
        rgba = im.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, tuple(background) + (255,))
        im = Image.alpha_composite(canvas, rgba)
    if im.mode != mode:
        im = im.convert("RGB").convert(mode) if mode == "L" and im.mode not in ("RGB", "RGBA", "L", "1") \
            else im.convert(mode)
    return im


def decode_image(path: str, mode: str = "RGB",
                 background: tuple[int, int, int] = (255, 255, 255)) -> tuple[Image.Image, int]:
    """Return (image in ``mode`` with EXIF orientation applied, the orientation tag that was applied).

    Any failure becomes :class:`ImageDecodeError` naming the file; PIL's decompression-bomb limit
    (``Image.MAX_IMAGE_PIXELS``) stays in force.
    """
    try:
        with Image.open(path) as im:
            try:
                orientation = int(im.getexif().get(ORIENTATION_TAG, 1))
            except Exception:  # a damaged EXIF block must not hide the pixels; treat as upright
                orientation = 1
            if orientation not in range(1, 9):
                orientation = 1
            im.load()
            if orientation != 1:
                im = ImageOps.exif_transpose(im)
            return _to_mode(im, mode, background), orientation
    except ImageDecodeError:
        raise
    except Image.DecompressionBombError as e:
        raise ImageDecodeError(path, f"refused as a decompression bomb ({e}); raise PIL.Image.MAX_IMAGE_PIXELS "
                                     f"if the image is genuine") from None
    except MemoryError:
        raise
    except Exception as e:  # PIL raises many types for bad files: OSError, SyntaxError, ValueError, ...
        reason = str(e) or type(e).__name__
        raise ImageDecodeError(path, f"cannot decode image: {reason}") from None
