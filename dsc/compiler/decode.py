"""Decode one image file to a PIL image in the stored mode, EXIF orientation applied once.

Every PIL mode is handled explicitly:

* 16-bit and 32-bit integer grayscale (``I;16*``, ``I``) are scaled to 8 bits by keeping the high
  byte (``v >> 8``), not clipped: PIL's own conversion would saturate them to white;
* anything with alpha (RGBA, LA, PA, palette, grayscale (16-bit too) or RGB with a transparency key) is
  composited over ``background`` (default white), so hidden pixels under alpha = 0 never leak into the
  sample; a 16-bit key is compared with the full 16-bit values;
* palette, 1-bit, CMYK, YCbCr, LAB, HSV images go through PIL's ``convert``;
* 32-bit float images (``F``) are refused: their value range is not defined by the file.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import NamedTuple

import numpy as np
from PIL import Image, ImageFile, ImageOps

from ..errors import CredentialsError, DscError, ImageDecodeError
from .sources.inputs import identity, is_remote, read_bytes
from .capture import LOCK

ORIENTATION_TAG = 0x0112
_ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}
_WIDE_GRAY = {"I;16", "I;16L", "I;16B", "I;16N", "I"}


def _to_mode(im: Image.Image, mode: str, background: tuple[int, int, int]) -> Image.Image:
    if im.mode == "F":
        raise ValueError("32-bit float images (PIL mode F) have no defined 8-bit range; convert them first")
    if im.mode in _WIDE_GRAY:  # the high byte, without widening the pixels first (bounded memory)
        wide = np.asarray(im)
        key = im.info.get("transparency")
        alpha = np.where(wide == key, np.uint8(0), np.uint8(255)) if isinstance(key, int) else None
        if wide.dtype.kind == "i":  # mode I (int32): negative values are 0, past 16 bits saturate
            wide = np.clip(wide, 0, 65535)
        im = Image.fromarray((wide >> 8).astype(np.uint8), "L")
        if alpha is not None:  # a tRNS key: transparent where the full value equals it (then composited)
            im.putalpha(Image.fromarray(alpha, "L"))
    if im.mode in _ALPHA_MODES or "transparency" in im.info:
        rgba = im.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, tuple(background) + (255,))
        im = Image.alpha_composite(canvas, rgba)
    if im.mode != mode:
        if mode == "L" and im.mode not in ("RGB", "RGBA", "L", "1"):
            im = im.convert("RGB")  # CMYK, palette, YCbCr...: grey is the luma of the colours shown
        im = im.convert(mode)
    return im


def in_mode(im, mode: str) -> bool:
    """Whether a Python dataset's image is already as stored: in memory (not a lazily opened file), in ``mode``,
    nothing transparent. Then there is nothing to convert, and nothing that could print: :func:`to_mode` and
    the capture of what decoders say are skipped (a visible share of a tiny sample's compile)."""
    return (isinstance(im, Image.Image) and not isinstance(im, ImageFile.ImageFile) and im.mode == mode
            and "transparency" not in im.info)


def array_in_mode(arr, mode: str) -> bool:
    """Whether a Python dataset's image array (``sources.dataset.as_decoded``) is the stored pixels as they are: a
    uint8 (H, W, 3) array when the mode is RGB, (H, W) when it is L. ``Image.fromarray`` of it would be an image
    :func:`in_mode`, whose pixels read back are this array, so it is stored without making one."""
    return (isinstance(arr, np.ndarray) and arr.dtype == np.uint8
            and (arr.ndim == 3 and arr.shape[2] == 3 if mode == "RGB" else mode == "L" and arr.ndim == 2))


def to_mode(im: Image.Image, mode: str, background: tuple[int, int, int], where: str) -> Image.Image:
    """An image from a Python dataset in the stored mode; errors name ``where``. One not loaded yet (a
    lazily opened file) is loaded under dsc's rules (:func:`pil_rules`): all of it, or an error."""
    try:
        with pil_rules():
            return _to_mode(im, mode, background)
    except Exception as e:
        raise ImageDecodeError(where, f"cannot convert image: {e}") from None


DEFAULT_MAX_PIXELS = 89_478_485  # PIL's decompression-bomb threshold (Image.MAX_IMAGE_PIXELS' default)
_KEEP = object()


@contextmanager
def pil_rules(max_image_pixels=_KEEP):
    """Pillow's process-wide settings as dsc decodes, for the block, restored after:

    * ``ImageFile.LOAD_TRUNCATED_IMAGES`` off, whatever the calling process set: a truncated or damaged
      file is an error (a recorded skip), never an image with its missing rows left black;
    * ``Image.MAX_IMAGE_PIXELS`` as given (None: off, while dsc applies its own limit, ``--max-pixels``,
      so that one setting decides); by default PIL's own.

    Held under the decode lock (``capture.LOCK``): the settings belong to the whole process."""
    with LOCK:
        saved = ImageFile.LOAD_TRUNCATED_IMAGES, Image.MAX_IMAGE_PIXELS
        ImageFile.LOAD_TRUNCATED_IMAGES = False
        if max_image_pixels is not _KEEP:
            Image.MAX_IMAGE_PIXELS = max_image_pixels
        try:
            yield
        finally:
            ImageFile.LOAD_TRUNCATED_IMAGES, Image.MAX_IMAGE_PIXELS = saved


def failure(e: Exception, obj) -> str:
    """PIL's message for a file it could not read, for a reason beside the file's name: without the repr
    PIL names an in-memory file by (``<_io.BytesIO object at 0x...>``), which says nothing and changes
    from run to run."""
    reason = str(e) or type(e).__name__
    return reason if isinstance(obj, str) else reason.replace(f" {obj!r}", "").replace(repr(obj), "")


def is_empty(obj) -> bool:
    """Whether a path or a binary file holds no bytes (PIL would only say it cannot identify it)."""
    import os

    if isinstance(obj, str):
        try:
            return os.stat(obj).st_size == 0
        except (OSError, ValueError):
            return False
    if hasattr(obj, "getbuffer"):
        return obj.getbuffer().nbytes == 0
    return False


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

    if is_remote(path):  # an object in a bucket (a source's input by URL)
        return _read_object(path, what)
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
    found = identity(container) if container else None
    if found is not None:
        _, mtime, ctime, ino = found
    return len(data), mtime, ctime, ino, google_crc32c.value(data)


def _read_object(url: str, what: str) -> tuple[bytes, tuple[int, int, int, int, int]]:
    """An input in object storage, read whole, and its fingerprint (its ETag stands for the inode)."""
    import google_crc32c

    found = identity(url)
    if found is None:
        raise ImageDecodeError(url, f"cannot read the {what}: no such object")
    if found[0] > MAX_INPUT_BYTES:
        raise ImageDecodeError(url, f"{found[0]:,} bytes is more than an {what} file dsc reads ({MAX_INPUT_BYTES:,})")
    try:
        data = read_bytes(url, MAX_INPUT_BYTES)
    except FileNotFoundError:
        raise ImageDecodeError(url, f"cannot read the {what}: no such object") from None
    except DscError as e:
        if isinstance(e, CredentialsError):
            raise
        raise ImageDecodeError(url, f"cannot read the {what}: {e}") from None
    size, mtime, ctime, ino = found
    return data, (len(data), mtime, ctime, ino, google_crc32c.value(data))


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


def _orientation(im: Image.Image) -> int:
    """The image's EXIF orientation: 1 when absent, out of range or unreadable (a damaged EXIF block must
    not hide the pixels)."""
    try:
        orientation = int(im.getexif().get(ORIENTATION_TAG, 1))
    except Exception:  # noqa: BLE001 - PIL raises many types for a bad EXIF block
        return 1
    return orientation if orientation in range(1, 9) else 1


def decode_image(path, mode: str = "RGB", background: tuple[int, int, int] = (255, 255, 255),
                 draft_for=None, max_pixels: int | None = None) -> Decoded:
    """Decode one image file: the pixels of a load that completed without error, oriented as
    ``ImageOps.exif_transpose`` orients the freshly opened file, in the stored mode.

    ``draft_for(h, w) -> (h, w)``: the resolution the caller needs for a full image of (h, w); a JPEG is
    then decoded with DCT scaling (1/2, 1/4 or 1/8) to the smallest size at least that large, and the
    returned image is smaller than the full size and left in the file's orientation (``Decoded.pending``).
    ``path`` may be a path or a binary file object.
    Any failure becomes :class:`ImageDecodeError` naming the file, a load error anywhere included
    (``LOAD_TRUNCATED_IMAGES`` is off while dsc decodes, see :func:`pil_rules`). An image of more than
    ``max_pixels`` (default :data:`DEFAULT_MAX_PIXELS`, PIL's own decompression-bomb limit) is refused from
    its header, before any decoding; that one setting decides (PIL's is lifted meanwhile).

    The orientation is read after the load (a PNG may carry its EXIF after the pixels, and reading it
    loads them), except where it is needed before: for a JPEG draft (it decides the draft's size), and
    for a TIFF, whose load applies the orientation itself and then forgets it (``Decoded.orientation``
    is still the file's, so boxes and masks in its raw frame turn with it).
    """
    name = path if isinstance(path, str) else getattr(path, "name", "<bytes>")
    if isinstance(path, str):
        check_regular(path)
    if is_empty(path):
        raise ImageDecodeError(name, "the file is empty (0 bytes); replace it with the image, or remove it")
    limit = max_pixels or DEFAULT_MAX_PIXELS
    try:
        with pil_rules(max_image_pixels=None), Image.open(path) as im:
            raw_w, raw_h = im.size
            if raw_w * raw_h > limit:  # from the header, before any decoding
                raise ImageDecodeError(name, f"{raw_w}x{raw_h} = {raw_w * raw_h:,} pixels is more than the "
                                             f"{limit:,} allowed; raise --max-pixels (max_pixels=) if the image is "
                                             f"genuine")
            drafting = draft_for is not None and im.format == "JPEG"
            first = _orientation(im) if drafting or im.format == "TIFF" else None
            scale = 1
            if drafting:
                swapped = first in SWAPS_AXES
                full = (raw_w, raw_h) if swapped else (raw_h, raw_w)  # displayed (h, w)
                need_h, need_w = draft_for(*full)
                drafted = im.draft(im.mode, (need_h, need_w) if swapped else (need_w, need_h))
                if drafted is not None:  # box = (0, 0, raw_w / scale, raw_h / scale)
                    scale = round(raw_w / drafted[1][2])
            im.load()  # the whole image, or an error naming the file
            if scale != 1:
                return Decoded(_to_mode(im, mode, background), first, full, scale)
            left = _orientation(im)  # what exif_transpose would still apply (a TIFF's load applied its own)
            shown = ImageOps.exif_transpose(im) if left != 1 else im
            orientation = left if left != 1 or first is None else first
            return Decoded(_to_mode(shown, mode, background), orientation, (shown.height, shown.width))
    except ImageDecodeError:
        raise
    except MemoryError:
        raise
    except Exception as e:  # PIL raises many types for bad files: OSError, SyntaxError, ValueError, ...
        raise ImageDecodeError(name, f"cannot decode image: {failure(e, path)}") from None
