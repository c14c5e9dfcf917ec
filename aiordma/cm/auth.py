"""Peer authentication with a pre-shared key: the key and the handshake's messages.

Both sides prove they hold the same key without sending it, by a mutual
challenge-response with HMAC-SHA256 over fresh nonces and the connection's
identity (both queue pair numbers and both addresses), so a recorded
handshake is worthless on any other connection:

1. The client's connect request carries its nonce ``Nc`` (rdma_cm private
   data, 56 bytes, of which 21 are used here).
2. The server's accept carries its nonce ``Ns`` and ``HMAC(K, "server" |
   transcript)`` (53 of 196 bytes). The client checks it before it posts a
   receive or sends anything; a wrong answer rejects the connection.
3. The client's first message proves the key the other way, ``HMAC(K,
   "client" | transcript)``. The server has posted one receive for it and
   nothing else: until the proof checks, the client is sent no message and
   no rkey, and no ``prepare`` hook, channel or handler runs for it.
4. The server then prepares the connection (posting its receives) and
   answers with a one-message verdict; only after it does the client's
   ``connect`` return.

The transcript also covers both sides' own private data, so neither can be
altered in transit. This module holds the pure part (key, messages,
checks); ``_setup`` does the I/O. See ``docs/guides/security.md`` for what
this protects against and what it does not.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import ipaddress
import secrets
import struct
from dataclasses import dataclass
from typing import Final

from aiordma.exceptions import AuthenticationError

TAG: Final = b"aRA"
"""First bytes of every handshake message ("aiordma authentication")."""
VERSION: Final = 1
NONCE_SIZE: Final = 16
MAC_SIZE: Final = 32
REQUEST_SIZE: Final = len(TAG) + 1 + NONCE_SIZE + 1
"""Bytes of the connect request's private data the handshake takes."""
ACCEPT_SIZE: Final = len(TAG) + 1 + NONCE_SIZE + MAC_SIZE + 1
"""Bytes of the accept's private data the handshake takes."""
PROOF_SIZE: Final = len(TAG) + 1 + MAC_SIZE
VERDICT: Final = TAG + bytes([VERSION]) + b"ok"
MESSAGE_BUFFER: Final = 64
"""Receive buffer for the proof and the verdict (both are shorter)."""
_LABEL: Final = b"aiordma peer authentication v1"


class PresharedKey:
    """A secret both peers hold, for ``auth=`` on servers and clients.

    At least 16 bytes; :meth:`generate` makes a 32-byte random one. The key
    never appears in ``repr()``, logs or errors. Keep it out of source code:
    load it from a file or a secret store (:meth:`fromhex` reads what
    :meth:`hex` wrote).
    """

    MIN_SIZE: Final = 16

    __slots__ = ("_key",)

    def __init__(self, key: bytes | bytearray | memoryview) -> None:
        if not isinstance(key, bytes | bytearray | memoryview):
            raise TypeError(f"a pre-shared key must be bytes, not {type(key).__name__}")
        key = bytes(key)
        if len(key) < self.MIN_SIZE:
            raise ValueError(
                f"a pre-shared key must have at least {self.MIN_SIZE} bytes, not {len(key)}: "
                "use PresharedKey.generate()"
            )
        self._key = key

    @classmethod
    def generate(cls, size: int = 32) -> PresharedKey:
        """A new random key of ``size`` bytes (from the ``secrets`` module)."""
        return cls(secrets.token_bytes(size))

    @classmethod
    def fromhex(cls, text: str) -> PresharedKey:
        """The key written by :meth:`hex` (surrounding whitespace is ignored)."""
        try:
            return cls(bytes.fromhex(text.strip()))
        except ValueError as exc:
            raise ValueError(f"not a hex-encoded key: {exc}") from None

    def hex(self) -> str:
        """The key as hex text, to store it (treat the result as the secret it is)."""
        return self._key.hex()

    def __repr__(self) -> str:
        return f"<PresharedKey of {len(self._key)} bytes>"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PresharedKey):
            return NotImplemented
        return hmac.compare_digest(self._key, other._key)

    def __hash__(self) -> int:
        return hash(hashlib.sha256(self._key).digest())

    def mac(self, role: bytes, transcript: bytes) -> bytes:
        """HMAC-SHA256 of ``role`` and ``transcript`` under this key."""
        return hmac.digest(self._key, _LABEL + b"|" + role + b"|" + transcript, "sha256")


