#!/usr/bin/env bash
# Installs what Baton's tests and `baton dev` need from the machine when it
# is missing: the PostgreSQL server binaries (Debian's postgresql package).
# NATS runs embedded, so it needs nothing here.
set -euo pipefail

have_postgres() {
  command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1 && return 0
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1
}

if ! have_postgres; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "PostgreSQL server binaries (initdb, postgres) not found; install PostgreSQL 14 or later, or set BATON_DATABASE_URL / BATON_TEST_DATABASE_URL" >&2
    exit 1
  fi
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing Debian's postgresql package (server binaries for the local and test clusters)..."
  $SUDO apt-get update -qq
  # The package's own cluster is not used; don't start it.
  DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 $SUDO apt-get install -y -qq --no-install-recommends postgresql >/dev/null
fi
