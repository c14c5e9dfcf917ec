"""One home for errors: every public exception is an RdmaError, and pyverbs
failures (of the real constructors, on the lab's device) arrive typed."""

from __future__ import annotations

import asyncio
import errno
import inspect

import pytest
from pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError

import aiordma
import aiordma.rpc
from aiordma._pyverbs import verbs_errors
from tests.conftest import Lab


def _public_exceptions() -> list[type[BaseException]]:
    found = []
    for module in (aiordma, aiordma.rpc):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) and issubclass(obj, BaseException):
                found.append(obj)
    return found


def test_every_public_exception_is_an_rdma_error() -> None:
    exceptions = _public_exceptions()
    assert len(exceptions) >= 20
    assert [e.__name__ for e in exceptions if not issubclass(e, aiordma.RdmaError)] == []


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (aiordma.MessageTooLargeError, ValueError),
        (aiordma.BufferTooSmallError, ValueError),
        (aiordma.ExposureTimeoutError, TimeoutError),
        (aiordma.DeviceError, OSError),
        (aiordma.ConnectionLostError, ConnectionError),
        (aiordma.NoListenerError, ConnectionRefusedError),
        (aiordma.WrongLoopError, RuntimeError),
    ],
)
def test_errors_keep_the_builtin_asyncio_users_catch(
    error: type[BaseException], builtin: type[BaseException]
) -> None:
    assert issubclass(error, builtin)


def test_the_pyverbs_edge_keeps_the_errno_and_names_the_call() -> None:
    with pytest.raises(aiordma.DeviceError) as info, verbs_errors("creating a thing"):
        raise PyverbsRDMAError("boom", errno.ENOMEM)
    assert info.value.errno == errno.ENOMEM
    assert "creating a thing failed" in str(info.value)
    assert isinstance(info.value.__cause__, PyverbsRDMAError)
    with pytest.raises(aiordma.DeviceError) as info, verbs_errors("opening x", errno.ENODEV):
        raise PyverbsError("no code")
    assert info.value.errno == errno.ENODEV
    assert "no code" in str(info.value)
    with pytest.raises(aiordma.DeviceError) as info, verbs_errors("opening y", errno.ENODEV):
        raise PyverbsRDMAError("Failed to open device y", -1)  # what pyverbs 44 raises
    assert info.value.errno == errno.ENODEV


@pytest.mark.asyncio
async def test_constructor_failures_arrive_typed(lab: Lab) -> None:
    # Device (ibv_open_device): a name no device has.
    with pytest.raises(aiordma.DeviceError) as opened:
        aiordma.Device("no-such-rdma-device")
    assert opened.value.errno == errno.ENODEV
    async with aiordma.Device(lab.device) as device:
        # CQ (ibv_create_cq): the provider refuses an empty queue.
        loop = asyncio.get_running_loop()
        with pytest.raises(aiordma.DeviceError, match="completion queue") as cq:
            aiordma.CompletionQueue(device.context, loop, capacity=0)
        assert cq.value.errno == errno.EINVAL
        # QP (ibv_create_qp): more inline data than the provider supports.
        with pytest.raises(aiordma.DeviceError, match="queue pair") as qp:
            device.create_qp(aiordma.QueuePairOptions(max_inline=1 << 20))
        assert qp.value.errno == errno.EINVAL
        # Nothing was left half-made: a normal QP still works on the same device.
        async with device.create_qp() as ok:
            assert ok.state_name == "INIT"
