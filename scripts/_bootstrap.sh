# Sourced by up.sh and test.sh: install system and Python packages into .venv (idempotent).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

need_apt=()
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need_apt+=(mosquitto)
command -v mosquitto_pub >/dev/null 2>&1 || need_apt+=(mosquitto-clients)
command -v mosquitto_passwd >/dev/null 2>&1 || need_apt+=(mosquitto)  # the stack's logins
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)  # the stack's certificate
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
python3 -c "import venv, ensurepip" >/dev/null 2>&1 || need_apt+=(python3-venv python3-pip)
if [ "${#need_apt[@]}" -gt 0 ]; then
    echo "==> apt-get install ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
# Peers only the tests use (scripts/test.sh sets BOOTSTRAP_TEST_PEERS=1; up.sh does not):
# nginx in front of the gateway (tests/test_auth_refusal_drain.py), Node and npm for
# tus-js-client, the distribution's chromium for the browser tests (Playwright drives it
# by path; no browser is downloaded), `age` (tests/test_age_codec.py reads and writes with it),
# HAProxy (PROXY protocol in front of offload-proxy: tests/test_proxy_lb.py, bench/proxy_relay.py),
# and Prometheus with promtool (the alert rules and the dashboard: tests/test_alerts.py,
# tests/test_prometheus.py).
if [ "${BOOTSTRAP_TEST_PEERS:-0}" = 1 ]; then
    need_peers=()
    command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_peers+=(nginx openssl)
    command -v node >/dev/null 2>&1 || need_peers+=(nodejs)
    command -v npm >/dev/null 2>&1 || need_peers+=(npm)
    [ -x /usr/bin/chromium ] || need_peers+=(chromium)
    command -v age >/dev/null 2>&1 || need_peers+=(age)
    command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need_peers+=(haproxy)
    command -v promtool >/dev/null 2>&1 || need_peers+=(prometheus)
    if [ "${#need_peers[@]}" -gt 0 ]; then
        echo "==> apt-get install ${need_peers[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${need_peers[@]}" >/dev/null
    fi
fi
# The Debian packages start a broker on 1883 (and nginx, HAProxy, Prometheus on theirs); the
# stack and the tests run their own.
if command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now mosquitto >/dev/null 2>&1 || true
    systemctl disable --now nginx >/dev/null 2>&1 || true
    systemctl disable --now haproxy >/dev/null 2>&1 || true
    systemctl disable --now prometheus >/dev/null 2>&1 || true  # the tests start their own
fi

if [ ! -x .venv/bin/python ]; then
    echo "==> python3 -m venv .venv"
    python3 -m venv .venv
fi
stamp=".venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    echo "==> pip install -e '.[all]'"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[all]'
    touch "$stamp"
fi
export PATH="$ROOT/.venv/bin:$PATH"
