"""The webhook's own CA and serving certificate: made, kept in a Secret, rotated.

A `CertBundle` is what the Secret holds: the CA (certificate and key), the serving certificate
and key, and `ca_bundle`, the CA certificates kube-apiserver must trust (the current CA, plus
the previous one while certificates it signed may still be served). Everything here is pure
except the key generation; reading and writing the Secret is cluster.py's.

Rotation (`plan_rotation`): the serving certificate is renewed, by the same CA, once less than
`renew_fraction` of its lifetime is left; the CA is renewed the same way, and the new CA is
added to `ca_bundle` before anything it signs is served (the old CA stays in the bundle until it
expires), so kube-apiserver trusts every certificate a replica may be serving at any moment.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Secret data keys (tls.crt / tls.key as kubernetes.io/tls and cert-manager name them).
CA_CERT_KEY = "ca.crt"
CA_KEY_KEY = "ca.key"
CA_BUNDLE_KEY = "ca-bundle.crt"
TLS_CERT_KEY = "tls.crt"
TLS_KEY_KEY = "tls.key"

#: The clock skew certificates tolerate (not-before is set this far back).
BACKDATE = dt.timedelta(minutes=5)


@dataclass(frozen=True)
class Lifetimes:
    ca: dt.timedelta = dt.timedelta(days=3650)
    serving: dt.timedelta = dt.timedelta(days=365)
    #: renew once less than this fraction of a certificate's lifetime is left
    renew_fraction: float = 1 / 3


@dataclass(frozen=True)
class CertBundle:
    """PEM texts, as the Secret stores them."""

    ca_cert: str
    ca_key: str
    tls_cert: str
    tls_key: str
    #: what kube-apiserver trusts: the current CA first, then older CAs still valid
    ca_bundle: str

    def to_data(self) -> dict[str, str]:
        return {CA_CERT_KEY: self.ca_cert, CA_KEY_KEY: self.ca_key, TLS_CERT_KEY: self.tls_cert,
                TLS_KEY_KEY: self.tls_key, CA_BUNDLE_KEY: self.ca_bundle}

    @classmethod
    def from_data(cls, data: dict[str, str]) -> CertBundle:
        """From a Secret's (decoded) data; `ValueError` naming what is missing or unreadable."""
        missing = [k for k in (CA_CERT_KEY, CA_KEY_KEY, TLS_CERT_KEY, TLS_KEY_KEY)
                   if not data.get(k)]
        if missing:
            raise ValueError(f"the Secret lacks {', '.join(missing)}")
        bundle = cls(data[CA_CERT_KEY], data[CA_KEY_KEY], data[TLS_CERT_KEY], data[TLS_KEY_KEY],
                     data.get(CA_BUNDLE_KEY) or data[CA_CERT_KEY])
        bundle.serving()  # parses, or raises ValueError
        bundle.ca()
        return bundle

    def serving(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.tls_cert.encode())

    def ca(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.ca_cert.encode())


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _pem_cert(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(subject: x509.Name, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
           issuer_key: ec.EllipticCurvePrivateKey, lifetime: dt.timedelta, now: dt.datetime, *,
           ca: bool, hosts: Sequence[str] = ()) -> x509.Certificate:
    builder = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE).not_valid_after(now + lifetime)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_encipherment=not ca, content_commitment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
            encipher_only=False, decipher_only=False), critical=True))
    if not ca:
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def serving_hosts(service: str | None, namespace: str, extra: Iterable[str] = ()) -> list[str]:
    """The names the serving certificate is valid for: loopback (the dev cluster registers a
    `url` at 127.0.0.1), and the Service's DNS names in a cluster."""
    hosts = ["127.0.0.1", "localhost"]
    if service:
        hosts += [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]
    hosts += [h for h in extra if h not in hosts]
    return hosts


def new_ca(now: dt.datetime, lifetimes: Lifetimes) -> tuple[str, str]:
    key = _key()
    name = _name(f"elastic-gpu-webhook-ca-{now:%Y%m%d%H%M%S}")
    return _pem_cert(_issue(name, key, name, key, lifetimes.ca, now, ca=True)), _pem_key(key)


def new_serving(ca_cert: str, ca_key: str, hosts: Sequence[str], now: dt.datetime,
                lifetimes: Lifetimes) -> tuple[str, str]:
    ca = x509.load_pem_x509_certificate(ca_cert.encode())
    issuer_key = serialization.load_pem_private_key(ca_key.encode(), password=None)
    if not isinstance(issuer_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an EC key")
    key = _key()
    # A serving certificate never outlives its CA.
    ca_left = ca.not_valid_after_utc - now
    lifetime = min(lifetimes.serving, ca_left)
    cert = _issue(_name(hosts[0] if hosts else "elastic-gpu-webhook"), key, ca.subject,
                  issuer_key, lifetime, now, ca=False, hosts=hosts)
    return _pem_cert(cert), _pem_key(key)


def create_bundle(hosts: Sequence[str], now: dt.datetime, lifetimes: Lifetimes) -> CertBundle:
    ca_cert, ca_key = new_ca(now, lifetimes)
    tls_cert, tls_key = new_serving(ca_cert, ca_key, hosts, now, lifetimes)
    return CertBundle(ca_cert, ca_key, tls_cert, tls_key, ca_cert)


def _due(cert: x509.Certificate, now: dt.datetime, fraction: float) -> bool:
    start, end = cert.not_valid_before_utc + BACKDATE, cert.not_valid_after_utc
    return end - now < (end - start) * fraction


def _split_pems(text: str) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(text.encode()) if text.strip() else []


def _sans(cert: x509.Certificate) -> set[str]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(v) for v in ext.get_values_for_type(x509.IPAddress)} | set(
        ext.get_values_for_type(x509.DNSName))


def plan_rotation(bundle: CertBundle, hosts: Sequence[str], now: dt.datetime,
                  lifetimes: Lifetimes) -> CertBundle | None:
    """The bundle to store instead of `bundle`, or None when nothing is due.

    - CA due: a new CA is made and put first in `ca_bundle`; the old CA stays there while it
      is valid. The serving certificate is re-issued by the new CA at the *next* call (a
      replica may serve only once every replica's apiserver trusts the new CA: the caller
      patches the configurations' caBundle between the two steps).
    - Serving certificate due, or issued by a CA no longer current, or missing a host: it is
      re-issued by the current CA.
    - CAs in `ca_bundle` that have expired are dropped."""
    ca = bundle.ca()
    serving = bundle.serving()
    trusted = [c for c in _split_pems(bundle.ca_bundle) if c.not_valid_after_utc > now]
    if _due(ca, now, lifetimes.renew_fraction):
        ca_cert, ca_key = new_ca(now, lifetimes)
        new_bundle = "".join([ca_cert, *(_pem_cert(c) for c in trusted)])
        return replace(bundle, ca_cert=ca_cert, ca_key=ca_key, ca_bundle=new_bundle)
    reissue = (_due(serving, now, lifetimes.renew_fraction) or serving.issuer != ca.subject
               or not set(hosts) <= _sans(serving))
    kept = "".join(_pem_cert(c) for c in trusted) or bundle.ca_cert
    if reissue:
        tls_cert, tls_key = new_serving(bundle.ca_cert, bundle.ca_key, hosts, now, lifetimes)
        return replace(bundle, tls_cert=tls_cert, tls_key=tls_key, ca_bundle=kept)
    if kept != bundle.ca_bundle:
        return replace(bundle, ca_bundle=kept)
    return None


def not_after(pem: str) -> dt.datetime:
    return x509.load_pem_x509_certificate(pem.encode()).not_valid_after_utc