def as_key(auth: PresharedKey | bytes | None) -> PresharedKey | None:
    """``auth=`` as given to a server or client: a key, raw key bytes, or None."""
    if auth is None or isinstance(auth, PresharedKey):
        return auth
    if isinstance(auth, bytes | bytearray | memoryview):
        return PresharedKey(auth)
    raise TypeError(f"auth must be a PresharedKey or bytes, not {type(auth).__name__}")


class Refusal(enum.IntEnum):
    """Why one side refused the handshake; sent in the rejection's private data."""

    REQUIRED = 1
    """The server requires authentication; the request carried none."""
    MALFORMED = 2
    """A handshake message had the wrong form."""
    VERSION = 3
    """The peer speaks another version of the handshake."""
    BAD_PROOF = 4
    """The peer's proof did not check: another key, or a forged or replayed answer."""
    NONE_OFFERED = 5
    """The client requires authentication; the server's accept carried none."""


_EXPLAIN: Final = {
    Refusal.REQUIRED: (
        "the server requires authentication and the client offered none "
        "(connect with auth= and the server's key)"
    ),
    Refusal.MALFORMED: "a handshake message was malformed",
    Refusal.VERSION: "the peers speak different versions of the authentication handshake",
    Refusal.BAD_PROOF: (
        "a proof of the key did not check (the two sides hold different keys, "
        "or an answer was forged or replayed)"
    ),
    Refusal.NONE_OFFERED: (
        "the client requires authentication but the server offered none "
        "(start the server with auth=)"
    ),
}


def refusal(reason: Refusal) -> bytes:
    """Private data for a rejection that says why authentication failed."""
    return TAG + bytes([VERSION, reason])


def refused(private_data: bytes) -> Refusal | None:
    """The authentication refusal a rejection's private data carries, if any."""
    if len(private_data) < len(TAG) + 2 or not private_data.startswith(TAG):
        return None
    try:
        return Refusal(private_data[len(TAG) + 1])
    except ValueError:
        return None


def explain(reason: Refusal) -> str:
    return _EXPLAIN[reason]


def failure(
    where: str, reason: Refusal, private_data: bytes = b"", cm_reason: int = 0
) -> AuthenticationError:
    """The error for a handshake with ``where`` that failed for ``reason``
    (``private_data`` and ``cm_reason``: of the rejection that said so)."""
    message = f"authentication with {where} failed: {explain(reason)}"
    return AuthenticationError(message, private_data, cm_reason)


@dataclass(frozen=True, slots=True)
class Binding:
    """What ties a handshake to one connection: both QP numbers and addresses."""

    client_qp: int
    server_qp: int
    client_address: tuple[str, int]
    server_address: tuple[str, int]

    def encode(self) -> bytes:
        return (
            struct.pack("!II", self.client_qp, self.server_qp)
            + _address(self.client_address)
            + _address(self.server_address)
        )


