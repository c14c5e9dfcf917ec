"""The Ray side: a ``TensorTransportManager`` over :class:`~aiordma.ray.exchange.ArrayExchange`.

Ray makes one manager per process (by calling the registered class) and calls
it synchronously from its own threads; every call goes to the process's
exchange, which runs the transfer agent on its own loop thread.
"""

from __future__ import annotations

import concurrent.futures
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

import ray
from ray.experimental.rdt.tensor_transport_manager import (
    CommunicatorMetadata,
    FetchRequest,
    TensorTransportManager,
    TensorTransportMetadata,
)

from aiordma.ray.exchange import ArrayExchange, Arrays, Export
from aiordma.ray.specs import NAME, ArraySpec

_DEFAULT_FETCH_TIMEOUT = 60.0


@dataclass
class AiordmaMetadata(TensorTransportMetadata):
    """An object's arrays as Ray carries them from producer to consumers:
    ``tensor_meta`` (each array's shape and dtype), the producer agent's
    metadata and the descriptor list's bytes."""

    agent: bytes = b""
    descriptors: bytes = b""

    def export(self) -> Export:
        """The exchange's view of this metadata."""
        return Export(
            self.agent,
            self.descriptors,
            tuple(ArraySpec.from_ray(pair) for pair in self.tensor_meta),
        )


@dataclass
class AiordmaFetch(FetchRequest):
    """A fetch started by :meth:`AiordmaTransport.fetch_multiple_tensors`."""

    future: concurrent.futures.Future[Arrays] | None = field(default=None, repr=False)


def fetch_timeout() -> float:
    """Seconds a fetch may take: Ray's own ``RAY_rdt_fetch_fail_timeout_milliseconds``."""
    try:
        from ray._private import ray_constants

        return float(ray_constants.RDT_FETCH_FAIL_TIMEOUT_SECONDS)
    except (ImportError, AttributeError):
        raw = os.environ.get("RAY_rdt_fetch_fail_timeout_milliseconds")  # noqa: SIM112  (Ray spells it so)
        return int(raw) / 1000 if raw else _DEFAULT_FETCH_TIMEOUT


def transport_available() -> bool:
    """Whether this process can run the transport: an RDMA device with a RoCE address."""
    from aiordma.channel import find_roce_endpoint

    try:
        return find_roce_endpoint(family=4) is not None or find_roce_endpoint(family=6) is not None
    except Exception:  # no verbs library, no device: not available
        return False


