#!/usr/bin/env bash
# Installs what Baton needs from the machine when it is missing, from
# Debian's packages:
#   postgres  the PostgreSQL server binaries (package postgresql), for the
#             local cluster of `baton dev` and the tests' throwaway clusters
#   chromium  a headless browser (package chromium), for the web page tests
#   prometheus  promtool (package prometheus), which checks the alert rules
#             and the dashboard's expressions in deploy/ and runs the
#             alerts' tests; the server it also ships is not started
#   node      Node.js and npm (packages nodejs, npm), which build the
#             useChat example and run the AI SDK's clients in the tests
# NATS runs embedded and needs nothing here.
set -euo pipefail

have_postgres() {
  command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1 && return 0
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1
}
have_promtool() {
  command -v promtool >/dev/null 2>&1
}
have_node() {
  command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1
}
have_chromium() {
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || command -v google-chrome >/dev/null 2>&1
}

missing=()
for want in "${@:-postgres}"; do
  case "$want" in
    postgres) have_postgres || missing+=(postgresql) ;;
    chromium) have_chromium || missing+=(chromium) ;;
    prometheus) have_promtool || missing+=(prometheus) ;;
    node) have_node || missing+=(nodejs npm) ;;
    *) echo "install-deps: unknown component '$want' (use postgres, chromium, prometheus, node)" >&2; exit 2 ;;
  esac
done
[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
  echo "missing: ${missing[*]}. Install them with your package manager (PostgreSQL 14 or later), or set BATON_DATABASE_URL / BATON_TEST_DATABASE_URL" >&2
  exit 1
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "installing Debian packages: ${missing[*]}"
$SUDO apt-get update -qq
# RUNLEVEL=1 keeps the postgresql package from starting its own cluster
# (Baton runs its own, with logical replication on) and the prometheus
# package from starting its server (the tests need only promtool).
DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