def _address(address: tuple[str, int]) -> bytes:
    """An address in a form both sides agree on (IPv4-mapped IPv6 as IPv4, no scope)."""
    host, port = address
    ip = ipaddress.ip_address(host.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return bytes([len(ip.packed)]) + ip.packed + struct.pack("!H", port)


def _transcript(
    nc: bytes, ns: bytes, binding: Binding, client_data: bytes, server_data: bytes
) -> bytes:
    return b"".join(
        (nc, ns, binding.encode(), bytes([len(client_data)]), client_data,
         bytes([len(server_data)]), server_data)
    )  # fmt: skip


class Refused(Exception):
    """Raised by the handshake's checks; ``reason`` is the :class:`Refusal`."""

    def __init__(self, reason: Refusal) -> None:
        super().__init__(reason)
        self.reason = reason


def _header(data: bytes, size: int, untagged: Refusal = Refusal.MALFORMED) -> None:
    """Raise unless ``data`` starts a well-formed handshake message of ``size``
    bytes; ``untagged`` is the refusal when it is no handshake message at all."""
    if not data.startswith(TAG):
        raise Refused(untagged)
    if len(data) < size:
        raise Refused(Refusal.MALFORMED)
    if data[len(TAG)] != VERSION:
        raise Refused(Refusal.VERSION)


def _user_data(data: bytes, offset: int) -> bytes:
    length = data[offset]
    body = data[offset + 1 : offset + 1 + length]
    if len(body) != length:
        raise Refused(Refusal.MALFORMED)
    return body


class ClientHandshake:
    """The client's side: request, check the server's answer, prove the key."""

    def __init__(self, key: PresharedKey, private_data: bytes) -> None:
        self._key = key
        self.private_data = private_data
        self._nonce = secrets.token_bytes(NONCE_SIZE)
        self._transcript: bytes | None = None

    def request(self) -> bytes:
        """The connect request's private data: the handshake, then the caller's own."""
        head = TAG + bytes([VERSION]) + self._nonce
        return head + bytes([len(self.private_data)]) + self.private_data

    def check_accept(self, data: bytes, binding: Binding) -> bytes:
        """The server's own private data, once its proof checks; raises :class:`Refused`."""
        _header(data, ACCEPT_SIZE, Refusal.NONE_OFFERED)
        at = len(TAG) + 1
        ns = data[at : at + NONCE_SIZE]
        mac = data[at + NONCE_SIZE : at + NONCE_SIZE + MAC_SIZE]
        server_data = _user_data(data, at + NONCE_SIZE + MAC_SIZE)
        transcript = _transcript(self._nonce, ns, binding, self.private_data, server_data)
        if not hmac.compare_digest(mac, self._key.mac(b"server", transcript)):
            raise Refused(Refusal.BAD_PROOF)
        self._transcript = transcript
        return server_data

    def proof(self) -> bytes:
        """The client's first message: its proof of the key."""
        assert self._transcript is not None, "check_accept first"
        return TAG + bytes([VERSION]) + self._key.mac(b"client", self._transcript)


class ServerHandshake:
    """The server's side: read the request, answer with a proof, check the client's."""

    def __init__(self, key: PresharedKey, request: bytes) -> None:
        """Parse the client's request; raises :class:`Refused` when it is not one."""
        _header(request, REQUEST_SIZE, Refusal.REQUIRED)
        at = len(TAG) + 1
        self._key = key
        self._client_nonce = request[at : at + NONCE_SIZE]
        self.private_data = _user_data(request, at + NONCE_SIZE)
        """The client's own private data."""
        self._transcript: bytes | None = None

    def accept(self, private_data: bytes, binding: Binding) -> bytes:
        """The accept's private data: our nonce and proof, then our own data."""
        ns = secrets.token_bytes(NONCE_SIZE)
        self._transcript = _transcript(self._client_nonce, ns, binding, self.private_data,
                                       private_data)  # fmt: skip
        mac = self._key.mac(b"server", self._transcript)
        return TAG + bytes([VERSION]) + ns + mac + bytes([len(private_data)]) + private_data

    def check_proof(self, message: bytes) -> None:
        """Raise :class:`Refused` unless ``message`` is the client's valid proof."""
        assert self._transcript is not None, "accept first"
        if len(message) != PROOF_SIZE:
            raise Refused(Refusal.MALFORMED)
        _header(message, PROOF_SIZE)
        expected = self._key.mac(b"client", self._transcript)
        if not hmac.compare_digest(message[len(TAG) + 1 :], expected):
            raise Refused(Refusal.BAD_PROOF)


__all__ = ["PresharedKey"]
