"""Decompression bombs (issue 32, item 4): an image whose header declares more pixels than
``SHARDLOADER_MAX_IMAGE_PIXELS`` is refused before it is decoded, on the exact path
(``ImageRecordDataset``) and on the fused path, with an error naming the record, the
declared size and the limit; the limit can be raised. And an undecodable image's error keeps
its reason. Fails on 047df2f.

The images here declare 2000x2000 pixels under a limit of 1,000,000 (set per test), so the
old code decodes them (12 MB) instead of allocating gigabytes."""

from __future__ import annotations

import struct
import time
import zlib

import cv2
import mxnet as mx
import numpy as np
import pytest
from mxnet.gluon.data.vision import transforms as T

from shardloader import RecordIOError, ShardedDataLoader, vision
from shardloader.recordio import ImageRecordDataset, _imagesize, pack_records

pytestmark = pytest.mark.timeout(60)

ENV = "SHARDLOADER_MAX_IMAGE_PIXELS"
LIMIT = 1_000_000


def _image(h: int = 48, w: int = 64) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.dstack([x * 4 % 256, y * 5 % 256, (x + y) % 256]).astype(np.uint8)


def _encode(ext: str, image: np.ndarray, *params: int) -> bytes:
    ok, buf = cv2.imencode(ext, image, list(params))
    assert ok
    return buf.tobytes()


def jpeg_declaring(height: int, width: int) -> bytes:
    """A small real JPEG whose frame header says ``height`` x ``width``."""
    data = bytearray(_encode(".jpg", _image()))
    i = 2
    while data[i + 1] not in (0xC0, 0xC1, 0xC2):
        i += 2 + struct.unpack_from(">H", data, i + 2)[0]
    struct.pack_into(">HH", data, i + 5, height, width)
    return bytes(data)


def png_declaring(height: int, width: int) -> bytes:
    """A small real PNG whose IHDR says ``height`` x ``width`` (its CRC made right again)."""
    data = bytearray(_encode(".png", _image()))
    struct.pack_into(">II", data, 16, width, height)
    struct.pack_into(">I", data, 29, zlib.crc32(bytes(data[12:29])))
    return bytes(data)


@pytest.fixture
def limit(monkeypatch):
    monkeypatch.setenv(ENV, str(LIMIT))
    return LIMIT


@pytest.fixture
def bombs(tmp_path):
    """A .rec: records 0-1 and 4 are fine, 2 is a PNG and 3 a JPEG declaring 2000x2000."""
    good = _encode(".jpg", _image())
    payloads = [good, good, png_declaring(2000, 2000), jpeg_declaring(2000, 2000), good]
    records = [
        mx.recordio.pack(mx.recordio.IRHeader(0, float(i), i, 0), p) for i, p in enumerate(payloads)
    ]
    rec, _ = pack_records(str(tmp_path / "bombs.rec"), records)
    return rec


def _assert_refused(message: str, record: int) -> None:
    assert f"record {record} " in message, message
    assert "declares a 2000x2000 image (4,000,000 pixels)" in message, message
    assert "above the limit of 1,000,000 pixels" in message and ENV in message, message


# -- reading headers ---------------------------------------------------------------------------


@pytest.mark.parametrize("ext", [".jpg", ".png", ".bmp", ".webp", ".ppm", ".pgm"])
@pytest.mark.parametrize("shape", [(48, 64), (17, 33), (1, 1)])
def test_the_declared_size_is_read_from_the_header(ext, shape):
    image = _image(*shape)
    data = _encode(ext, image[:, :, 0] if ext == ".pgm" else image)
    assert _imagesize.declared_size(data) == shape
    assert _imagesize.declared_size(np.frombuffer(data, np.uint8)) == shape  # any buffer


def test_jpeg_headers_past_other_segments():
    image = _image(30, 40)
    progressive = _encode(".jpg", image, cv2.IMWRITE_JPEG_PROGRESSIVE, 1)
    assert _imagesize.declared_size(progressive) == (30, 40)
    plain = _encode(".jpg", image)
    app = b"\xff\xe1" + struct.pack(">H", 40002) + bytes(40000)  # a large EXIF-like segment
    assert _imagesize.declared_size(plain[:2] + app + plain[2:]) == (30, 40)
    assert _imagesize.declared_size(plain[:2] + b"\x00\x00" + plain[2:]) == (30, 40)  # junk
    lossless = _encode(".webp", image, cv2.IMWRITE_WEBP_QUALITY, 101)
    assert _imagesize.declared_size(lossless) == (30, 40)
    for unknown in (b"", b"\xff\xd8", b"GIF89a" + bytes(20), b"II*\x00" + bytes(20)):
        assert _imagesize.declared_size(unknown) is None