class AiordmaTransport(TensorTransportManager):
    """aiordma as a one-sided Ray tensor transport for numpy arrays on the CPU.

    Registered by :func:`aiordma.ray.register`; a subclass made there carries
    its name and key to every actor.
    """

    name: ClassVar[str] = NAME
    auth: ClassVar[bytes | None] = None
    """The pre-shared key's bytes (None: connections are not authenticated)."""

    def __init__(self) -> None:
        global _current
        self.exchange = ArrayExchange(auth=self.auth)
        _current = self

    @property
    def engine(self) -> ArrayExchange:
        """Deprecated: ``exchange`` (its name until 0.1)."""
        import warnings

        warnings.warn("AiordmaTransport.engine is now .exchange", DeprecationWarning,
                      stacklevel=2)  # fmt: skip
        return self.exchange

    def tensor_transport_backend(self) -> str:
        """The name this class was registered under."""
        return self.name

    @staticmethod
    def is_one_sided() -> bool:
        """True: consumers read the producer's memory; the producer takes no part."""
        return True

    @staticmethod
    def can_abort_transport() -> bool:
        """True: a fetch can be cancelled at any point without leaving work posted."""
        return True

    def actor_has_tensor_transport(self, actor: ray.actor.ActorHandle[Any]) -> bool:
        """Whether ``actor`` has an RDMA device with a RoCE address (asked in the actor)."""

        def __ray_actor_has_aiordma__(self: Any) -> bool:
            from aiordma.ray.manager import transport_available

            return transport_available()

        ref: Any = actor.__ray_call__.options(concurrency_group="_ray_system").remote(
            __ray_actor_has_aiordma__
        )
        return bool(ray.get(ref))

    def extract_tensor_transport_metadata(
        self, obj_id: str, rdt_object: list[Any]
    ) -> AiordmaMetadata:
        """Register the arrays for remote reads (no copy of C-contiguous ones) and
        describe them: shapes, dtypes, this agent, the descriptor list."""
        export = self.exchange.export(obj_id, rdt_object)
        return AiordmaMetadata(
            tensor_meta=[s.as_ray() for s in export.specs],
            tensor_device="cpu",
            agent=export.agent,
            descriptors=export.descriptors,
        )

    def get_communicator_metadata(
        self,
        src_actor: ray.actor.ActorHandle[Any],
        dst_actor: ray.actor.ActorHandle[Any],
        backend: str | None = None,
    ) -> CommunicatorMetadata:
        """Nothing: a one-sided read needs only the object's metadata."""
        return CommunicatorMetadata()

    def recv_multiple_tensors(
        self,
        obj_id: str,
        tensor_transport_metadata: TensorTransportMetadata,
        communicator_metadata: CommunicatorMetadata,
        target_buffers: list[Any] | None = None,
    ) -> list[Any]:
        """Read the object's arrays (into ``target_buffers`` when given) and return them."""
        request = self.fetch_multiple_tensors(
            obj_id, tensor_transport_metadata, communicator_metadata, target_buffers
        )
        return self.wait_fetch_complete(request)

    def fetch_multiple_tensors(
        self,
        obj_id: str,
        tensor_transport_metadata: TensorTransportMetadata,
        communicator_metadata: CommunicatorMetadata,
        target_buffers: list[Any] | None = None,
    ) -> AiordmaFetch:
        """Start reading the object's arrays, bounded by Ray's fetch timeout;
        :meth:`wait_fetch_complete` gives them."""
        meta = _ours(tensor_transport_metadata)
        future = self.exchange.fetch(
            obj_id, meta.export(), timeout=fetch_timeout(), targets=target_buffers
        )
        return AiordmaFetch(obj_id=obj_id, tensors=[], future=future)

    def wait_fetch_complete(self, fetch_request: FetchRequest, timeout: float = -1) -> list[Any]:
        """The arrays of a fetch; ``timeout`` seconds (-1: no bound) or TimeoutError.
        An aborted fetch raises :class:`~aiordma.TransferError`."""
        if not isinstance(fetch_request, AiordmaFetch) or fetch_request.future is None:
            return list(fetch_request.tensors)
        wait = None if timeout is None or timeout < 0 else timeout
        fetch_request.tensors = self.exchange.wait(fetch_request.obj_id, fetch_request.future, wait)
        fetch_request.future = None
        return list(fetch_request.tensors)

    def send_multiple_tensors(
        self,
        tensors: list[Any],
        tensor_transport_metadata: TensorTransportMetadata,
        communicator_metadata: CommunicatorMetadata,
    ) -> None:
        """Never called for a one-sided transport: raises NotImplementedError."""
        raise NotImplementedError(
            "the aiordma transport is one-sided: consumers read, producers never send"
        )

    def garbage_collect(
        self, obj_id: str, tensor_transport_meta: TensorTransportMetadata, tensors: list[Any]
    ) -> None:
        """Unregister the object's arrays: a late reader gets a TransferError, never the memory."""
        self.exchange.free(obj_id)

    def abort_transport(self, obj_id: str, communicator_metadata: CommunicatorMetadata) -> None:
        """Cancel this process's fetches of the object; returns once their posted work completed."""
        self.exchange.abort(obj_id)


_current: AiordmaTransport | None = None


def current_manager() -> AiordmaTransport | None:
    """The manager Ray made in this process (the last one), None before Ray used the transport."""
    return _current


def _ours(meta: TensorTransportMetadata) -> AiordmaMetadata:
    if not isinstance(meta, AiordmaMetadata):
        raise TypeError(f"the aiordma transport reads AiordmaMetadata, not {type(meta).__name__}")
    return meta


def transport_class(name: str = NAME, auth: bytes | None = None) -> type[AiordmaTransport]:
    """The manager class Ray registers under ``name``: :class:`AiordmaTransport`
    itself for the defaults, else a subclass holding the name and key (Ray
    pickles it to each actor by value)."""
    if name == NAME and auth is None:
        return AiordmaTransport
    return type(
        "AiordmaTransport",
        (AiordmaTransport,),
        {
            "name": name,
            "auth": auth,
            "__module__": __name__,
            "__qualname__": f"AiordmaTransport[{name}]",
        },
    )
