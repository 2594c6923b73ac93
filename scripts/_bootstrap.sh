# Sourced by up.sh and test.sh: install system and Python packages into .venv (idempotent).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

need_apt=()
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need_apt+=(mosquitto)
command -v mosquitto_pub >/dev/null 2>&1 || need_apt+=(mosquitto-clients)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx openssl)  # TLS proxy test
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
python3 -c "import venv, ensurepip" >/dev/null 2>&1 || need_apt+=(python3-venv python3-pip)
if [ "${#need_apt[@]}" -gt 0 ]; then
    echo "==> apt-get install ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
# tus peers (tests/test_tus_js.py): Node and npm for tus-js-client, and the distribution's
# chromium for the browser test (Playwright drives it by path; no browser is downloaded).
need_tus=()
command -v node >/dev/null 2>&1 || need_tus+=(nodejs)
command -v npm >/dev/null 2>&1 || need_tus+=(npm)
[ -x /usr/bin/chromium ] || need_tus+=(chromium)
if [ "${#need_tus[@]}" -gt 0 ]; then
    echo "==> apt-get install ${need_tus[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_tus[@]}" >/dev/null
fi
# The Debian package starts a broker on 1883; the stack and the tests run their own.
if command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now mosquitto >/dev/null 2>&1 || true
    systemctl disable --now nginx >/dev/null 2>&1 || true
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
