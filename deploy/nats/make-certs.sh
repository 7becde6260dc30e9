#!/usr/bin/env bash
# Makes a throwaway certificate authority and certificates for Baton's NATS
# cluster, for tests and for trying the cluster out. Production should use
# certificates from the organisation's own CA.
#
#   deploy/nats/make-certs.sh FOLDER [NODE...]
#
# NODE defaults to n1 n2 n3. Writes, into FOLDER:
#   ca.pem, ca-key.pem            the CA (keep ca-key.pem off the servers)
#   NODE.pem, NODE-key.pem        one server certificate per node, for its
#                                 client port and its routes (server and
#                                 client use), valid for NODE, localhost and
#                                 127.0.0.1
#   client.pem, client-key.pem    a client certificate, for trying mutual TLS
# Keys are ECDSA P-256, readable by the owner only. Needs only openssl.
set -euo pipefail

if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
out=$1
shift
nodes=("$@")
[ ${#nodes[@]} -gt 0 ] || nodes=(n1 n2 n3)
days=${BATON_CERT_DAYS:-825}

command -v openssl >/dev/null || { echo "make-certs.sh: openssl not found: install it (apt-get install openssl)" >&2; exit 1; }
for n in "${nodes[@]}"; do
  case $n in
    ca|client|*/*|'') echo "make-certs.sh: node name '$n' is not usable: give host names such as n1 or n1.internal" >&2; exit 2 ;;
  esac
done
if [ -e "$out/ca.pem" ]; then
  echo "make-certs.sh: $out/ca.pem exists: a new CA would not match the certificates already handed out; choose another folder" >&2
  exit 1
fi

mkdir -p "$out"
umask 077
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

key "$out/ca-key.pem"
openssl req -x509 -new -key "$out/ca-key.pem" -sha256 -days "$days" \
  -subj "/O=Baton/CN=Baton NATS test CA" \
  -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out "$out/ca.pem"

# sign NAME SUBJECT EXTENSIONS: a key and a certificate signed by the CA.
sign() {
  local name=$1 subject=$2 ext=$3
  key "$out/$name-key.pem"
  openssl req -new -key "$out/$name-key.pem" -subj "$subject" -out "$tmp/$name.csr"
  printf '%s\n' "$ext" > "$tmp/$name.ext"
  openssl x509 -req -in "$tmp/$name.csr" -CA "$out/ca.pem" -CAkey "$out/ca-key.pem" \
    -CAcreateserial -CAserial "$tmp/ca.srl" -sha256 -days "$days" \
    -extfile "$tmp/$name.ext" -out "$out/$name.pem" 2>/dev/null
}

for n in "${nodes[@]}"; do
  # Routes are TLS connections in both directions: a node is the server of
  # the routes it accepts and the client of those it dials, so its
  # certificate serves both uses.
  sign "$n" "/O=Baton/CN=$n" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=DNS:$n,DNS:localhost,IP:127.0.0.1"
done
sign client "/O=Baton/CN=baton-client" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"

# Certificates are public; keys stay readable by the owner only (umask).
chmod 0644 "$out/ca.pem" "$out/client.pem"
for n in "${nodes[@]}"; do chmod 0644 "$out/$n.pem"; done
echo "wrote the CA and certificates for ${nodes[*]} and a client into $out"
