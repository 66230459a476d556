"""Certificates: made, checked and rotated in the order that keeps kube-apiserver trusting
whatever a replica serves."""

from __future__ import annotations

import datetime as dt

from cryptography import x509

from elastic_gpu.webhook.certs import (
    CertBundle,
    Lifetimes,
    create_bundle,
    plan_rotation,
    serving_hosts,
)

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
LIFE = Lifetimes(ca=dt.timedelta(hours=30), serving=dt.timedelta(hours=3))
HOSTS = serving_hosts("egpu-webhook", "egpu-system")


def chain_ok(bundle: CertBundle) -> bool:
    """The serving certificate is signed by a CA of the bundle kube-apiserver trusts."""
    serving = bundle.serving()
    trusted = x509.load_pem_x509_certificates(bundle.ca_bundle.encode())
    for ca in trusted:
        try:
            serving.verify_directly_issued_by(ca)
            return True
        except (ValueError, TypeError, Exception):
            continue
    return False


def test_new_bundle_serves_the_hosts_and_round_trips_through_secret_data() -> None:
    bundle = create_bundle(HOSTS, T0, LIFE)
    san = bundle.serving().extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "egpu-webhook.egpu-system.svc" in san.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert CertBundle.from_data(bundle.to_data()) == bundle
    assert chain_ok(bundle)
    assert plan_rotation(bundle, HOSTS, T0 + dt.timedelta(hours=1), LIFE) is None


def test_secret_data_missing_a_key_is_refused_by_name() -> None:
    data = create_bundle(HOSTS, T0, LIFE).to_data()
    del data["tls.key"]
    try:
        CertBundle.from_data(data)
    except ValueError as err:
        assert "tls.key" in str(err)
    else:
        raise AssertionError("accepted a bundle without its key")


def test_serving_certificate_is_renewed_by_the_same_ca_with_a_third_left() -> None:
    bundle = create_bundle(HOSTS, T0, LIFE)
    assert plan_rotation(bundle, HOSTS, T0 + dt.timedelta(hours=1, minutes=50), LIFE) is None
    renewed = plan_rotation(bundle, HOSTS, T0 + dt.timedelta(hours=2, minutes=1), LIFE)
    assert renewed is not None
    assert renewed.ca_cert == bundle.ca_cert and renewed.ca_bundle == bundle.ca_bundle
    assert renewed.tls_cert != bundle.tls_cert and chain_ok(renewed)


def test_ca_rotation_trusts_the_new_ca_before_serving_what_it_signs() -> None:
    now = T0
    bundle = create_bundle(HOSTS, now, LIFE)
    cas_seen = {bundle.ca_cert}
    for _ in range(200):  # 50 hours, 15 minutes a step: past one CA lifetime and more
        now += dt.timedelta(minutes=15)
        planned = plan_rotation(bundle, HOSTS, now, LIFE)
        if planned is None:
            continue
        if planned.ca_cert != bundle.ca_cert:
            # step 1: a new CA, trusted next to the old; the served certificate is unchanged
            assert planned.tls_cert == bundle.tls_cert
            assert planned.ca_bundle.startswith(planned.ca_cert)
            assert bundle.ca_cert in planned.ca_bundle
        bundle = planned
        cas_seen.add(bundle.ca_cert)
        assert chain_ok(bundle), f"served certificate not trusted at {now}"
        assert bundle.serving().not_valid_after_utc > now
    assert len(cas_seen) >= 2
    # expired CAs leave the bundle
    assert len(x509.load_pem_x509_certificates(bundle.ca_bundle.encode())) <= 2


def test_a_missing_host_reissues_the_certificate() -> None:
    bundle = create_bundle(["127.0.0.1"], T0, LIFE)
    planned = plan_rotation(bundle, HOSTS, T0, LIFE)
    assert planned is not None and planned.ca_cert == bundle.ca_cert
    san = planned.serving().extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "egpu-webhook.egpu-system.svc.cluster.local" in san.get_values_for_type(x509.DNSName)
