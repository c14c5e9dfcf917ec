"""The transport's pure parts on the host: array specs, landing layouts, metadata, registration."""

from __future__ import annotations

import pickle

import cloudpickle
import numpy
import pytest

from aiordma.channel import PresharedKey
from aiordma.ray import (
    NAME,
    AiordmaMetadata,
    AiordmaTransport,
    ArraySpec,
    Export,
    register,
    transport_class,
)
from aiordma.ray.specs import ALIGN, check_target, exportable, layout, spec_of, views


def test_a_spec_names_shape_dtype_and_size() -> None:
    spec = spec_of(numpy.zeros((3, 5), ">i2"))
    assert spec == ArraySpec((3, 5), ">i2")
    assert spec.nbytes == 30
    assert ArraySpec((), "<f8").nbytes == 8
    assert ArraySpec((0, 7), "<f8").nbytes == 0
    assert ArraySpec.from_ray(spec.as_ray()) == spec
    assert spec.as_ray() == ((3, 5), numpy.dtype(">i2"))


@pytest.mark.parametrize(
    ("shape", "dtype", "error"),
    [((-1,), "<f8", ValueError), ([3], "<f8", ValueError), ((2,), "O", TypeError),
     ((2,), "not-a-dtype", TypeError), ((True,), "<f8", ValueError)],
)  # fmt: skip
def test_a_bad_spec_is_refused(shape: object, dtype: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        ArraySpec(shape, dtype)  # type: ignore[arg-type]


def test_layout_aligns_every_array() -> None:
    specs = [ArraySpec((3,), "<u1"), ArraySpec((0,), "<f8"), ArraySpec((2, 2), "<f8")]
    offsets, total = layout(specs)
    assert offsets == [0, ALIGN, ALIGN]
    assert total == ALIGN + 32
    assert layout([]) == ([], 0)


def test_views_share_one_buffer() -> None:
    specs = [ArraySpec((2, 3), "<i4"), ArraySpec((5,), ">f8"), ArraySpec((0,), "<u1")]
    offsets, total = layout(specs)
    buffer = numpy.zeros(total, numpy.uint8)
    out = views(buffer, specs, offsets)
    assert [(a.shape, a.dtype.str) for a in out] == [((2, 3), "<i4"), ((5,), ">f8"), ((0,), "|u1")]
    out[1][:] = numpy.arange(5)
    assert all(numpy.shares_memory(a, buffer) for a in out[:2])
    assert bytes(buffer[offsets[1] : offsets[1] + 40]) == numpy.arange(5, dtype=">f8").tobytes()
    assert all(a.flags.c_contiguous and a.flags.writeable for a in out)


def test_exportable_copies_only_what_is_not_contiguous() -> None:
    plain = numpy.arange(12, dtype="<f4").reshape(3, 4)
    assert exportable(plain) is plain
    turned = exportable(plain.T)
    assert turned.flags.c_contiguous
    assert not numpy.shares_memory(turned, plain)
    assert (turned == plain.T).all()
    with pytest.raises(TypeError, match="numpy arrays, not bytes"):
        exportable(b"abc")
    with pytest.raises(TypeError, match="Python objects"):
        exportable(numpy.array([None, 1]))


def test_a_target_must_match_its_array() -> None:
    spec = ArraySpec((4,), "<f8")
    good = numpy.zeros(4)
    assert check_target(good, spec, 0) is good
    with pytest.raises(ValueError, match="target buffer 1 is"):
        check_target(numpy.zeros(5), spec, 1)
    with pytest.raises(ValueError, match="C-contiguous and writable"):
        check_target(numpy.zeros(8)[::2], spec, 0)
    frozen = numpy.zeros(4)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        check_target(frozen, spec, 0)
    with pytest.raises(TypeError, match="numpy array"):
        check_target(bytearray(32), spec, 0)


def test_the_metadata_travels_pickled() -> None:
    meta = AiordmaMetadata(tensor_meta=[((2, 3), numpy.dtype("<f4"))], tensor_device="cpu",
                           agent=b"agent", descriptors=b"list")  # fmt: skip
    again = pickle.loads(pickle.dumps(meta))
    assert again == meta
    assert again.export() == Export(b"agent", b"list", (ArraySpec((2, 3), "<f4"),))


def test_the_class_carries_its_name_and_key() -> None:
    assert transport_class() is AiordmaTransport
    assert AiordmaTransport.name == NAME
    assert AiordmaTransport.auth is None
    keyed = transport_class("MINE", b"k" * 32)
    assert issubclass(keyed, AiordmaTransport)
    again = cloudpickle.loads(cloudpickle.dumps(keyed))  # as Ray sends it to each actor
    assert (again.name, again.auth) == ("MINE", b"k" * 32)
    assert AiordmaTransport.is_one_sided()
    assert AiordmaTransport.can_abort_transport()


def test_register_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match="non-empty str"):
        register("")
    with pytest.raises(TypeError, match="PresharedKey or bytes"):
        register("X", auth="secret")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="16"):
        register("SHORT_KEY", auth=b"short")
    assert register("aiordma_host_test", auth=b"k" * 16) == "AIORDMA_HOST_TEST"
    assert register("AIORDMA_HOST_TEST", auth=b"k" * 16) == "AIORDMA_HOST_TEST"  # again: a no-op
    with pytest.raises(ValueError, match="already registered, with another key"):
        register("aiordma_host_test")


def test_register_takes_a_preshared_key() -> None:
    key = PresharedKey.generate()
    assert register("aiordma_host_key", auth=key) == "AIORDMA_HOST_KEY"
    from ray.experimental.rdt.util import transport_manager_info

    registered = transport_manager_info["AIORDMA_HOST_KEY"].transport_manager_class
    assert issubclass(registered, AiordmaTransport)
    assert registered.auth == bytes.fromhex(key.hex())
