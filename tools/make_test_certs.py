#!/usr/bin/env python3
"""Makes the certificates the TLS tests use, at test time (none is committed).

Writes into --out a CA (ca.pem, ca.key) and, signed by it, one certificate and
key per identity (NAME.pem, NAME.key), each valid for one day and usable as a
server and as a client certificate (extended key usage serverAuth and
clientAuth). Every identity's certificate names it by a SPIFFE ID
(spiffe://hybridserve.test/NAME, a URI SAN); the worker identities also carry
the DNS name localhost and the IP address 127.0.0.1, so a server on loopback
verifies under either name. Plus the bad ones:
  expired.pem   decode's identity, signed by the CA, expired a day ago;
  foreign.pem   decode's identity, signed by another CA (foreign_ca.pem).

  python3 tools/make_test_certs.py --out DIR [--trust_domain D] [--renew NAME]
  python3 tools/make_test_certs.py --out DIR --issue NAME [--uri U]... [--dns D]... [--ip A]...
  python3 tools/make_test_certs.py --out DIR --ca_only [--ca_name N]

--renew NAME re-issues NAME.pem/NAME.key alone, signed by the CA already in
--out (a certificate renewal, as a rotation test needs), and writes nothing
else. --issue NAME does the same with exactly the SANs given (URIs, DNS
names, IP addresses; at least one), e.g. a Kubernetes workload's
certificate: its SPIFFE ID and its Services' DNS names, no loopback names.
Both write each file beside the old one and rename it over it. --ca_only
writes a CA alone (ca.pem, ca.key; no identity), e.g. the next CA of a CA
rotation, in a directory of its own: --issue with that --out signs by it.

Uses python3-cryptography (Debian's package; tools/bootstrap.sh installs it).
EC P-256 keys: made in milliseconds.
"""

import argparse
import datetime
import ipaddress
import os

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Worker identities (servers and their clients) and client-only identities.
WORKERS = ("decode", "prefill", "cachestore")
CLIENTS = ("tenant_a", "tenant_b", "proxy", "stranger")


def new_key():
    return ec.generate_private_key(ec.SECP256R1())


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)
    if ".key" in path:
        os.chmod(path, 0o600)


def key_pem(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def cert_pem(cert):
    return cert.public_bytes(serialization.Encoding.PEM)


def make_ca(common_name):
    key = new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def make_leaf(ca_key, ca_cert, spiffe_id, loopback, not_before, not_after):
    sans = [x509.UniformResourceIdentifier(spiffe_id)]
    if loopback:
        sans += [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    return make_leaf_with_sans(ca_key, ca_cert, spiffe_id.rsplit("/", 1)[-1], sans, not_before, not_after)


def make_leaf_with_sans(ca_key, ca_cert, common_name, sans, not_before, not_after):
    key = new_key()
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return key, cert


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--trust_domain", default="hybridserve.test")
    parser.add_argument("--ca_name", default="hybridserve test CA")
    parser.add_argument("--renew", default="")
    parser.add_argument("--issue", default="")
    parser.add_argument("--uri", action="append", default=[])
    parser.add_argument("--dns", action="append", default=[])
    parser.add_argument("--ip", action="append", default=[])
    parser.add_argument("--ca_only", action="store_true")
    args = parser.parse_args()
    if args.ca_only and (args.renew or args.issue):
        parser.error("--ca_only goes without --renew and --issue")
    if (args.uri or args.dns or args.ip) and not args.issue:
        parser.error("--uri, --dns and --ip go with --issue")
    if args.issue and not (args.uri or args.dns or args.ip):
        parser.error("--issue needs at least one --uri, --dns or --ip")
    os.makedirs(args.out, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    day = datetime.timedelta(days=1)

    if args.renew or args.issue:
        with open(os.path.join(args.out, "ca.key"), "rb") as f:
            ca_key = serialization.load_pem_private_key(f.read(), password=None)
        with open(os.path.join(args.out, "ca.pem"), "rb") as f:
            ca_cert = x509.load_pem_x509_certificate(f.read())
        if args.renew:
            name = args.renew
            key, cert = make_leaf(ca_key, ca_cert, "spiffe://%s/%s" % (args.trust_domain, name), name in WORKERS,
                                  now - datetime.timedelta(hours=1), now + day)
        else:
            name = args.issue
            sans = ([x509.UniformResourceIdentifier(u) for u in args.uri] + [x509.DNSName(d) for d in args.dns]
                    + [x509.IPAddress(ipaddress.ip_address(a)) for a in args.ip])
            key, cert = make_leaf_with_sans(ca_key, ca_cert, name, sans, now - datetime.timedelta(hours=1), now + day)
        # New files beside the old, then renamed over them: a reader never
        # sees half a file (Kubernetes swaps a Secret's symlink likewise).
        for suffix, data in ((".key", key_pem(key)), (".pem", cert_pem(cert))):
            path = os.path.join(args.out, name + suffix)
            write(path + ".new", data)
            os.replace(path + ".new", path)
        return

    ca_key, ca_cert = make_ca(args.ca_name)
    write(os.path.join(args.out, "ca.pem"), cert_pem(ca_cert))
    write(os.path.join(args.out, "ca.key"), key_pem(ca_key))
    if args.ca_only:
        return

    def spiffe(name):
        return "spiffe://%s/%s" % (args.trust_domain, name)

    def emit(file_name, key, cert):
        write(os.path.join(args.out, file_name + ".pem"), cert_pem(cert))
        write(os.path.join(args.out, file_name + ".key"), key_pem(key))

    for name in WORKERS + CLIENTS:
        emit(name, *make_leaf(ca_key, ca_cert, spiffe(name), name in WORKERS, now - datetime.timedelta(hours=1),
                              now + day))
    emit("expired", *make_leaf(ca_key, ca_cert, spiffe("decode"), True, now - 3 * day, now - day))
    foreign_key, foreign_cert = make_ca("another CA")
    write(os.path.join(args.out, "foreign_ca.pem"), cert_pem(foreign_cert))
    emit("foreign", *make_leaf(foreign_key, foreign_cert, spiffe("decode"), True, now - datetime.timedelta(hours=1),
                               now + day))


if __name__ == "__main__":
    main()
