#!/bin/bash
# Each principal's SCRAM-SHA-512 credential and what it may do (run by the compose file's kafka-setup service, on
# the broker's PLAINTEXT listener, which only the broker's own network namespace reaches). A password is random,
# made once and kept in /secrets/NAME, where the process of that principal reads it (SHARDYARD_KAFKA_PASSWORD_FILE).
#
# The layout: only the services write the internal topics; an agent writes only its heartbeats, shard events and
# link measurements, and reads its assignments and the lifecycle; a team writes only submissions; the monitor reads
# everything. Nobody but the admin creates or deletes topics or changes ACLs (the broker's super user).
set -euo pipefail
BOOT="${KAFKA_SETUP_BOOTSTRAP:-localhost:19092}"
BIN=/opt/kafka/bin
SERVICES=(queue scheduler resource-pool fault-manager monitor accounting)
AGENT=node-agent
TEAMS=(${SHARDYARD_TEAMS:-team-a team-b})
INTERNAL=(jobs.lifecycle nodes.heartbeats nodes.state assignments shards.events failures services leadership
  elasticity redundancy alerts links queues deadletter)

password() {
  [ -s "/secrets/$1" ] || head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "/secrets/$1"
  chmod 600 "/secrets/$1"
  cat "/secrets/$1"
}

acl() {  # acl PRINCIPAL OPERATION RESOURCE-OPTIONS...
  local who="$1" op="$2"
  shift 2
  "$BIN/kafka-acls.sh" --bootstrap-server "$BOOT" --add --allow-principal "User:$who" --operation "$op" "$@" >/dev/null
}

for user in "${SERVICES[@]}" "$AGENT" admin "${TEAMS[@]}"; do
  "$BIN/kafka-configs.sh" --bootstrap-server "$BOOT" --alter --entity-type users --entity-name "$user" \
    --add-config "SCRAM-SHA-512=[password=$(password "$user")]" >/dev/null
done

for service in "${SERVICES[@]}"; do
  for topic in jobs.submissions "${INTERNAL[@]}"; do
    acl "$service" Read --topic "shardyard.$topic"
    acl "$service" Describe --topic "shardyard.$topic"
    [ "$topic" = jobs.submissions ] || acl "$service" Write --topic "shardyard.$topic"
  done
  acl "$service" Read --group "shardyard-$service" --resource-pattern-type prefixed
done

for topic in nodes.heartbeats shards.events links deadletter; do
  acl "$AGENT" Write --topic "shardyard.$topic"
done
for topic in assignments jobs.lifecycle services links nodes.heartbeats; do
  acl "$AGENT" Read --topic "shardyard.$topic"
done

for team in "${TEAMS[@]}"; do
  acl "$team" Write --topic shardyard.jobs.submissions
  acl "$team" Describe --topic shardyard.jobs.submissions
done
echo "kafka-setup: ${#SERVICES[@]} services, the agents and ${#TEAMS[@]} teams have their credentials and ACLs"
