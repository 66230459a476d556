"""The live TLS context: a new certificate is served to new handshakes, and a pair that does
not match is refused without touching what is served."""

from __future__ import annotations

import contextlib
import datetime as dt
import ssl

import pytest
from cryptography import x509

from elastic_gpu.webhook.certs import Lifetimes, create_bundle, new_serving
from elastic_gpu.webhook.server import TlsHolder

NOW = dt.datetime.now(dt.UTC)


def served(holder: TlsHolder, ca_pem: str) -> x509.Certificate:
    """Handshake in memory against the holder's context; the certificate it presented."""
    client_ctx = ssl.create_default_context(cadata=ca_pem)
    client_ctx.check_hostname = False
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_ctx.wrap_bio(c_in, c_out, server_side=False)
    server = holder.context.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for side in (client, server):
            with contextlib.suppress(ssl.SSLWantReadError):
                side.do_handshake()
        s_in.write(c_out.read())
        c_in.write(s_out.read())
    der = client.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def test_reload_serves_the_new_certificate_and_refuses_a_mismatched_pair() -> None:
    bundle = create_bundle(["127.0.0.1"], NOW, Lifetimes())
    holder = TlsHolder()
    try:
        assert holder.load(bundle.tls_cert, bundle.tls_key)
        assert not holder.load(bundle.tls_cert, bundle.tls_key)  # same: nothing to do
        first = served(holder, bundle.ca_cert)
        renewed, key = new_serving(bundle.ca_cert, bundle.ca_key, ["127.0.0.1"], NOW,
                                   Lifetimes())
        with pytest.raises(ssl.SSLError):
            holder.load(renewed, bundle.tls_key)  # the old key with the new certificate
        assert served(holder, bundle.ca_cert) == first
        assert holder.load(renewed, key)
        second = served(holder, bundle.ca_cert)
        assert second != first and second == x509.load_pem_x509_certificate(renewed.encode())
    finally:
        holder.close()
