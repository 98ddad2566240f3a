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

from typing import NamedTuple

import numpy as np
from PIL import Image, ImageOps

from ..errors import ImageDecodeError

ORIENTATION_TAG = 0x0112
_ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}
_WIDE_GRAY = {"I;16", "I;16L", "I;16B", "I;16N", "I"}


def _to_mode(im: Image.Image, mode: str, background: tuple[int, int, int]) -> Image.Image:
    if im.mode == "F":
        raise ValueError("32-bit float images (PIL mode F) have no defined 8-bit range; convert them first")
    if im.mode in _WIDE_GRAY:  # the high byte, without widening the pixels first (bounded memory)
        wide = np.asarray(im)
        if wide.dtype.kind == "i":  # mode I (int32): negative values are 0, past 16 bits saturate
            wide = np.clip(wide, 0, 65535)
        im = Image.fromarray((wide >> 8).astype(np.uint8), "L")
    if im.mode in _ALPHA_MODES or "transparency" in im.info:
        rgba = im.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, tuple(background) + (255,))
        im = Image.alpha_composite(canvas, rgba)
    if im.mode != mode:
        if mode == "L" and im.mode not in ("RGB", "RGBA", "L", "1"):
            im = im.convert("RGB")  # CMYK, palette, YCbCr...: grey is the luma of the colours shown
        im = im.convert(mode)
    return im


def to_mode(im: Image.Image, mode: str, background: tuple[int, int, int], where: str) -> Image.Image:
    """An already decoded image (from a Python dataset) in the stored mode; errors name ``where``."""
    try:
        return _to_mode(im, mode, background)
    except Exception as e:
        raise ImageDecodeError(where, f"cannot convert image: {e}") from None


DEFAULT_MAX_PIXELS = 89_478_485  # PIL's decompression-bomb threshold (Image.MAX_IMAGE_PIXELS' default)
_limit_lock = __import__("threading").Lock()


class _pil_limit:
    """PIL's own decompression-bomb check off while dsc applies its limit (``--max-pixels``), so one
    setting decides; restored after. PIL's limit is process-wide, hence the lock."""

    def __init__(self, value):
        self.value = value

    def __enter__(self):
        _limit_lock.acquire()
        self.saved, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, self.value

    def __exit__(self, *exc):
        Image.MAX_IMAGE_PIXELS = self.saved
        _limit_lock.release()


def check_regular(path: str) -> None:
    """Only regular files are decoded: a FIFO (or a device) named like an image would block the worker."""
    import os
    import stat

    try:
        mode = os.stat(path).st_mode
    except ValueError:
        raise ImageDecodeError(path, "the file name holds a NUL character") from None
    except OSError:
        return  # missing, or unreadable: PIL's open reports it, naming the file
    if not stat.S_ISREG(mode):
        raise ImageDecodeError(path, "not a regular file")


SWAPS_AXES = (5, 6, 7, 8)  # EXIF orientations that turn the image by 90 degrees
MAX_INPUT_BYTES = 2 << 30  # an encoded image (or mask) file larger than this is not read
NO_INPUT = (0, 0, 0, 0, 0)  # the fingerprint of an input that is not a file's bytes (a decoded image)


def read_input_file(path: str, what: str = "image") -> tuple[bytes, tuple[int, int, int, int, int]]:
    """The bytes of an input file and its fingerprint (size, mtime_ns, ctime_ns, inode, crc32c of the
    bytes): what ``--update`` compares to know whether the input changed."""
    import os

    import google_crc32c

    check_regular(path)
    try:
        st = os.stat(path)
        if st.st_size > MAX_INPUT_BYTES:
            raise ImageDecodeError(path, f"{st.st_size:,} bytes is more than an {what} file dsc reads "
                                         f"({MAX_INPUT_BYTES:,})")
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ImageDecodeError(path, f"cannot read the {what} file: {e.strerror or e}") from None
    return data, (len(data), st.st_mtime_ns, st.st_ctime_ns, st.st_ino, google_crc32c.value(data))


def bytes_fingerprint(data: bytes, container: str | None = None) -> tuple[int, int, int, int, int]:
    """The fingerprint of an input that is bytes inside another file (a table cell): its size and crc32c,
    with the containing file's times and inode (a table file unchanged since means an unchanged cell)."""
    import os

    import google_crc32c

    mtime = ctime = ino = 0
    if container:
        try:
            st = os.stat(container)
            mtime, ctime, ino = st.st_mtime_ns, st.st_ctime_ns, st.st_ino
        except (OSError, ValueError):
            pass
    return len(data), mtime, ctime, ino, google_crc32c.value(data)