def test_the_default_limit_and_the_setting(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert _imagesize.max_pixels() == 178_956_970  # Pillow's DecompressionBombError threshold
    assert _imagesize.too_large(30000, 30000) is not None
    assert _imagesize.too_large(8736, 11648) is None  # a 100-megapixel photograph
    monkeypatch.setenv(ENV, "0")
    assert _imagesize.too_large(30000, 30000) is None
    monkeypatch.setenv(ENV, "lots")
    with pytest.raises(ValueError, match=f"{ENV} must be a whole number of pixels.*'lots'"):
        _imagesize.max_pixels()


# -- the exact path ----------------------------------------------------------------------------


def test_the_exact_path_refuses_a_bomb_before_decoding(bombs, limit):
    dataset = ImageRecordDataset(bombs)
    for record in (2, 3):
        start = time.monotonic()
        with pytest.raises(RecordIOError) as info:
            dataset[record]
        assert time.monotonic() - start < 0.5
        _assert_refused(str(info.value), record)
        assert info.value.index == record and info.value.path == bombs
    assert dataset[4][0].shape == (48, 64, 3)


def test_a_raised_limit_lets_the_image_through(bombs, monkeypatch):
    monkeypatch.setenv(ENV, "4000000")
    assert ImageRecordDataset(bombs)[3][0].shape == (2000, 2000, 3)
    monkeypatch.setenv(ENV, "0")
    assert ImageRecordDataset(bombs)[3][0].shape == (2000, 2000, 3)


# -- the fused path ----------------------------------------------------------------------------

needs_codecs = pytest.mark.skipif(not vision.available(), reason="needs shardloader[vision]")


@needs_codecs
@pytest.mark.parametrize("record", [2, 3])
def test_the_fused_path_refuses_a_bomb_with_the_exact_paths_error(bombs, limit, record):
    dataset = ImageRecordDataset(bombs).transform_first(T.Compose([T.RandomResizedCrop(32)]))
    assert vision.fuse(dataset).path == "fused"
    loader = ShardedDataLoader(dataset, batch_size=1, sampler=[record])
    with loader, pytest.raises(RecordIOError) as info:
        next(iter(loader))
    _assert_refused(str(info.value), record)


@needs_codecs
def test_fused_encoded_bytes_and_files_name_the_sample(tmp_path, limit):
    pipeline = vision.ImagePipeline(32, center_crop=True)
    for payload in (jpeg_declaring(2000, 2000), png_declaring(2000, 2000)):
        fused = vision.fuse([_encode(".jpg", _image()), payload], pipeline=pipeline)
        with pytest.raises(ValueError, match="encoded images: sample 1 declares a 2000x2000"):
            fused.dataset[1]
    folder = tmp_path / "images" / "a"
    folder.mkdir(parents=True)
    (folder / "bomb.jpg").write_bytes(jpeg_declaring(2000, 2000))
    gluon = mx.gluon.data.vision.ImageFolderDataset(str(tmp_path / "images"))
    fused = vision.fuse(gluon.transform_first(T.Compose([T.CenterCrop(32)])))
    assert fused.path == "fused"
    with pytest.raises(ValueError, match=r"bomb\.jpg declares a 2000x2000 image"):
        fused.dataset[0]


# -- the cause of an undecodable image ---------------------------------------------------------


@needs_codecs
def test_not_a_decodable_image_keeps_its_reason(bombs):
    from shardloader.vision import _sources

    # The dataset's own read succeeds, yet the fused path's decoder failed: the error the
    # fused path raises then says what that decoder said.
    source, _ = _sources.source_of(ImageRecordDataset(bombs))
    cause = ValueError("Corrupt JPEG data: premature end of data segment")
    with pytest.raises(ValueError) as info:
        source.fail(0, b"", cause)
    assert str(info.value) == (
        "ImageRecordDataset: record 0 is not a decodable image "
        "(ValueError: Corrupt JPEG data: premature end of data segment)"
    )
