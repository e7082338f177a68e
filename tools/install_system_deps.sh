#!/usr/bin/env bash
# Install the server binaries the test suite and `make run` start (called by `make setup`).
#
# Only what is missing is installed. As root on Debian it runs apt-get; otherwise it
# prints the command to run and fails if anything is missing. Quiet when all is there.
# Services the packages would start on the standard ports are held back during the
# install: Tailrace always starts its own throwaway servers on free ports.
set -euo pipefail

missing=()

have_postgres() {
    local bin
    for bin in /usr/lib/postgresql/*/bin; do
        [[ -x "$bin/initdb" && -x "$bin/postgres" ]] && return 0
    done
    return 1
}

have_java17() {
    # Spark 4 needs Java 17 or newer.
    command -v java >/dev/null 2>&1 || return 1
    local major
    major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)
    [[ -n "$major" && "$major" -ge 17 ]]
}

have() {
    command -v "$1" >/dev/null 2>&1 || [[ -x "/usr/sbin/$1" ]]
}

have_postgres || missing+=(postgresql)
have mariadbd || missing+=(mariadb-server)
have redis-server || missing+=(redis-server)
have nats-server || missing+=(nats-server)
have_java17 || missing+=(openjdk-17-jre-headless)
have openssl || missing+=(openssl)  # the TLS tests make their certificates with it
have gcc || missing+=(gcc)  # builds tailrace.events._cwire (setup.py)

if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi

install_cmd="apt-get install -y --no-install-recommends ${missing[*]}"

if [[ $(id -u) -ne 0 || ! -f /etc/debian_version ]]; then
    echo "missing system packages: ${missing[*]}" >&2
    if [[ -f /etc/debian_version ]]; then
        echo "install them with: sudo apt-get update && sudo $install_cmd" >&2
    else
        echo "install PostgreSQL 15+, MariaDB 10.11+, Redis 7, nats-server and Java 17 with" \
            "your package manager (Debian names: ${missing[*]})" >&2
    fi
    exit 1
fi

echo "installing system packages: ${missing[*]}"

# Keep the packages' services from starting (policy-rc.d exit 101 = "not allowed").
policy=/usr/sbin/policy-rc.d
if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086  # word splitting of the package list is intended
$install_cmd -qq