class Decoded(NamedTuple):
    image: Image.Image  # in the stored mode; EXIF orientation applied, except to a draft (see ``pending``)
    orientation: int  # the image's EXIF orientation tag (1: upright)
    full: tuple[int, int]  # (height, width) of the full image as displayed
    scale: int = 1  # JPEG DCT scaling: ``image`` is the full image reduced 1/scale (its pixel x = full scale*x)

    @property
    def pending(self) -> int:
        """The orientation still to apply, after resampling (``orient_array``): a draft keeps the file's."""
        return self.orientation if self.scale != 1 else 1


def orient_array(arr: np.ndarray, orientation: int) -> np.ndarray:
    """Apply EXIF ``orientation`` to an (H, W[, C]) array: what ``ImageOps.exif_transpose`` does to an
    image, as a view. A JPEG draft is resampled in the file's orientation and oriented afterwards: its
    partly-image last block row and column must stay at the far edges for the draft's scale to be exact."""
    if orientation in SWAPS_AXES:  # transpose, then flip as the orientation says
        arr = arr.swapaxes(0, 1)
        flips = {5: (), 6: (1,), 7: (0, 1), 8: (0,)}[orientation]
    else:
        flips = {1: (), 2: (1,), 3: (0, 1), 4: (0,)}[orientation]
    return np.flip(arr, flips) if flips else arr


def decode_image(path, mode: str = "RGB", background: tuple[int, int, int] = (255, 255, 255),
                 draft_for=None, max_pixels: int | None = None) -> Decoded:
    """Decode one image file.

    ``draft_for(h, w) -> (h, w)``: the resolution the caller needs for a full image of (h, w); a JPEG is
    then decoded with DCT scaling (1/2, 1/4 or 1/8) to the smallest size at least that large, and the
    returned image is smaller than the full size and left in the file's orientation (``Decoded.pending``). ``path`` may be a path or a binary file object.
    Any failure becomes :class:`ImageDecodeError` naming the file. An image of more than ``max_pixels``
    (default :data:`DEFAULT_MAX_PIXELS`, PIL's own decompression-bomb limit) is refused from its header,
    before any decoding; that one setting decides (PIL's is lifted for the open).
    """
    name = path if isinstance(path, str) else getattr(path, "name", "<bytes>")
    if isinstance(path, str):
        check_regular(path)
    limit = max_pixels or DEFAULT_MAX_PIXELS
    try:
        with _pil_limit(None):  # only Image.open checks PIL's limit; dsc's own is applied below, from the header
            opened = Image.open(path)
        with opened as im:
            try:
                orientation = int(im.getexif().get(ORIENTATION_TAG, 1))
            except Exception:  # a damaged EXIF block must not hide the pixels; treat as upright
                orientation = 1
            if orientation not in range(1, 9):
                orientation = 1
            swapped = orientation in SWAPS_AXES
            raw_w, raw_h = im.size
            if raw_w * raw_h > limit:  # from the header, before any decoding
                raise ImageDecodeError(name, f"{raw_w}x{raw_h} = {raw_w * raw_h:,} pixels is more than the "
                                             f"{limit:,} allowed; raise --max-pixels (max_pixels=) if the image is "
                                             f"genuine")
            full = (raw_w, raw_h) if swapped else (raw_h, raw_w)  # displayed (h, w)
            scale = 1
            if draft_for is not None and im.format == "JPEG":
                need_h, need_w = draft_for(*full)
                drafted = im.draft(im.mode, (need_h, need_w) if swapped else (need_w, need_h))
                if drafted is not None:  # box = (0, 0, raw_w / scale, raw_h / scale)
                    scale = round(raw_w / drafted[1][2])
            im.load()
            if orientation != 1 and scale == 1:
                im = ImageOps.exif_transpose(im)
            return Decoded(_to_mode(im, mode, background), orientation, full, scale)
    except ImageDecodeError:
        raise
    except Image.DecompressionBombError as e:
        raise ImageDecodeError(name, f"refused as a decompression bomb ({e}); raise --max-pixels (max_pixels=) if "
                                     f"the image is genuine") from None
    except MemoryError:
        raise
    except Exception as e:  # PIL raises many types for bad files: OSError, SyntaxError, ValueError, ...
        reason = str(e) or type(e).__name__
        if not isinstance(path, str):  # PIL names an in-memory file by its repr: say what it is instead
            reason = reason.replace(repr(path), "(image bytes)")
        raise ImageDecodeError(name, f"cannot decode image: {reason}") from None
