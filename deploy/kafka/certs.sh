#!/bin/sh
# The broker's TLS: a CA of this deployment and the broker's certificate (for kafka and localhost), PEM, in the
# shared secrets volume (/secrets). Run once by the compose file's kafka-certs service; an existing CA is kept.
set -eu
cd /secrets
if [ ! -s ca.pem ]; then
  openssl req -x509 -newkey rsa:3072 -nodes -days 825 -subj "/CN=shardyard-kafka-ca" -keyout ca.key -out ca.pem
fi
if [ ! -s broker.pem ]; then
  openssl req -newkey rsa:3072 -nodes -subj "/CN=kafka" -keyout broker.key -out broker.csr
  printf 'subjectAltName=DNS:kafka,DNS:localhost,IP:127.0.0.1\n' > broker.ext
  openssl x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 -extfile broker.ext \
    -out broker.crt
  # Kafka reads a PEM keystore as the private key (PKCS#8) followed by the certificate chain, in one file.
  openssl pkcs8 -topk8 -nocrypt -in broker.key > broker.pem
  cat broker.crt ca.pem >> broker.pem
  rm -f broker.csr broker.ext broker.key
fi
chmod 600 ca.key broker.pem
chown 1000:1000 broker.pem  # the broker runs as the image's appuser
chmod 644 ca.pem
# The cluster secret every Shardyard process seals its events with (README, "Security").
if [ ! -s cluster.secret ]; then
  openssl rand -hex 32 > cluster.secret
fi
chmod 600 cluster.secret
