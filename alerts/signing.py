"""Standard Webhooks signatures: ``webhook-signature: v1,<base64 HMAC-SHA256>`` over
``"{webhook-id}.{webhook-timestamp}.{body}"``, keyed with the bytes a ``whsec_``
secret encodes (``collector.config.signing_key``).

A receiver verifies with any Standard Webhooks library, e.g. in Python::

    from standardwebhooks.webhooks import Webhook
    Webhook("whsec_...").verify(body, request.headers)  # raises when it is not ours

and rejects a ``webhook-timestamp`` far from its clock (5 minutes), and dedupes on
``webhook-id``: the same notification tried again carries the same id.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

__all__ = ["sign", "signed_headers"]


def sign(key: bytes, webhook_id: str, timestamp: int, body: str) -> str:
    """The ``webhook-signature`` value (one ``v1`` signature)."""
    content = f"{webhook_id}.{timestamp}.{body}".encode()
    digest = hmac.new(key, content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signed_headers(key: bytes | None, webhook_id: str, timestamp: int, body: str) -> dict[str, str]:
    """``webhook-id`` and ``webhook-timestamp``, and ``webhook-signature`` when there
    is a key (an unsigned webhook still carries the id to dedupe on)."""
    headers = {"webhook-id": webhook_id, "webhook-timestamp": str(timestamp)}
    if key is not None:
        headers["webhook-signature"] = sign(key, webhook_id, timestamp, body)
    return headers
