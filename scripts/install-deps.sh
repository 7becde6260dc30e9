#!/usr/bin/env bash
# Installs what Baton needs from the machine when it is missing, from
# Debian's packages:
#   postgres  the PostgreSQL server binaries (package postgresql), for the
#             local cluster of `baton dev` and the tests' throwaway clusters
#   chromium  a headless browser (package chromium), for the web page tests
#   prometheus  promtool (package prometheus), which checks the alert rules
#             and the dashboard's expressions in deploy/ and runs the
#             alerts' tests; the server it also ships is not started
#   chaos     nft (package nftables), with which the kill test cuts and
#             drops the links of its network namespaces, and iptables
#             (package iptables), whose NFQUEUE target hands a delayed
#             link's packets to the test to hold
#   node      Node.js and npm (packages nodejs, npm), which run the
#             example apps and the real clients and servers some tests use
#   psycopg   psycopg 3 for /usr/bin/python3 (package python3-psycopg), for
#             examples/producer-python
#   tour      curl, ip and psql (packages curl, iproute2, postgresql-client),
#             with which the test of the README's tour runs its commands in
#             a network of its own
#   agents    Node.js and npm as for node, then the npm packages of the
#             example agents that the kill test with external agents runs
#             (make chaos-agents), each from its lockfile, again only when
#             the lockfile changed: examples/agent-mastra (Mastra over
#             AG-UI, heavy: make test does not install it),
#             examples/agent-ai-sdk and examples/agent-ag-ui
# NATS runs embedded and needs nothing here.
set -euo pipefail

have_postgres() {
  command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1 && return 0
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1
}
have_promtool() {
  command -v promtool >/dev/null 2>&1
}
have_nft() {
  command -v nft >/dev/null 2>&1
}
have_node() {
  command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1
}
have_psycopg() {
  /usr/bin/python3 -c 'import psycopg' >/dev/null 2>&1
}
have_tour() {
  command -v curl >/dev/null 2>&1 && command -v ip >/dev/null 2>&1 && command -v psql >/dev/null 2>&1
}
have_iptables() {
  command -v iptables >/dev/null 2>&1
}
have_chromium() {
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || command -v google-chrome >/dev/null 2>&1
}

# Example agents whose npm packages the agents component installs.
AGENT_NPM_DIRS=(examples/agent-mastra examples/agent-ai-sdk examples/agent-ag-ui)

missing=()
npm_dirs=()
for want in "${@:-postgres}"; do
  case "$want" in
    postgres) have_postgres || missing+=(postgresql) ;;
    chromium) have_chromium || missing+=(chromium) ;;
    prometheus) have_promtool || missing+=(prometheus) ;;
    chaos) have_nft || missing+=(nftables); have_iptables || missing+=(iptables) ;;
    node) have_node || missing+=(nodejs npm) ;;
    psycopg) have_psycopg || missing+=(python3-psycopg) ;;
    tour) have_tour || missing+=(curl iproute2 postgresql-client) ;;
    agents) have_node || missing+=(nodejs npm); npm_dirs+=("${AGENT_NPM_DIRS[@]}") ;;
    *) echo "install-deps: unknown component '$want' (use postgres, chromium, prometheus, chaos, node, psycopg, tour, agents)" >&2; exit 2 ;;
  esac
done

# install_npm installs the npm packages of each folder from its lockfile
# (npm ci, with the folder's own .npmrc), unless they are installed from
# that lockfile already.
install_npm() {
  local root d
  root="$(cd "$(dirname "$0")/.." && pwd)"
  for d in "${npm_dirs[@]}"; do
    [ "$root/$d/node_modules/.package-lock.json" -nt "$root/$d/package-lock.json" ] && continue
    echo "installing the npm packages of $d"
    (cd "$root/$d" && npm ci --no-audit --no-fund --loglevel=error) || exit 1
  done
}

if [ ${#missing[@]} -eq 0 ]; then
  install_npm
  exit 0
fi

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
install_npm
