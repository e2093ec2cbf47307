#!/usr/bin/python
"""Fingerprints of the primary keys in an OpenPGP public key file (armored or binary), in pure Python.

Read-only, so it runs in check mode too, and needs no gpg on the node (a minimal Debian or Ubuntu has only gpgv).
Fingerprints follow RFC 4880 (v4: SHA-1) and RFC 9580 (v6: SHA-256; v5 drafts: SHA-256), upper-case hex.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: sm120kit_openpgp_fingerprints
short_description: Fingerprints of the primary keys in an OpenPGP public key file
options:
  path:
    description: The key file on the node, ASCII-armored or binary.
    type: path
    required: true
"""

PUBLIC_KEY = 6


def _dearmor(data: bytes) -> bytes:
    text = data.decode("ascii", "replace")
    if "-----BEGIN PGP PUBLIC KEY BLOCK-----" not in text:
        return data
    body = text.split("-----BEGIN PGP PUBLIC KEY BLOCK-----", 1)[1].split("-----END PGP PUBLIC KEY BLOCK-----", 1)[0]
    lines = body.strip("\r\n").splitlines()
    # Armor headers ("Version: ...") end at the first empty line, when there are any.
    blank = next((i for i, line in enumerate(lines) if not line.strip()), None)
    if blank is not None:
        lines = lines[blank + 1 :]
    payload = "".join(line.strip() for line in lines if line.strip() and not line.startswith("="))
    return base64.b64decode(payload, validate=True)


def _packets(data: bytes) -> list[tuple[int, bytes]]:
    packets, i = [], 0
    while i < len(data):
        first = data[i]
        if not first & 0x80:
            raise ValueError(f"byte {i} does not start an OpenPGP packet")
        if first & 0x40:  # new format
            tag, i = first & 0x3F, i + 1
            octet = data[i]
            if octet < 192:
                length, i = octet, i + 1
            elif octet < 224:
                length, i = ((octet - 192) << 8) + data[i + 1] + 192, i + 2
            elif octet == 255:
                length, i = int.from_bytes(data[i + 1 : i + 5], "big"), i + 5
            else:
                raise ValueError("partial body lengths do not occur in key files")
        else:  # old format
            tag, kind, i = (first >> 2) & 0x0F, first & 0x03, i + 1
            if kind == 3:
                length = len(data) - i
            else:
                size = (1, 2, 4)[kind]
                length, i = int.from_bytes(data[i : i + size], "big"), i + size
        if i + length > len(data):
            raise ValueError("the key file is truncated")
        packets.append((tag, data[i : i + length]))
        i += length
    return packets


def fingerprints(data: bytes) -> list[str]:
    """Primary key fingerprints of every public key packet in `data`."""
    found = []
    for tag, body in _packets(_dearmor(data)):
        if tag != PUBLIC_KEY or not body:
            continue
        if body[0] == 4:
            digest = hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body, usedforsecurity=False)
        elif body[0] in (5, 6):
            digest = hashlib.sha256(bytes([0x95 + body[0]]) + len(body).to_bytes(4, "big") + body)
        else:
            raise ValueError(f"OpenPGP key version {body[0]} is not supported")
        found.append(digest.hexdigest().upper())
    return found


def main() -> None:
    module = AnsibleModule(argument_spec={"path": {"type": "path", "required": True}}, supports_check_mode=True)
    path = module.params["path"]
    try:
        with Path(path).open("rb") as handle:
            data = handle.read(1 << 20)
        result = fingerprints(data)
    except (OSError, ValueError, binascii.Error, IndexError) as exc:
        module.fail_json(msg=f"{path} is not an OpenPGP public key file: {exc}")
    module.exit_json(changed=False, fingerprints=result)


if __name__ == "__main__":
    main()
